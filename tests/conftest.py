"""Shared fixtures (what tests import lives in ``tests/helpers/``), and the hooks that share
the servers between pytest-xdist's workers: one server per S3 implementation per session
(each started the first time a test needs it), a fresh bucket per test, a store and a queue
per backend.

Backends: ``memory``, ``filesystem``, ``s3`` (SeaweedFS, where the whole suite runs), the
store matrix's other S3 servers, ``s3-ceph`` (Ceph RGW), ``s3-moto`` (AWS's documented
answers) and ``s3-s3rver`` (no conditional writes), and ``azure`` (Azurite, a fresh container
per test); ``tests/helpers/stores.py`` names them. Modules that run on the whole matrix ask
for ``backend`` over ``STORE_MATRIX``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pawn_queue import PawnQueue
from pawn_queue._protocol import subscriptions
from pawn_queue.config import AzureConfig, S3Config
from pawn_queue.store.base import Store
from tests.helpers.stores import BACKENDS, S3_SERVERS, make_store, queue_config_dict
from tests.servers.ceph import CephRGW
from tests.servers.process import Azurite, LoopbackServer
from tests.servers.seaweedfs import SeaweedFS
from tests.servers.shared import KINDS, WORKERINPUT_KEY, SharedServers, attach

_SHARED = pytest.StashKey[SharedServers]()


def _session_server(name: str) -> Callable[..., Iterator[Any]]:
    """A session fixture: the server started in a temp dir the first time a test asks,
    stopped at the end; under pytest-xdist, the one the controller started for every
    worker (``tests/servers/shared.py``)."""

    def fixture(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Any]:
        shared = getattr(request.config, "workerinput", {}).get(WORKERINPUT_KEY)
        if shared is not None:
            yield attach(name, shared)
            return
        server = KINDS[name][0](tmp_path_factory.mktemp(name))
        try:
            yield server
        finally:
            server.stop()

    fixture.__name__ = name
    return pytest.fixture(scope="session", name=name)(fixture)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist's controller: start the session servers once for every worker."""
    controller = not hasattr(config, "workerinput")
    if controller and config.getoption("numprocesses", None) and not config.option.collectonly:
        config.stash[_SHARED] = SharedServers.start()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Each worker gets the addresses of the servers :func:`pytest_configure` started."""
    shared = node.config.stash.get(_SHARED, None)
    if shared is not None:
        node.workerinput[WORKERINPUT_KEY] = shared.workerinput()


# The modules whose tests take longest (30 s to a minute each, most of it waiting): they
# start first, so that none of them is still running alone at the end (pytest-xdist hands
# tests out in collection order).
_LONG_FIRST = (
    "tests/test_schedule_workers.py",
    "tests/protocol/test_crash_matrix.py",
    "tests/cli/test_cli_edges.py",
    "tests/protocol/test_request_limits.py",
    "tests/protocol/test_subscription_crash.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """s3rver's queue tests run alone: without conditional writes its claims are
    csprng_verify's, which hold only while a competing write lands within ``jitter_min_ms``
    (docs/protocol.md, "Strategy csprng_verify"), and a machine saturated by other workers
    breaks that bound. Its store tests (``tests/store/``) claim nothing and run with the rest."""
    items.sort(key=lambda item: not item.nodeid.startswith(_LONG_FIRST))  # stable
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is not None
            and callspec.params.get("backend") == "s3-s3rver"
            and not item.nodeid.startswith("tests/store/")
        ):
            item.add_marker(pytest.mark.alone)


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(_SHARED, None)
    if shared is not None:
        shared.stop()


seaweedfs = _session_server("seaweedfs")
ceph_rgw = _session_server("ceph_rgw")
moto = _session_server("moto")
s3rver = _session_server("s3rver")
azurite = _session_server("azurite")


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


@pytest.fixture
def queue_config(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    return queue_config_dict(backend, request, tmp_path)


@pytest.fixture
async def pq(queue_config: dict[str, object]) -> AsyncIterator[PawnQueue]:
    async with await PawnQueue.from_config(queue_config) as queue:
        yield queue
