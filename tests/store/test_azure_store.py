"""Azure-specific behaviour of AzureStore against Azurite (no mocks). The conformance, queue,
README and ``kill -9`` suites run on it too, as backend ``azure`` of ``STORE_MATRIX``."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, PreconditionError
from pydantic import SecretStr

from pawn_queue import PawnQueue, PawnQueueConfig
from pawn_queue._protocol.strategy import probe_store
from pawn_queue.config import AzureConfig
from pawn_queue.exceptions import (
    AccessDenied,
    BucketNotFound,
    PawnQueueError,
    PublishError,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store._object_store_errors import ErrorText, read_error_text
from pawn_queue.store.azure import AZURE, AzureStore
from tests.servers.fault_proxy import FaultProxy, FaultRule
from tests.servers.process import Azurite, start_azurite


@pytest.fixture
async def azure(azure_config: AzureConfig) -> AsyncIterator[AzureStore]:
    store = AzureStore(azure_config)
    try:
        yield store
    finally:
        await store.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fast(config: AzureConfig, **changes: Any) -> AzureConfig:
    quick = {"connect_timeout_seconds": 0.5, "request_timeout_seconds": 2.0, "max_retries": 1}
    return config.model_copy(update={**quick, "retry_timeout_seconds": 2.0, **changes})


async def test_probe_finds_every_conditional_write(azure: AzureStore) -> None:
    probe = await probe_store(azure)
    assert [(c.name, c.ok, c.detail) for c in probe.capabilities] == [
        ("if-match, current ETag", True, "accepted"),
        ("if-match, stale ETag", True, "refused"),
        ("create-only, existing key", True, "refused"),
    ]
    assert probe.strategy == "conditional_write"
    assert await azure.list("_probe/") == []


async def test_emulator_defaults_reach_azurite(azurite: Azurite) -> None:
    """Account and key left out, the endpoint without the account in its path."""
    container = f"e-{uuid.uuid4().hex[:12]}"
    azurite.create_container(container)
    config = AzureConfig(container_name=container, use_emulator=True, endpoint_url=azurite.endpoint)
    store = AzureStore(config)
    try:
        etag = await store.put("k.json", b"x", "create")
        assert etag.startswith('"0x') and etag.endswith('"')
        assert (await store.get("k.json")).meta.etag == etag
        await store.check()
    finally:
        await store.close()


async def test_batch_delete_reporting_a_missing_blob_misses_no_other_failure(
    azure: AzureStore, azure_config: AzureConfig, azurite: Azurite
) -> None:
    """obstore stops reading a batch's answers at its first error: a missing blob (ignored)
    must not hide a blob after it that could not be deleted (here: one under a lease)."""
    keys = [f"d/{i:04d}" for i in range(600)]
    await asyncio.gather(*(azure.put(key, b"x") for key in keys))
    azurite.lease_blob(azure_config.container_name, "d/0599")
    # Three batches (256 blobs each at most), each of the first and last with a missing blob
    # ahead of the others; the last ends with the leased one.
    with pytest.raises(StoreError) as info:
        await azure.delete_many(["d/0000-gone", *keys[:-1], "d/0599-gone", keys[-1]])
    assert "Azure delete failed" in str(info.value) and "key 'd/0599'" in str(info.value)
    assert "HTTP 412" in str(info.value)
    assert [meta.key for meta in await azure.list("d/")] == ["d/0599"]


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[FaultProxy]:
    with FaultProxy(azurite.endpoint, seed=11, max_lifetime_seconds=120) as running:
        yield running


async def test_batch_delete_without_an_answer_is_resent(
    azure: AzureStore, azure_config: AzureConfig, proxy: FaultProxy, azurite: Azurite
) -> None:
    keys = [f"r/{i}" for i in range(5)]
    for key in keys:
        await azure.put(key, b"x")
    through_proxy = AzureStore(
        _fast(azure_config, endpoint_url=f"{proxy.endpoint}/{azurite.access_key}")
    )
    try:
        # The batch is a POST: obstore does not resend it after a dropped answer; we do.
        proxy.set_rules([FaultRule("drop_response", 1.0, operations=frozenset({"put"}), limit=1)])
        await through_proxy.delete_many(keys)
        assert proxy.stats()["drop_response"] == 1
    finally:
        await through_proxy.close()
    assert await azure.list("r/") == []


async def test_errors_name_azure_and_the_failure(
    azure_config: AzureConfig, azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = AzureStore(_fast(azure_config, container_name=f"gone-{uuid.uuid4().hex[:8]}"))
    wrong = base64.b64encode(b"not the account key").decode()
    denied = AzureStore(_fast(azure_config, account_key=SecretStr(wrong)))
    closed = AzureStore(_fast(azure_config, endpoint_url=f"http://127.0.0.1:{_closed_port()}/a"))
    for name in list(os.environ):
        if name.startswith("AZURE_"):
            monkeypatch.delenv(name)
    # No key anywhere: obstore's last resort, a managed identity, answers nothing here.
    token_url = f"http://127.0.0.1:{_closed_port()}/metadata/identity/oauth2/token"
    monkeypatch.setenv("AZURE_MSI_ENDPOINT", token_url)
    keyless = AzureStore(_fast(azure_config, account_key=None))
    endpoint = azurite.blob_endpoint
    cases: list[tuple[AzureStore, type[Exception], str]] = [
        (missing, BucketNotFound, f"at {endpoint}: HTTP 404 ContainerNotFound"),
        (denied, AccessDenied, f"at {endpoint}: HTTP 403 AuthorizationFailure"),
        (closed, StoreUnavailable, ": connection refused after 1 retries"),
        (keyless, AccessDenied, ": no Azure credentials found; looked in the config"),
    ]
    try:
        for store, expected, tail in cases:
            with pytest.raises(expected) as info:
                await store.get("k.json")
            message = str(info.value)
            assert message.startswith("Azure get failed for container "), message
            assert tail in message and wrong not in message, message
        with pytest.raises(BucketNotFound):
            await missing.check()
    finally:
        for store, _, _ in cases:
            await store.close()


async def test_error_texts_it_reads(azure: AzureStore) -> None:
    """What obstore says only in its messages, pinned (see tests/store/test_s3_error_text.py)."""
    await azure.put("k", b"x")
    client = azure._live()

    async def failure(call: Callable[[], Awaitable[object]]) -> Exception:
        try:
            await call()
        except Exception as exc:
            return exc
        raise AssertionError("the call succeeded")

    create = await failure(lambda: obstore.put_async(client, "k", b"y", mode="create"))
    assert isinstance(create, AlreadyExistsError)
    assert read_error_text(str(create), AZURE) == ErrorText(
        status=409,
        code="BlobAlreadyExists",
        message="The specified blob already exists.",
        failures=frozenset(),
        sending_failed=False,
        retries=None,
        metadata_request=False,
    )
    stale = await failure(lambda: obstore.put_async(client, "k", b"y", mode={"e_tag": '"0x0"'}))
    assert isinstance(stale, PreconditionError)
    told = read_error_text(str(stale), AZURE)
    assert (told.status, told.code) == (412, "ConditionNotMet")
    batch = await failure(lambda: obstore.delete_async(client, ["k", "gone"]))
    assert isinstance(batch, FileNotFoundError)
    assert read_error_text(str(batch), AZURE).status == 404  # "(code: 404)"


# -- credentials never show ----------------------------------------------------------------

ACCOUNT = "pqsecrets"
KEY = base64.b64encode(b"pq-azure-key-DO-NOT-LEAK-9f8e7d6c5b4a").decode()
WRONG = base64.b64encode(b"pq-wrong-key-DO-NOT-LEAK-0a1b2c").decode()
MARKERS = (KEY, WRONG, KEY[:24], WRONG[:24], KEY[-24:], WRONG[-24:])


def leaked(text: str) -> list[str]:
    return [marker for marker in MARKERS if marker in text]


def check_error(error: BaseException) -> None:
    """Our error, and nothing along its chain or in its traceback shows a key."""
    assert isinstance(error, PawnQueueError), type(error)
    seen: BaseException | None = error
    while seen is not None:
        assert not leaked(str(seen)) and not leaked(repr(seen)), (type(seen), str(seen))
        assert "SharedKey" not in str(seen) and "sig=" not in str(seen)
        seen = seen.__cause__ or seen.__context__
    printed = "".join(traceback.format_exception(error))
    assert not leaked(printed)
    assert "obstore" not in printed.lower().replace("pawn_queue/store", "")  # no client error


@pytest.fixture(scope="module")
def keyed_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """An Azurite whose one account has a key of our own, which the markers find."""
    server = start_azurite(tmp_path_factory.mktemp("azurite-secrets"), account=ACCOUNT, key=KEY)
    try:
        yield server
    finally:
        server.stop()


def keyed_config(server: Azurite, key: str = KEY, **azure: Any) -> dict[str, Any]:
    container = f"s-{uuid.uuid4().hex[:12]}"
    server.create_container(container)
    section = {
        "container_name": container,
        "account_name": ACCOUNT,
        "account_key": key,
        "endpoint_url": server.blob_endpoint,
        "max_retries": 0,
        **azure,
    }
    polling = {"interval_seconds": 0.05, "visibility_timeout_seconds": 5.0}
    return {"backend": "azure", "azure": section, "polling": polling}


async def test_a_queue_life_with_failures_shows_no_key(
    keyed_azurite: Azurite, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    data = keyed_config(keyed_azurite)
    objects: list[object] = []
    async with await PawnQueue.from_config(data) as pq:
        assert pq.strategy == "conditional_write"
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", topics=["t"])
        await producer.publish("t", {"n": 1})
        [message] = await consumer.poll(wait=10)
        await message.ack()
        client = pq.store.inner._store  # type: ignore[attr-defined]
        objects += [pq, pq.store, vars(pq.store), client, producer, consumer, message]
        # The same queue, now signing with a wrong key (its client swapped under it).
        wrong = AzureStore(AzureConfig(**{**data["azure"], "account_key": WRONG}))
        pq.store.inner._store = wrong._store  # type: ignore[attr-defined]
        with pytest.raises(PublishError) as info:
            await producer.publish("t", {"n": 2})
        assert isinstance(info.value.__cause__, AccessDenied)
        check_error(info.value)
    loaded = PawnQueueConfig.from_dict(data)
    objects += [loaded, loaded.azure, loaded.model_dump(), vars(loaded.azure)]
    for obj in objects:
        assert not leaked(repr(obj)) and not leaked(str(obj)), type(obj)
    assert not leaked(loaded.model_dump_json())
    assert not leaked(caplog.text)
    assert any("403" in r.getMessage() or "AccessDenied" in r.getMessage() for r in caplog.records)


async def test_setup_errors_show_no_key(keyed_azurite: Azurite) -> None:
    missing = keyed_config(keyed_azurite)
    missing["azure"]["container_name"] = "no-such-container"
    failures: list[tuple[dict[str, Any], type[PawnQueueError]]] = [
        (keyed_config(keyed_azurite, WRONG), AccessDenied),
        (
            keyed_config(keyed_azurite, endpoint_url=f"http://127.0.0.1:{_closed_port()}/a"),
            StoreUnavailable,
        ),
        (missing, BucketNotFound),
    ]
    for data, expected in failures:
        pq = await PawnQueue.from_config(data)
        with pytest.raises(expected) as info:
            await pq.setup()
        check_error(info.value)
        await pq.teardown()
