"""The obstore error texts the S3 store reads (store/_object_store_errors.read_error_text), pinned.

obstore's exceptions carry no fields: the HTTP status, S3 error code and message, the
failure kinds, the retry count and the failed request's URL are only in their text. Each
test makes obstore fail for real (a SeaweedFS, a fault-injecting proxy, a closed port, a
silent listener) and checks what the reader gets, so an obstore release that rewords its
messages fails here instead of silently changing how errors are handled.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError

from pawn_queue.config import S3Config
from pawn_queue.store._object_store_errors import ErrorText, read_error_text
from pawn_queue.store.s3 import S3, S3Store
from tests.servers.fault_proxy import FaultProxy, FaultRule
from tests.servers.seaweedfs import SeaweedFS

Call = Callable[[Any], Awaitable[object]]


async def client_error(config: S3Config, call: Call) -> Exception:
    """The exception obstore raises for ``call`` on the client the S3 store builds."""
    store = S3Store(config)
    try:
        await call(store._live())
    except Exception as exc:
        return exc
    finally:
        await store.close()
    raise AssertionError("the call succeeded")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fast(config: S3Config, endpoint: str | None = None, **changes: Any) -> S3Config:
    update: dict[str, Any] = {
        "connect_timeout_seconds": 0.5,
        "request_timeout_seconds": 0.5,
        "max_retries": 1,
        "retry_timeout_seconds": 2,
        **changes,
    }
    if endpoint is not None:
        update["endpoint_url"] = endpoint
    return config.model_copy(update=update)


def _get(store: Any) -> Awaitable[object]:
    return obstore.get_async(store, "k")


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint, seed=3, max_lifetime_seconds=120) as running:
        yield running


async def test_missing_bucket(s3_config: S3Config) -> None:
    missing = s3_config.model_copy(update={"bucket_name": f"missing-{uuid.uuid4().hex[:12]}"})
    told = read_error_text(str(await client_error(missing, _get)), S3)
    assert told == ErrorText(
        status=404,
        code="NoSuchBucket",
        message="The specified bucket does not exist",
        failures=frozenset(),
        sending_failed=False,
        retries=None,
        metadata_request=False,
    )

    def listing(store: Any) -> Awaitable[object]:
        return obstore.list_with_delimiter_async(store, "x")

    exc = await client_error(missing, listing)
    assert isinstance(exc, GenericError)  # only the text tells a missing bucket
    told = read_error_text(str(exc), S3)
    assert (told.status, told.code) == (404, "NoSuchBucket")


async def test_missing_key_and_failed_conditions_are_typed(s3_config: S3Config) -> None:
    missing = await client_error(s3_config, _get)
    assert isinstance(missing, FileNotFoundError)
    assert read_error_text(str(missing), S3).status == 404
    store = S3Store(s3_config)
    await store.put("k", b"x")
    await store.close()

    def create(store: Any) -> Awaitable[object]:
        return obstore.put_async(store, "k", b"y", mode="create", use_multipart=False)

    def if_match(store: Any) -> Awaitable[object]:
        mode = {"e_tag": '"0"'}
        return obstore.put_async(store, "k", b"y", mode=mode, use_multipart=False)

    assert isinstance(await client_error(s3_config, create), AlreadyExistsError)
    assert isinstance(await client_error(s3_config, if_match), PreconditionError)


async def test_server_error_after_retries(s3_config: S3Config, proxy: FaultProxy) -> None:
    proxy.set_rules([FaultRule("slowdown_503", 1.0)])
    exc = await client_error(_fast(s3_config, proxy.endpoint), _get)
    assert isinstance(exc, GenericError)
    assert read_error_text(str(exc), S3) == ErrorText(
        status=503,
        code="SlowDown",
        message="slowdown_503",
        failures=frozenset(),
        sending_failed=False,
        retries=1,
        metadata_request=False,
    )


async def test_refused_connection(s3_config: S3Config) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    told = read_error_text(str(await client_error(_fast(s3_config, endpoint), _get)), S3)
    assert told.status is None and told.code is None and told.message is None
    assert {"Connect", "ConnectionRefused"} <= told.failures
    assert told.sending_failed and told.retries == 1 and not told.metadata_request


async def test_silent_server_times_out(s3_config: S3Config) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # accepts connections, never answers
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        told = read_error_text(str(await client_error(_fast(s3_config, endpoint), _get)), S3)
    assert told.status is None and "Timeout" in told.failures
    assert told.sending_failed and told.retries == 1


async def test_answer_lost_after_the_request_landed(s3_config: S3Config, proxy: FaultProxy) -> None:
    """A DeleteObjects POST whose answer never came: obstore does not resend it."""
    proxy.set_rules([FaultRule("drop_response", 1.0)])

    def delete(store: Any) -> Awaitable[object]:
        return obstore.delete_async(store, ["k"])

    told = read_error_text(str(await client_error(_fast(s3_config, proxy.endpoint), delete)), S3)
    assert told.status is None and told.sending_failed and told.retries is None
    assert told.failures & {"Interrupted", "Timeout"}


async def test_failed_instance_metadata_lookup(
    s3_config: S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith(("AWS_", "PAWNQUEUE_")):
            monkeypatch.delenv(name)
    # No credentials anywhere: the client's last resort is the instance-metadata service.
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    no_keys = _fast(s3_config, aws_access_key_id=None, aws_secret_access_key=None)
    told = read_error_text(str(await client_error(no_keys, _get)), S3)
    assert told.metadata_request and told.status is None and told.sending_failed
