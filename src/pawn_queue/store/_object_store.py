"""What the S3 and the Azure store share: both run on obstore (Rust ``object_store``).

:class:`ObstoreStore` holds the store-independent half: the client's timeouts and retries
(:meth:`ObstoreStore._open`), requests run shielded and are awaited at close, client errors
are translated (``_object_store_errors``), listings are put in byte order whatever order the
server lists in, deletes that got no answer are resent. Each subclass sets its obstore
client's service options and credentials, writes (conditional writes differ) and says how
its service's errors read.

Keys obstore cannot represent (rejected with :class:`ConfigError`): empty keys, a leading or
trailing ``/``, empty segments (``a//b``), ``.`` or ``..`` segments and ASCII control
characters. A backslash is also rejected: SeaweedFS turns it into ``/``. Keys are limited to
1,024 UTF-8 bytes including the store prefix (S3's limit; Azure's is 1,024 characters).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

import obstore

from pawn_queue.exceptions import (
    ConfigError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
)
from pawn_queue.store._object_store_errors import NoAnswer, Service, translate
from pawn_queue.store._s3_listing import (
    ServerSortsBytes,
    ServerUnsorted,
    Source,
    key_problem,
    offset_below,
    tree_walk,
)
from pawn_queue.store.base import LIST_PAGE, IfMatch, ObjectMeta, PutMode, StoredObject

if TYPE_CHECKING:
    from obstore import ListStream
    from obstore import ObjectMeta as _ObstoreMeta
    from obstore import PutMode as _ObstorePutMode
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

_T = TypeVar("_T")
_Client = TypeVar("_Client")

ListOrder = Literal["tree", "bytes", "unsorted"]

_MAX_KEY_BYTES = 1024
RESEND_BACKOFF_SECONDS = 0.1
"""The first pause before a resend, here and in the client (then doubled each time)."""
_MAX_BACKOFF = timedelta(seconds=10)
_CLOSE_WAIT_SECONDS = 10.0
_CLOSE_SETTLE_SECONDS = 0.15


class ClientSettings(Protocol):
    """What every obstore client is built from: the settings S3Config and AzureConfig share."""

    @property
    def connect_timeout_seconds(self) -> float: ...
    @property
    def request_timeout_seconds(self) -> float: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def retry_timeout_seconds(self) -> float: ...


def normalise_prefix(prefix: str, service: str) -> str:
    """The store prefix without surrounding ``/``; ConfigError if obstore cannot hold it."""
    prefix = prefix.strip("/")
    if prefix and (problem := key_problem(prefix)) is not None:
        raise ConfigError(f"{service} prefix {prefix!r} is invalid: {problem}")
    return prefix


def client_config_error(exc: Exception, what: str, secrets: Sequence[str]) -> ConfigError:
    """The client's refusal of its configuration: its first line, with ``secrets`` masked."""
    message = str(exc).split("\n", 1)[0]
    for value in secrets:
        if value:
            message = message.replace(value, "***")
    return ConfigError(f"invalid {what}: {message}")


def obstore_mode(mode: PutMode) -> _ObstorePutMode:
    if isinstance(mode, IfMatch):
        return {"e_tag": mode.etag}
    if mode in ("overwrite", "create"):
        return mode
    raise ConfigError(f"unknown put mode {mode!r}")


