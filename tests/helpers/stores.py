"""The stores the suite runs on, and how a test gets one: the backends' names, a store or a
queue config for a backend (fresh bucket or container on the servers that
``tests/conftest.py`` starts), and the fast timings every queue test uses."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pawn_queue.config import AzureConfig, S3Config
from pawn_queue.store.base import Store

BACKENDS = ["memory", "filesystem", "s3"]
S3_SERVERS = {"s3": "seaweedfs", "s3-ceph": "ceph_rgw", "s3-moto": "moto", "s3-s3rver": "s3rver"}
"""Each S3 backend's server fixture."""
STORE_MATRIX = ["memory", "filesystem", *S3_SERVERS, "azure"]
"""Every store the suite proves: the conformance, README and crash suites run on each."""
LIMITED = "memory-limited"
"""Memory beneath a provider's limit of one write a second per key and the backoff from it
(tests/helpers/limits.py): the conformance suite runs on it too, but for its races (24
writers of one key at once: the limit lets one through a second)."""
CONDITIONAL = frozenset(STORE_MATRIX) - {"s3-s3rver"}
"""The backends that enforce create-only and if-match puts (s3rver ignores both)."""


def is_s3(backend: str) -> bool:
    return backend in S3_SERVERS


def make_store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if backend == "memory":
        from pawn_queue.store.memory import MemoryStore

        return MemoryStore()
    if backend == LIMITED:
        from pawn_queue.store.memory import MemoryStore
        from tests.helpers.limits import limited

        return limited(MemoryStore())[0]
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
