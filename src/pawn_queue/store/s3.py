"""The S3 store: any S3-compatible bucket through obstore (Rust ``object_store``).

Things obstore and S3 servers do that this module works around:

* obstore list prefixes are path segments (``a/b`` lists ``a/b/...`` only) and list offsets
  are parsed as paths (a trailing ``/`` is dropped). :meth:`S3Store.list` therefore lists the
  parent "directory" of the prefix from a computed offset and filters by string prefix.
* SeaweedFS lists in directory-tree order, not byte order, and ``start-after=a/b`` skips
  every key under ``a/b/``; ``_s3_listing.tree_walk`` restores byte order. Offsets sent are
  never a directory name, except on purpose to jump over one.
* obstore error text carries URLs and response bodies; an AWS error body can echo the access
  key. Errors are rebuilt from the exception's type, the HTTP status, the S3 error code and
  message only (``_s3_errors``: obstore's exceptions carry no fields, so part of it is read
  from their text).
* obstore reads ``AWS_*`` environment variables for any setting not passed explicitly, and
  ``AWS_ENDPOINT_URL_S3`` beats ``endpoint``; explicit settings here pin what matters.

Keys obstore cannot represent (rejected with :class:`ConfigError`): empty keys, a leading or
trailing ``/``, empty segments (``a//b``), ``.`` or ``..`` segments and ASCII control
characters. A backslash is also rejected: SeaweedFS turns it into ``/``. Keys are limited to
1,024 UTF-8 bytes including the store prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import obstore
from obstore.store import S3Store as _ObstoreS3Store

from pawn_queue.config import S3Config
from pawn_queue.exceptions import (
    AlreadyExistsError,
    ConfigError,
    NotFoundError,
    PreconditionFailedError,
    StoreError,
    StoreUnavailableError,
)
from pawn_queue.store._s3_errors import Conflict, NoAnswer, S3ErrorDetail, redact_url, translate
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
    from obstore.store import ClientConfig, RetryConfig, S3Credential
    from obstore.store import S3Config as _ObstoreS3Config

__all__ = ["S3ErrorDetail", "S3Store"]

_T = TypeVar("_T")
logger = logging.getLogger(__name__)

_MAX_KEY_BYTES = 1024
_RESEND_BACKOFF_SECONDS = 0.1  # obstore's initial backoff
_CLOSE_WAIT_SECONDS = 10.0
_CLOSE_SETTLE_SECONDS = 0.15


def _check_key(key: str, prefix: str) -> None:
    """Raise ConfigError for a key obstore cannot represent or SeaweedFS would alter."""
    reason = key_problem(key)
    if reason is None and len(f"{prefix}/{key}".encode()) > _MAX_KEY_BYTES:
        reason = f"longer than {_MAX_KEY_BYTES} UTF-8 bytes with the prefix"
    if reason is not None:
        raise ConfigError(f"S3 key {key!r} cannot be stored: {reason}")


def _normalise_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if prefix and (problem := key_problem(prefix)) is not None:
        raise ConfigError(f"S3 prefix {prefix!r} is invalid: {problem}")
    return prefix


def _endpoint(config: S3Config) -> tuple[str | None, bool]:
    """The endpoint URL to use and whether it is plain HTTP."""
    url = config.endpoint_url
    if not url:
        return None, not config.use_ssl
    if "://" not in url:
        url = ("https://" if config.use_ssl else "http://") + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"S3 endpoint {redact_url(url)!r} is not an http(s) URL")
    if config.addressing_style == "virtual" and not parts.netloc.startswith(
        f"{config.bucket_name}."
    ):
        # obstore expects the bucket already in the host for virtual-hosted requests.
        parts = parts._replace(netloc=f"{config.bucket_name}.{parts.netloc}")
    return urlunsplit(parts).rstrip("/"), parts.scheme == "http"


def _meta(raw: _ObstoreMeta) -> ObjectMeta:
    return ObjectMeta(
        key=raw["path"],
        etag=raw["e_tag"] or "",
        size=raw["size"],
        last_modified=raw["last_modified"],
    )


def _obstore_mode(mode: PutMode) -> _ObstorePutMode:
    if isinstance(mode, IfMatch):
        return {"e_tag": mode.etag}
    if mode in ("overwrite", "create"):
        return mode
    raise ConfigError(f"unknown put mode {mode!r}")


class S3Store:
    """A :class:`~pawn_queue.store.base.Store` on an S3-compatible bucket.

    Etags are returned as the server sends them (S3: quoted, ``'"<md5>"'``) and passed back
    verbatim in ``If-Match``, or bare where the server takes only that form (see
    :attr:`if_match_unquoted`). Without credentials in the config obstore's default chain
    (``AWS_*`` variables, web identity, container role, instance metadata; see
    ``CREDENTIAL_CHAIN``) is used, and an error says when it found none.
    """

    def __init__(self, config: S3Config) -> None:
        self._bucket = config.bucket_name
        self._prefix = _normalise_prefix(config.prefix)
        self._max_retries = config.max_retries
        self._in_flight: set[asyncio.Future[Any]] = set()
        endpoint, plain_http = _endpoint(config)
        self._endpoint = redact_url(endpoint) if endpoint else "(AWS)"
        self.list_order: Literal["tree", "bytes", "unsorted"] = "tree"
        """How this server orders a listing, learnt from listings: SeaweedFS walks its
        directory tree, S3 proper sorts bytes, s3rver neither (see list())."""
        self.if_match_unquoted: bool | None = None
        """How this server takes the ETag of an If-Match: False as it returned it (quoted,
        as HTTP says), True without its quotes (Ceph RGW 16.2 answers 412 to the quoted
        form); None until an if-match put was accepted. Learnt from the first one."""

        client: ClientConfig = {
            "allow_http": plain_http,
            "allow_invalid_certificates": not config.verify_ssl,
            "connect_timeout": timedelta(seconds=config.connect_timeout_seconds),
            "timeout": timedelta(seconds=config.request_timeout_seconds),
        }
        retry_timeout = timedelta(seconds=config.retry_timeout_seconds)
        retry: RetryConfig = {
            "max_retries": config.max_retries,
            "retry_timeout": retry_timeout,
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": min(timedelta(seconds=10), retry_timeout),
                "base": 2,
            },
        }

        key_id, secret = config.aws_access_key_id, config.aws_secret_access_key
        if (key_id is None) != (secret is None):
            raise ConfigError("set both aws_access_key_id and aws_secret_access_key, or neither")
        if key_id is None and config.aws_session_token is not None:
            raise ConfigError(
                "aws_session_token needs aws_access_key_id and aws_secret_access_key "
                "(temporary credentials come as all three)"
            )
        self._keys_given = key_id is not None
        secrets: list[str] = []
        provider: Callable[[], S3Credential] | None = None
        if key_id is not None and secret is not None:
            # A provider instead of plain keys: obstore would otherwise add AWS_SESSION_TOKEN
            # from the environment to our explicit keys, and keep the secret in .config.
            credential: S3Credential = {
                "access_key_id": key_id.get_secret_value(),
                "secret_access_key": secret.get_secret_value(),
                "token": (
                    config.aws_session_token.get_secret_value()
                    if config.aws_session_token is not None
                    else None
                ),
                "expires_at": None,
            }
            secrets = [v for v in credential.values() if isinstance(v, str) and v]

            def provider() -> S3Credential:
                return credential

        options: _ObstoreS3Config = {
            "bucket": self._bucket,
            "region": config.region_name,
            "virtual_hosted_style_request": config.addressing_style == "virtual",
            "conditional_put": "etag",  # enables IfMatch puts
            "skip_signature": False,
        }
        if endpoint is not None:
            # Both keys: AWS_ENDPOINT_URL_S3 from the environment would beat "endpoint".
            options["endpoint"] = endpoint
            options["aws_endpoint_url_s3"] = endpoint
        try:
            self._store: _ObstoreS3Store | None = _ObstoreS3Store(
                prefix=self._prefix or None,
                config=options,
                client_options=client,
                retry_config=retry,
                credential_provider=provider,
            )
        except Exception as exc:
            message = str(exc).split("\n", 1)[0]
            for value in secrets:
                message = message.replace(value, "***")
            error = ConfigError(f"invalid S3 configuration for bucket {self._bucket!r}: {message}")
        else:
            return
        raise error

    def __repr__(self) -> str:
        return (
            f"S3Store(endpoint={self._endpoint!r}, bucket={self._bucket!r}, "
            f"prefix={self._prefix!r})"
        )

    # -- Store protocol -------------------------------------------------------------------

    async def get(self, key: str) -> StoredObject:
        _check_key(key, self._prefix)
        store = self._live()

        async def fetch() -> StoredObject:
            result = await obstore.get_async(store, key)
            data = bytes(await result.bytes_async())
            return StoredObject(data=data, meta=_meta(result.meta))

        return await self._call("get", key, fetch)

    async def head(self, key: str) -> ObjectMeta:
        _check_key(key, self._prefix)
        store = self._live()
        raw = await self._call("head", key, lambda: obstore.head_async(store, key))
        return _meta(raw)

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        _check_key(key, self._prefix)
        if not isinstance(mode, IfMatch):
            return await self._put_resolving_conflicts(key, data, mode)
        etag = mode.etag
        bare = etag[1:-1] if len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag
        if self.if_match_unquoted:
            return await self._put_resolving_conflicts(key, data, IfMatch(bare))
        try:
            new_etag = await self._put_resolving_conflicts(key, data, mode)
        except PreconditionFailedError as exc:
            if self.if_match_unquoted is not None or bare == etag:
                raise
            if isinstance(exc.__cause__, Conflict):
                raise
            # Refused: a stale etag, or a server that wants it without quotes (Ceph RGW).
            # Unchanged since, the object has the very etag refused: try the bare form once.
            try:
                unchanged = (await self.head(key)).etag == etag
            except NotFoundError:
                unchanged = False
            if not unchanged:
                raise
            new_etag = await self._put_resolving_conflicts(key, data, IfMatch(bare))
            self.if_match_unquoted = True
            logger.info(
                "S3 server at %s refuses quoted ETags in If-Match and accepts them bare "
                "(as Ceph RGW does): sending them bare from now on",
                self._endpoint,
            )
            return new_etag
        self.if_match_unquoted = False
        return new_etag

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
            _check_key(key, self._prefix)
        store = self._live()
        paths = list(keys)
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"
        for attempt in range(self._max_retries + 1):
            try:
                # S3 reports a missing key as deleted; some servers answer 404 instead.
                with contextlib.suppress(NotFoundError):
                    # obstore sends DeleteObjects requests of up to 1,000 keys.
                    await self._call("delete", where, lambda: obstore.delete_async(store, paths))
                return
            except StoreUnavailableError as exc:
                # obstore resends a DeleteObjects POST after a 5xx but not after a broken
                # connection or a timeout (POST is not idempotent to it). A delete is: resend.
                if attempt == self._max_retries or not isinstance(exc.__cause__, NoAnswer):
                    raise
            await asyncio.sleep(_RESEND_BACKOFF_SECONDS * 2**attempt)

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
        """Verify that the bucket exists and the credentials may list it (one request).

        Raises BucketNotFoundError, AccessDeniedError or StoreUnavailableError, clearly worded.
        """
        store = self._live()
        await self._call(
            "check",
            None,
            # A prefix that holds nothing keeps the answer small.
            lambda: obstore.list_with_delimiter_async(store, "_pawn_queue_check"),
        )

    # -- internals ------------------------------------------------------------------------

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
                yield _meta(raw)

    async def _put_resolving_conflicts(self, key: str, data: bytes, mode: PutMode) -> str:
        """One PUT; a 409 to a conditional write (another conditional write to the key was in
        progress; not applied) is resent, then reported as the lost race it is: AlreadyExists
        for create-only, PreconditionFailed for if-match (docs/protocol.md, "Stores")."""
        store = self._live()
        obstore_mode = _obstore_mode(mode)
        for attempt in range(self._max_retries + 1):
            try:
                result = await self._call(
                    "put",
                    key,
                    # One PUT request: conditional headers do not apply to multipart uploads.
                    lambda: obstore.put_async(
                        store, key, data, mode=obstore_mode, use_multipart=False
                    ),
                )
            except StoreError as exc:
                if not isinstance(exc.__cause__, Conflict):
                    raise
                # obstore resends a 409 to if-match by itself, not to create-only.
                if mode == "create" and attempt < self._max_retries:
                    await asyncio.sleep(_RESEND_BACKOFF_SECONDS * 2**attempt)
                    continue
                lost = AlreadyExistsError if mode == "create" else PreconditionFailedError
                raise lost(str(exc)) from exc.__cause__
            etag = result["e_tag"]
            if not etag:
                raise StoreError(f"S3 put to {self._where(key)} returned no ETag")
            return etag
        raise AssertionError("unreachable")

    def _learn_unsorted(self) -> None:
        self.list_order = "unsorted"
        logger.warning(
            "S3 server at %s lists keys out of byte order: each listing now reads the whole "
            "prefix and sorts it (docs/protocol.md, Stores)",
            self._endpoint,
        )

    def _live(self) -> _ObstoreS3Store:
        if self._store is None:
            raise StoreError(f"{self!r} is closed")
        return self._store

    def _where(self, key: str | None, what: str = "key") -> str:
        if key is None:
            return f"bucket {self._bucket!r}"
        path = f"{self._prefix}/{key}" if self._prefix else key
        return f"bucket {self._bucket!r} {what} {path!r}"

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
                exc, op, self._where(key, what), self._endpoint, keys_given=self._keys_given
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


if TYPE_CHECKING:
    from pawn_queue.store.base import Store

    def _satisfies_protocol(store: S3Store) -> Store:
        return store
