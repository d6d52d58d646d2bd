"""Shared fixtures: one server per S3 implementation per session (each started the first time
a test needs it), a fresh bucket per test, a store per backend.

Backends: ``memory``, ``filesystem``, ``s3`` (SeaweedFS, where the whole suite runs), the
store matrix's other S3 servers, ``s3-ceph`` (Ceph RGW), ``s3-moto`` (AWS's documented
answers) and ``s3-s3rver`` (no conditional writes), and ``azure`` (Azurite, a fresh container
per test). Modules that run on the whole matrix ask for ``backend`` over :data:`STORE_MATRIX`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from pydantic import SecretStr

from pawn_queue import PawnQueue, subscriptions
from pawn_queue.config import AzureConfig, S3Config
from pawn_queue.store.base import Store
from tests.servers.ceph import CephRGW
from tests.servers.process import Azurite, LoopbackServer, start_azurite, start_moto, start_s3rver
from tests.servers.seaweedfs import SeaweedFS

BACKENDS = ["memory", "filesystem", "s3"]
S3_SERVERS = {"s3": "seaweedfs", "s3-ceph": "ceph_rgw", "s3-moto": "moto", "s3-s3rver": "s3rver"}
"""Each S3 backend's server fixture."""
STORE_MATRIX = ["memory", "filesystem", *S3_SERVERS, "azure"]
"""Every store the suite proves: the conformance, README and crash suites run on each."""
CONDITIONAL = frozenset(STORE_MATRIX) - {"s3-s3rver"}
"""The backends that enforce create-only and if-match puts (s3rver ignores both)."""


def is_s3(backend: str) -> bool:
    return backend in S3_SERVERS


class _Server(Protocol):
    def stop(self) -> None: ...


_S = TypeVar("_S", bound=_Server)


def _session_server(name: str, start: Callable[[Path], _S]) -> Callable[..., Iterator[_S]]:
    """A session fixture: the server started in a temp dir the first time a test asks,
    stopped at the end."""

    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_S]:
        server = start(tmp_path_factory.mktemp(name))
        try:
            yield server
        finally:
            server.stop()

    fixture.__name__ = name
    return pytest.fixture(scope="session", name=name)(fixture)


seaweedfs = _session_server("seaweedfs", SeaweedFS.start)
ceph_rgw = _session_server("ceph_rgw", CephRGW.start)
moto = _session_server("moto", start_moto)
s3rver = _session_server("s3rver", start_s3rver)
azurite = _session_server("azurite", start_azurite)


@pytest.fixture
def quick_subscription_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests whose producers and subscription changes all run in this process: they
    trust the subscription index 0.1 s, and creating, changing or deleting a subscription
    waits that long. Rule 15 holds for any cache time (tests/protocol/test_subscriptions.py
    checks the shipped one across PawnQueues); a test with other processes keeps it."""
    monkeypatch.setattr(subscriptions, "INDEX_CACHE_SECONDS", 0.1)
    monkeypatch.setattr(subscriptions, "_CHANGE_MARGIN_SECONDS", 0.05)


@pytest.fixture
def azure_config(azurite: Azurite) -> AzureConfig:
    """A fresh container on Azurite."""
    container = f"t-{uuid.uuid4().hex[:20]}"
    azurite.create_container(container)
    return AzureConfig(
        container_name=container,
        account_name=azurite.access_key,
        account_key=SecretStr(azurite.secret_key),
        endpoint_url=azurite.blob_endpoint,
    )


@pytest.fixture
def s3_config(request: pytest.FixtureRequest) -> S3Config:
    """A fresh bucket on the S3 server of the test's ``backend`` (SeaweedFS without one)."""
    backend = request.getfixturevalue("backend") if "backend" in request.fixturenames else "s3"
    server: SeaweedFS | CephRGW | LoopbackServer = request.getfixturevalue(
        S3_SERVERS.get(backend, "seaweedfs")
    )
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    server.create_bucket(bucket)
    return S3Config(
        endpoint_url=server.endpoint,
        bucket_name=bucket,
        aws_access_key_id=SecretStr(server.access_key),
        aws_secret_access_key=SecretStr(server.secret_key),
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
    if is_s3(backend):
        from pawn_queue.store.s3 import S3Store

        return S3Store(request.getfixturevalue("s3_config"))
    if backend == "azure":
        from pawn_queue.store.azure import AzureStore

        return AzureStore(request.getfixturevalue("azure_config"))
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
    """A config dict for ``backend`` with fast timings; S3 gets a fresh bucket, Azure a fresh
    container."""
    base: dict[str, object] = {
        "backend": "s3" if is_s3(backend) else backend,
        "polling": dict(FAST_POLLING),
        "concurrency": dict(FAST_CONCURRENCY),
    }
    if backend == "memory":
        base["memory"] = {"name": f"test-{uuid.uuid4().hex}"}
    elif backend == "filesystem":
        base["filesystem"] = {"path": str(tmp_path / "queue")}
    elif backend == "azure":
        azure: AzureConfig = request.getfixturevalue("azure_config")
        assert azure.account_key is not None
        base["azure"] = {
            "container_name": azure.container_name,
            "account_name": azure.account_name,
            "account_key": azure.account_key.get_secret_value(),
            "endpoint_url": azure.endpoint_url,
        }
    else:
        s3: S3Config = request.getfixturevalue("s3_config")
        base["s3"] = {
            "endpoint_url": s3.endpoint_url,
            "bucket_name": s3.bucket_name,
            "aws_access_key_id": s3.aws_access_key_id.get_secret_value(),
            "aws_secret_access_key": s3.aws_secret_access_key.get_secret_value(),
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