class ObstoreStore:
    """The half of a :class:`~pawn_queue.store.base.Store` on obstore that does not depend on
    the service. Subclasses set ``_store`` (the client), ``service`` and ``put``."""

    service: ClassVar[Service]
    container_word: ClassVar[str]
    """What the service calls the namespace of keys: ``bucket``, ``container``."""

    def __init__(
        self,
        *,
        container: str,
        prefix: str,
        endpoint: str,
        settings: ClientSettings,
        keys_given: bool,
        list_order: ListOrder,
    ) -> None:
        self._container = container
        self._prefix = normalise_prefix(prefix, self.service.name)
        self._endpoint = endpoint
        self._settings = settings
        self._keys_given = keys_given
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._store: ObjectStore | None = None
        self.list_order: ListOrder = list_order
        """How this server orders a listing, learnt from listings: SeaweedFS walks its
        directory tree, S3 proper sorts bytes, s3rver and Azurite neither (see list())."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(endpoint={self._endpoint!r}, "
            f"{self.container_word}={self._container!r}, prefix={self._prefix!r})"
        )

    # -- Store protocol -------------------------------------------------------------------

    async def get(self, key: str) -> StoredObject:
        self._check_key(key)
        store = self._live()

        async def fetch() -> StoredObject:
            result = await obstore.get_async(store, key)
            data = bytes(await result.bytes_async())
            return StoredObject(data=data, meta=self._meta(result.meta))

        return await self._call("get", key, fetch)

    async def head(self, key: str) -> ObjectMeta:
        self._check_key(key)
        store = self._live()
        raw = await self._call("head", key, lambda: obstore.head_async(store, key))
        return self._meta(raw)

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        if limit is not None and limit <= 0:
            return []
        if start_after is not None and start_after < prefix:
            start_after = None  # every key with the prefix sorts after it
        if start_after is not None and not start_after.startswith(prefix):
            return []  # start_after sorts after every key with the prefix
        # obstore lists whole path segments: list the prefix's parent and filter.
        parent, _, partial = prefix.rpartition("/")
        if parent and key_problem(parent) is not None:
            return []  # no storable key lies under an invalid parent
        bound: str | None = prefix if partial else None
        inclusive = start_after is None
        if start_after is not None:
            bound = start_after
        # obstore always asks the server for pages of 1,000; a small chunk only spares
        # converting keys that the limit would drop.
        source = functools.partial(self._pages, chunk=min(limit or LIST_PAGE, LIST_PAGE))
        results: list[ObjectMeta] = []
        if self.list_order == "tree":
            try:
                walk = tree_walk(source, parent, bound, inclusive)
                async with contextlib.aclosing(walk):
                    async for meta in walk:
                        if results and meta.key <= results[-1].key:
                            continue  # a byte-order server repeats keys until detected
                        if _collect(meta, prefix, results, limit):
                            break
                return results
            except ServerSortsBytes:
                # Learnt once per store: from now on one plain listing is in byte order.
                self.list_order = "bytes"
            except ServerUnsorted:
                self._learn_unsorted()
        if self.list_order == "bytes":
            try:
                return await _list_in_order(
                    source, parent, prefix, results, limit, bound, inclusive
                )
            except ServerUnsorted:
                self._learn_unsorted()
        # Every key after the bound, sorted here (str order is UTF-8 byte order).
        keys = await _list_in_order(
            self._pages, parent, prefix, [], None, bound, inclusive, sorted_server=False
        )
        keys.sort(key=lambda meta: meta.key)
        return keys[:limit]

    async def delete(self, key: str) -> None:
        await self.delete_many([key])

    async def delete_many(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        for key in keys:
            self._check_key(key)
        # A list even for one key: S3 answers a DeleteObjects request like a DELETE.
        await self._delete(list(keys))

    async def close(self) -> None:
        """Wait (a bounded time) for requests still in flight, then drop the client."""
        if self._store is None:
            return
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=_CLOSE_WAIT_SECONDS)
        # obstore has no close: dropping the last reference frees the connection pool.
        self._store = None
        # The client winds down a connection on its own threads just after the last answer;
        # a process that exits in that moment aborts (SIGABRT) now and then. Measured: 3-7
        # aborts in 40 runs without this pause, none with 0.1 s.
        await asyncio.sleep(_CLOSE_SETTLE_SECONDS)

    # -- extras ---------------------------------------------------------------------------

    async def check(self) -> None:
        """Verify that the bucket (container) exists and the credentials may list it (one
        request). Raises BucketNotFoundError, AccessDeniedError or StoreUnavailableError."""
        store = self._live()
        await self._call(
            "check",
            None,
            # A prefix that holds nothing keeps the answer small.
            lambda: obstore.list_with_delimiter_async(store, "_pawn_queue_check"),
        )

    # -- for subclasses -------------------------------------------------------------------

    def _open(
        self,
        make: Callable[[ClientConfig, RetryConfig], _Client],
        *,
        plain_http: bool,
        verify_certificates: bool = True,
        secrets: Sequence[str] = (),
    ) -> _Client:
        """The client ``make`` builds, given the client and retry options every store takes
        from its settings; ConfigError (``secrets`` masked) if it refuses its configuration."""
        settings = self._settings
        client: ClientConfig = {
            "allow_http": plain_http,
            "allow_invalid_certificates": not verify_certificates,
            "connect_timeout": timedelta(seconds=settings.connect_timeout_seconds),
            "timeout": timedelta(seconds=settings.request_timeout_seconds),
        }
        retry_timeout = timedelta(seconds=settings.retry_timeout_seconds)
        retry: RetryConfig = {
            "max_retries": settings.max_retries,
            "retry_timeout": retry_timeout,
            "backoff": {
                "init_backoff": timedelta(seconds=RESEND_BACKOFF_SECONDS),
                "max_backoff": min(_MAX_BACKOFF, retry_timeout),
                "base": 2,
            },
        }
        try:
            return make(client, retry)
        except Exception as exc:  # obstore refuses a configuration with varied exceptions
            what = f"{self.service.name} configuration for {self._where(None)}"
            error = client_config_error(exc, what, secrets)
        # Raised outside the handler: the client's message, kept as __context__, could hold
        # a secret.
        raise error

    def _meta(self, raw: _ObstoreMeta) -> ObjectMeta:
        return ObjectMeta(
            key=raw["path"],
            etag=raw["e_tag"] or "",
            size=raw["size"],
            last_modified=raw["last_modified"],
        )

    def _check_key(self, key: str) -> None:
        """Raise ConfigError for a key obstore cannot represent or SeaweedFS would alter."""
        reason = key_problem(key)
        if reason is None and len(f"{self._prefix}/{key}".encode()) > _MAX_KEY_BYTES:
            reason = f"longer than {_MAX_KEY_BYTES} UTF-8 bytes with the prefix"
        if reason is not None:
            raise ConfigError(f"{self.service.name} key {key!r} cannot be stored: {reason}")

    async def _put_once(self, key: str, data: bytes, mode: PutMode) -> str:
        """One PUT request; the new etag."""
        store = self._live()
        client_mode = obstore_mode(mode)
        result = await self._call(
            "put",
            key,
            # One PUT request: conditional headers do not apply to multipart uploads.
            lambda: obstore.put_async(store, key, data, mode=client_mode, use_multipart=False),
        )
        etag = result["e_tag"]
        if not etag:
            raise StoreError(f"{self.service.name} put to {self._where(key)} returned no ETag")
        return etag

    async def _delete(self, target: str | Sequence[str], *, missing_ok: bool = True) -> None:
        """One client delete of a key or a list of them, resent after a lost answer. A missing
        key is ignored, or raises NotFoundError unless ``missing_ok``."""
        store = self._live()
        paths = [target] if isinstance(target, str) else target
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"
        ignored: tuple[type[Exception], ...] = (NotFoundError,) if missing_ok else ()
        retries = self._settings.max_retries
        for attempt in range(retries + 1):
            try:
                # S3 reports a missing key as deleted; some servers answer 404 instead.
                with contextlib.suppress(*ignored):
                    await self._call("delete", where, lambda: obstore.delete_async(store, target))
                return
            except StoreUnavailableError as exc:
                # obstore resends a batch delete (a POST) after a 5xx but not after a broken
                # connection or a timeout (POST is not idempotent to it). A delete is: resend.
                if attempt == retries or not isinstance(exc.__cause__, NoAnswer):
                    raise
            await asyncio.sleep(RESEND_BACKOFF_SECONDS * 2**attempt)

    def _learn_unsorted(self) -> None:
        self.list_order = "unsorted"
        logging.getLogger(type(self).__module__).warning(
            "%s server at %s lists keys out of byte order: each listing now reads the whole "
            "prefix and sorts it (docs/protocol.md, Stores)",
            self.service.name,
            self._endpoint,
        )

    def _live(self) -> ObjectStore:
        if self._store is None:
            raise StoreError(f"{self!r} is closed")
        return self._store

    def _where(self, key: str | None, what: str = "key") -> str:
        if key is None:
            return f"{self.container_word} {self._container!r}"
        path = f"{self._prefix}/{key}" if self._prefix else key
        return f"{self.container_word} {self._container!r} {what} {path!r}"

    async def _pages(
        self, directory: str, offset: str | None, *, chunk: int = LIST_PAGE
    ) -> AsyncGenerator[ObjectMeta, None]:
        """Every key under ``directory/`` after ``offset``, in the server's order."""
        store = self._live()
        label = f"{directory}/" if directory else ""
        stream: ListStream[Sequence[_ObstoreMeta]] = await self._call(
            "list",
            label,
            what="prefix",
            make=lambda: _ready(
                obstore.list(store, directory or None, offset=offset, chunk_size=chunk)
            ),
        )
        while True:
            batch = await self._call("list", label, lambda: _next_chunk(stream), "prefix")
            if batch is None:
                return
            for raw in batch:
                yield self._meta(raw)

    async def _call(
        self, op: str, key: str | None, make: Callable[[], Awaitable[_T]], what: str = "key"
    ) -> _T:
        """Run one client call, translating every client exception.

        The request runs in its own task, shielded: cancelling the caller does not stop the
        client's request (it runs on the client's own threads), and :meth:`close` waits for
        it, since a request finishing after the event loop closed can abort the process.
        """
        request = asyncio.ensure_future(make())
        self._in_flight.add(request)
        request.add_done_callback(_forget_request(self._in_flight))
        try:
            return await asyncio.shield(request)
        except Exception as exc:  # the store boundary: nothing from the client escapes
            error = translate(
                exc,
                op,
                self._where(key, what),
                self._endpoint,
                keys_given=self._keys_given,
                service=self.service,
            )
        # Raised outside the handler so the client exception is not kept as __context__.
        raise error


