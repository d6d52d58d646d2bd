"""Shared fixtures: one SeaweedFS per session, a fresh bucket per test, a store per backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from pawn_queue import PawnQueue
from pawn_queue.config import S3Config
from pawn_queue.store.base import Store
from tests.servers.seaweedfs import SeaweedFS

BACKENDS = ["memory", "filesystem", "s3"]


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_config(seaweedfs: SeaweedFS) -> S3Config:
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    seaweedfs.create_bucket(bucket)
    return S3Config(
        endpoint_url=seaweedfs.endpoint,
        bucket_name=bucket,
        aws_access_key_id=SecretStr("test-access-key"),
        aws_secret_access_key=SecretStr("test-secret-key"),
        use_ssl=False,
    )


def make_store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if backend == "memory":
        from pawn_queue.store.memory import MemoryStore

        return MemoryStore()
    if backend == "filesystem":
        from pawn_queue.store.filesystem import FilesystemStore

        # Like the bucket of the S3 store: it exists (reads of a missing root fail).
        (tmp_path / "store").mkdir()
        return FilesystemStore(tmp_path / "store")
    if backend == "s3":
        from pawn_queue.store.s3 import S3Store

        return S3Store(request.getfixturevalue("s3_config"))
    raise AssertionError(backend)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Store]:
    s = make_store(backend, request, tmp_path)
    try:
        yield s
    finally:
        await s.close()


# -- queue fixtures ------------------------------------------------------------------------

FAST_POLLING = {
    "interval_seconds": 0.05,
    "max_messages_per_poll": 10,
    "visibility_timeout_seconds": 3.0,
    "lease_refresh_interval_seconds": 0.5,
}
FAST_CONCURRENCY = {"clock_skew_margin_seconds": 0.2}


def queue_config_dict(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> dict[str, object]:
    """A config dict for ``backend`` with fast timings; S3 gets a fresh bucket."""
    base: dict[str, object] = {
        "backend": backend,
        "polling": dict(FAST_POLLING),
        "concurrency": dict(FAST_CONCURRENCY),
    }
    if backend == "memory":
        base["memory"] = {"name": f"test-{uuid.uuid4().hex}"}
    elif backend == "filesystem":
        base["filesystem"] = {"path": str(tmp_path / "queue")}
    else:
        s3: S3Config = request.getfixturevalue("s3_config")
        base["s3"] = {
            "endpoint_url": s3.endpoint_url,
            "bucket_name": s3.bucket_name,
            "aws_access_key_id": "test-access-key",
            "aws_secret_access_key": "test-secret-key",
            "use_ssl": False,
        }
    return base


@pytest.fixture
def queue_config(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    return queue_config_dict(backend, request, tmp_path)


@pytest.fixture
async def pq(queue_config: dict[str, object]) -> AsyncIterator[PawnQueue]:
    async with await PawnQueue.from_config(queue_config) as queue:
        yield queue
