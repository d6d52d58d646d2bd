"""The Azure store: an Azure Blob Storage container through obstore's ``AzureStore``.

Conditional writes are Azure's own: a create-only put sends ``If-None-Match: *`` (refused
with 409 ``BlobAlreadyExists``), an if-match put ``If-Match`` with the ETag as returned
(refused with 412 ``ConditionNotMet``, also when the blob is missing). Things obstore, Azure
and Azurite (its emulator) do that this module works around:

* A listing gives ETags bare (the XML's ``<Etag>``), HEAD, GET and PUT quoted (the header):
  listed ETags get their quotes back, so an object has one ETag wherever it was read.
* A list offset goes out as ``startFrom``, which Azurite ignores: a listing from an offset
  reads from the start of the prefix's directory, and the keys before it are dropped here.
  Azurite lists in UTF-16 order (``😀`` before ``\\uffef``), which is detected as any
  listing out of byte order is (``_object_store``).
* A batch delete (Blob Batch, up to 256 blobs a request) reports a missing blob as an error
  and obstore stops reading the batch's answers there: a batch that reports one is deleted
  again blob by blob, so no other blob's failure goes unseen.
* obstore's ``use_emulator`` ignores ``endpoint`` (it takes ``AZURITE_BLOB_STORAGE_URL`` or
  port 10000): ``use_emulator`` is applied here, as defaults for what the config leaves out.
* obstore reads ``AZURE_*`` environment variables for any setting not passed: the account,
  container, endpoint and emulator switch are always passed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

from obstore.store import AzureStore as _ObstoreAzureStore

from pawn_queue.config import AzureConfig
from pawn_queue.exceptions import ConfigError, NotFoundError
from pawn_queue.store._object_store import ObstoreStore
from pawn_queue.store._object_store_errors import Service, redact_url
from pawn_queue.store.base import ObjectMeta, PutMode

if TYPE_CHECKING:
    from obstore import ObjectMeta as _ObstoreMeta
    from obstore.store import AzureAccessKey
    from obstore.store import AzureConfig as _ObstoreAzureConfig

__all__ = ["AzureStore"]

EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = (  # published by Microsoft for Azurite and the storage emulator: no secret
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
EMULATOR_ENDPOINT = "http://127.0.0.1:10000"

BATCH_DELETES = 256  # the most subrequests a Blob Batch request takes
_EACH_AT_ONCE = 16  # deletes in flight when a batch is deleted again blob by blob

CREDENTIAL_CHAIN = (
    "the config (azure.account_key), PAWNQUEUE_AZURE_ACCOUNT_KEY, "
    "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_TOKEN, AZURE_STORAGE_SAS_KEY, "
    "a service principal (AZURE_CLIENT_ID with AZURE_CLIENT_SECRET or "
    "AZURE_FEDERATED_TOKEN_FILE, and AZURE_TENANT_ID), the Azure CLI (AZURE_USE_AZURE_CLI), "
    "then a managed identity (the instance-metadata service)"
)
"""Where credentials are looked for (the README's "Credentials")."""

AZURE = Service(
    name="Azure",
    missing_container=frozenset({"ContainerNotFound", "ContainerBeingDeleted"}),
    access_codes=frozenset(
        {
            "AuthenticationFailed",
            "AuthorizationFailure",
            "AuthorizationPermissionMismatch",
            "AuthorizationProtocolMismatch",
            "AuthorizationResourceTypeMismatch",
            "AuthorizationServiceMismatch",
            "AuthorizationSourceIPMismatch",
            "InsufficientAccountPermissions",
            "InvalidAuthenticationInfo",
            "NoAuthenticationInformation",
            "AccountIsDisabled",
        }
    ),
    transient_codes=frozenset({"InternalError", "OperationTimedOut"}),
    throttle_codes=frozenset({"ServerBusy"}),
    # The managed-identity token request, the last credential source obstore tries.
    credential_lookup=re.compile(r"https?://[^\s/]+/metadata/identity/oauth2/token"),
    credential_chain=CREDENTIAL_CHAIN,
    conflict_on_put=False,
)


def _endpoint(config: AzureConfig, account: str) -> tuple[str, bool]:
    """The blob service URL (with the account in its path for Azurite) and whether it is
    plain HTTP."""
    url = config.endpoint_url
    if url is None:
        url = (
            EMULATOR_ENDPOINT if config.use_emulator else f"https://{account}.blob.core.windows.net"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"Azure endpoint {redact_url(url)!r} is not an http(s) URL")
    if config.use_emulator and parts.path in ("", "/"):
        # Azurite serves every account on one port: the account is the path's first part.
        parts = parts._replace(path=f"/{account}")
    return parts.geturl().rstrip("/"), parts.scheme == "http"


def _account_key(config: AzureConfig) -> str | None:
    if config.account_key is None:
        return EMULATOR_KEY if config.use_emulator else None
    key = config.account_key.get_secret_value()
    try:
        valid = bool(base64.b64decode(key, validate=True))
    except (binascii.Error, ValueError):
        valid = False
    if not valid:  # a config built past its validators; obstore would fail at each request
        raise ConfigError("azure.account_key is not an account key (base64 text)")
    return key


class AzureStore(ObstoreStore):
    """A :class:`~pawn_queue.store.base.Store` on an Azure Blob Storage container.

    Etags are Azure's, quoted (``'"0x8DC..."'``), and change on every write, identical bytes
    or not. Without an account key in the config obstore's default chain (``AZURE_*``
    variables, a service principal, the Azure CLI, a managed identity; see
    ``CREDENTIAL_CHAIN``) is used, and an error says when it found none.
    """

    service: ClassVar[Service] = AZURE
    container_word: ClassVar[str] = "container"
    _store: _ObstoreAzureStore | None

    def __init__(self, config: AzureConfig) -> None:
        account = config.account_name or (EMULATOR_ACCOUNT if config.use_emulator else None)
        if account is None:
            raise ConfigError("azure.account_name is required unless azure.use_emulator is true")
        endpoint, plain_http = _endpoint(config, account)
        key = _account_key(config)
        super().__init__(
            container=config.container_name,
            prefix=config.prefix,
            endpoint=redact_url(endpoint),
            settings=config,
            keys_given=key is not None,
            list_order="bytes",  # Azure sorts names; Azurite's UTF-16 order is detected
        )
        provider = None
        if key is not None:
            # A provider instead of account_key: obstore keeps the key out of .config then,
            # and no AZURE_* credential from the environment takes its place.
            credential: AzureAccessKey = {"access_key": key, "expires_at": None}

            def provider() -> AzureAccessKey:
                return credential

        options: _ObstoreAzureConfig = {
            "account_name": account,
            "container_name": config.container_name,
            "endpoint": endpoint,
            "use_emulator": False,
            "skip_signature": False,
        }
        self._store = self._open(
            lambda client, retry: _ObstoreAzureStore(
                prefix=self._prefix or None,
                config=options,
                client_options=client,
                retry_config=retry,
                credential_provider=provider,
            ),
            plain_http=plain_http,
            secrets=[key] if key is not None else [],
        )

    # -- Store protocol -------------------------------------------------------------------

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        self._check_key(key)
        return await self._put_once(key, data, mode)

    async def delete_many(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        for key in keys:
            self._check_key(key)
        if len(keys) == 1:
            await self._delete(keys[0])  # one DELETE: no batch for a single blob
            return
        for start in range(0, len(keys), BATCH_DELETES):
            batch = keys[start : start + BATCH_DELETES]
            try:
                await self._delete(batch, missing_ok=False)
            except NotFoundError:
                await self._delete_each(batch)

    # -- internals ------------------------------------------------------------------------

    def _meta(self, raw: _ObstoreMeta) -> ObjectMeta:
        meta = super()._meta(raw)
        if meta.etag and not meta.etag.startswith('"'):
            return dataclasses.replace(meta, etag=f'"{meta.etag}"')
        return meta

    async def _delete_each(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` one DELETE each (missing ones ignored), a few at a time."""
        limit = asyncio.Semaphore(_EACH_AT_ONCE)

        async def one(key: str) -> None:
            async with limit:
                await self._delete(key)

        results = await asyncio.gather(*(one(key) for key in keys), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


if TYPE_CHECKING:
    from pawn_queue.store.base import Store

    def _satisfies_protocol(store: AzureStore) -> Store:
        return store
