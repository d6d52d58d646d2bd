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
  message only (``_object_store_errors``: obstore's exceptions carry no fields, so part of
  it is read from their text).
* obstore reads ``AWS_*`` environment variables for any setting not passed explicitly, and
  ``AWS_ENDPOINT_URL_S3`` beats ``endpoint``; explicit settings here pin what matters.

Key rules, listing, deletes, closing and the client's timeouts and retries are shared with
the Azure store (``_object_store``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit, urlunsplit

from obstore.store import S3Store as _ObstoreS3Store

from pawn_queue.config import S3Config
from pawn_queue.exceptions import (
    AlreadyExistsError,
    ConfigError,
    NotFoundError,
    PreconditionFailedError,
    StoreError,
)
from pawn_queue.store._object_store import RESEND_BACKOFF_SECONDS, ObstoreStore
from pawn_queue.store._object_store_errors import (
    ClientErrorDetail,
    Conflict,
    Service,
    redact_url,
)
from pawn_queue.store.base import IfMatch, PutMode

if TYPE_CHECKING:
    from obstore.store import S3Config as _ObstoreS3Config
    from obstore.store import S3Credential

__all__ = ["S3ErrorDetail", "S3Store"]

logger = logging.getLogger(__name__)

S3ErrorDetail = ClientErrorDetail  # its name before the Azure store shared it

CREDENTIAL_CHAIN = (
    "the config (s3.aws_access_key_id, s3.aws_secret_access_key), "
    "PAWNQUEUE_S3_AWS_ACCESS_KEY_ID / PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY, "
    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
    "AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, "
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, "
    "then the instance-metadata service (an instance role)"
)
"""Where credentials are looked for, in order (the README's "Credentials")."""

S3 = Service(
    name="S3",
    missing_container=frozenset({"NoSuchBucket"}),
    access_codes=frozenset(
        {
            "AccessDenied",
            "AllAccessDisabled",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
            "InvalidToken",
            "TokenRefreshRequired",
            "AuthorizationHeaderMalformed",
            "MissingSecurityHeader",
            "InvalidSecurity",
            "AccountProblem",
        }
    ),
    transient_codes=frozenset({"ServiceUnavailable", "InternalError", "RequestTimeout"}),
    throttle_codes=frozenset({"SlowDown", "Throttling", "TooManyRequests"}),
    # A request of the client's last credential source, the instance-metadata service (IMDS).
    credential_lookup=re.compile(r"https?://[^\s/]+/latest/(?:api/token|meta-data/)"),
    credential_chain=CREDENTIAL_CHAIN,
)


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


class S3Store(ObstoreStore):
    """A :class:`~pawn_queue.store.base.Store` on an S3-compatible bucket.

    Etags are returned as the server sends them (S3: quoted, ``'"<md5>"'``) and passed back
    verbatim in ``If-Match``, or bare where the server takes only that form (see
    :attr:`if_match_unquoted`). Without credentials in the config obstore's default chain
    (``AWS_*`` variables, web identity, container role, instance metadata; see
    ``CREDENTIAL_CHAIN``) is used, and an error says when it found none.
    """

    service: ClassVar[Service] = S3
    container_word: ClassVar[str] = "bucket"
    _store: _ObstoreS3Store | None

    def __init__(self, config: S3Config) -> None:
        endpoint, plain_http = _endpoint(config)
        super().__init__(
            container=config.bucket_name,
            prefix=config.prefix,
            endpoint=redact_url(endpoint) if endpoint else "(AWS)",
            settings=config,
            keys_given=config.aws_access_key_id is not None,
            list_order="tree",  # SeaweedFS's; a server that sorts bytes is detected
        )
        self.if_match_unquoted: bool | None = None
        """How this server takes the ETag of an If-Match: False as it returned it (quoted,
        as HTTP says), True without its quotes (Ceph RGW 16.2 answers 412 to the quoted
        form); None until an if-match put was accepted. Learnt from the first one."""

        key_id, secret = config.aws_access_key_id, config.aws_secret_access_key
        if (key_id is None) != (secret is None):
            raise ConfigError("set both aws_access_key_id and aws_secret_access_key, or neither")
        if key_id is None and config.aws_session_token is not None:
            raise ConfigError(
                "aws_session_token needs aws_access_key_id and aws_secret_access_key "
                "(temporary credentials come as all three)"
            )
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
            "bucket": self._container,
            "region": config.region_name,
            "virtual_hosted_style_request": config.addressing_style == "virtual",
            "conditional_put": "etag",  # enables IfMatch puts
            "skip_signature": False,
        }
        if endpoint is not None:
            # Both keys: AWS_ENDPOINT_URL_S3 from the environment would beat "endpoint".
            options["endpoint"] = endpoint
            options["aws_endpoint_url_s3"] = endpoint
        self._store = self._open(
            lambda client, retry: _ObstoreS3Store(
                prefix=self._prefix or None,
                config=options,
                client_options=client,
                retry_config=retry,
                credential_provider=provider,
            ),
            plain_http=plain_http,
            verify_certificates=config.verify_ssl,
            secrets=secrets,
        )

    # -- Store protocol -------------------------------------------------------------------

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        self._check_key(key)
        if not isinstance(mode, IfMatch):
            return await self._put_resolving_conflicts(key, data, mode)
        etag = mode.etag
        bare = etag[1:-1] if len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag
        if self.if_match_unquoted:
            return await self._put_resolving_conflicts(key, data, IfMatch(bare))
        try:
            new_etag = await self._put_resolving_conflicts(key, data, mode)
        except PreconditionFailedError as exc:
            # Refused: a stale etag, or a server that wants it without quotes (Ceph RGW).
            if (
                bare == etag
                or isinstance(exc.__cause__, Conflict)
                or self.if_match_unquoted is False
            ):
                raise
            if self.if_match_unquoted is None:
                # Unchanged since, the object has the very etag refused: the form was.
                try:
                    unchanged = (await self.head(key)).etag == etag
                except NotFoundError:
                    unchanged = False
                if not unchanged:
                    raise
            # Else another write learnt the bare form while this one was on its way.
            new_etag = await self._put_resolving_conflicts(key, data, IfMatch(bare))
            if self.if_match_unquoted is None:
                self.if_match_unquoted = True
                logger.info(
                    "S3 server at %s refuses quoted ETags in If-Match and accepts them bare "
                    "(as Ceph RGW does): sending them bare from now on",
                    self._endpoint,
                )
            return new_etag
        self.if_match_unquoted = False
        return new_etag

    # -- internals ------------------------------------------------------------------------

    async def _put_resolving_conflicts(self, key: str, data: bytes, mode: PutMode) -> str:
        """One PUT; a 409 to a conditional write (another conditional write to the key was in
        progress; not applied) is resent, then reported as the lost race it is: AlreadyExists
        for create-only, PreconditionFailed for if-match (docs/protocol.md, "Stores")."""
        retries = self._settings.max_retries
        for attempt in range(retries + 1):
            try:
                return await self._put_once(key, data, mode)
            except StoreError as exc:
                if not isinstance(exc.__cause__, Conflict):
                    raise
                # obstore resends a 409 to if-match by itself, not to create-only.
                if mode == "create" and attempt < retries:
                    await asyncio.sleep(RESEND_BACKOFF_SECONDS * 2**attempt)
                    continue
                lost = AlreadyExistsError if mode == "create" else PreconditionFailedError
                raise lost(str(exc)) from exc.__cause__
        raise AssertionError("unreachable")


if TYPE_CHECKING:
    from pawn_queue.store.base import Store

    def _satisfies_protocol(store: S3Store) -> Store:
        return store