async def _list_in_order(
    source: Source,
    parent: str,
    prefix: str,
    results: list[ObjectMeta],
    limit: int | None,
    bound: str | None,
    inclusive: bool,
    *,
    sorted_server: bool = True,
) -> list[ObjectMeta]:
    """``results`` and the keys with ``prefix`` of one plain listing after them (after
    ``bound`` without results). From a ``sorted_server``, in order, up to ``limit``;
    ServerUnsorted if a key comes out of byte order (s3rver walks its directories:
    ``a-2`` before ``a``). Else every such key, in the server's order."""
    if results:
        bound, inclusive = results[-1].key, False
    previous: str | None = None
    pages = source(parent, offset_below(bound) if bound else None)
    async with contextlib.aclosing(pages):
        async for meta in pages:
            if sorted_server:
                if previous is not None and meta.key < previous:
                    raise ServerUnsorted(meta.key)
                previous = meta.key
            if not (bound is None or meta.key > bound or (inclusive and meta.key == bound)):
                continue
            if sorted_server:
                if _collect(meta, prefix, results, limit):
                    break
            elif meta.key.startswith(prefix):
                results.append(meta)
    return results


def _collect(meta: ObjectMeta, prefix: str, results: list[ObjectMeta], limit: int | None) -> bool:
    """Add ``meta`` (keys arrive in byte order from the bound on); True when done."""
    if not meta.key.startswith(prefix):
        return meta.key > prefix  # past the keys with the prefix
    results.append(meta)
    return limit is not None and len(results) >= limit


def _forget_request(
    in_flight: set[asyncio.Future[Any]],
) -> Callable[[asyncio.Future[Any]], None]:
    def forget(request: asyncio.Future[Any]) -> None:
        in_flight.discard(request)
        if not request.cancelled():
            request.exception()  # retrieved: a caller that was cancelled never will

    return forget


async def _ready(value: _T) -> _T:
    return value


async def _next_chunk(stream: ListStream[Sequence[_ObstoreMeta]]) -> Sequence[_ObstoreMeta] | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
