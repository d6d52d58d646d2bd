"""PawnQueueBuilder: configuration in code, optionally completed from ``PAWNQUEUE_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

from pydantic import SecretStr

from pawn_queue._internal.config_sources import deep_merge
from pawn_queue.client import PawnQueue
from pawn_queue.config import CsprngVerifyConfig, PawnQueueConfig, parse_url
from pawn_queue.exceptions import ConfigError


class PawnQueueBuilder:
    """Fluent configuration::

        pawnqueue = await (
            PawnQueueBuilder()
            .s3(endpoint_url="http://localhost:9000", bucket_name="my-queue",
                access_key="minioadmin", secret_key="minioadmin")
            .polling(interval_seconds=2)
            .from_env()
            .build()
        )

    Values set on the builder win; ``from_env()`` fills the rest from the environment,
    wherever it appears in the chain. Every method returns the builder; a later call
    overrides the same keys of an earlier one. Nothing is checked before ``build_config()``.
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._environ: dict[str, str] | None = None

    def s3(
        self,
        *,
        endpoint_url: str | None = None,
        bucket_name: str | None = None,
        access_key: str | SecretStr | None = None,
        secret_key: str | SecretStr | None = None,
        region_name: str | None = None,
        use_ssl: bool | None = None,
        **fields: Any,
    ) -> Self:
        """Use an S3-compatible bucket. ``fields``: any other ``S3Config`` field (``prefix``...).

        ``access_key``/``secret_key`` set ``aws_access_key_id``/``aws_secret_access_key``.
        """
        for short, full, value in (
            ("access_key", "aws_access_key_id", access_key),
            ("secret_key", "aws_secret_access_key", secret_key),
        ):
            if value is not None and fields.get(full) is not None:
                raise ConfigError(f"s3(): give {short} or {full}, not both")
            if value is not None:
                fields[full] = value
        for name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
            # Wrapped at once so a builder printed while debugging shows no secret.
            if isinstance(fields.get(name), str):
                fields[name] = SecretStr(fields[name])
        named = {
            "endpoint_url": endpoint_url,
            "bucket_name": bucket_name,
            "region_name": region_name,
            "use_ssl": use_ssl,
        }
        return self._set("s3", {**named, **fields}, backend="s3")

    def azure(
        self,
        *,
        container_name: str | None = None,
        account_name: str | None = None,
        account_key: str | SecretStr | None = None,
        endpoint_url: str | None = None,
        **fields: Any,
    ) -> Self:
        """Use an Azure Blob Storage container. ``fields``: any other ``AzureConfig`` field
        (``prefix``, ``use_emulator``...)."""
        if isinstance(account_key, str):
            account_key = SecretStr(account_key)  # at once: a printed builder shows no key
        named = {
            "container_name": container_name,
            "account_name": account_name,
            "account_key": account_key,
            "endpoint_url": endpoint_url,
        }
        return self._set("azure", {**named, **fields}, backend="azure")

    def filesystem(self, path: str | os.PathLike[str]) -> Self:
        """Use a local directory as the store."""
        return self._set("filesystem", {"path": os.fspath(path)}, backend="filesystem")

    def memory(self, name: str = "") -> Self:
        """Use an in-process store; builders with the same non-empty ``name`` share one."""
        return self._set("memory", {"name": name}, backend="memory")

    def url(self, url: str) -> Self:
        """Use the store a URL names: ``s3://bucket/prefix?...``, ``az://container/prefix?...``,
        ``file://...``, ``memory://``."""
        self._values = deep_merge(self._values, parse_url(url))
        return self

    def polling(self, **fields: Any) -> Self:
        """Set ``PollingConfig`` fields (``interval_seconds``, ``max_messages_per_poll``...)."""
        return self._set("polling", fields)

    def concurrency(
        self,
        *,
        strategy: str | None = None,
        csprng_verify: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Self:
        """Set the lease strategy and ``ConcurrencyConfig`` fields.

        The ``csprng_verify`` settings go in ``csprng_verify={...}`` or flat
        (``jitter_min_ms=100``), as 0.1.x allowed.
        """
        nested = dict(csprng_verify or {})
        for name in CsprngVerifyConfig.model_fields:
            if name in fields:
                nested[name] = fields.pop(name)
        values: dict[str, Any] = {"strategy": strategy, **fields}
        if nested:
            values["csprng_verify"] = {k: v for k, v in nested.items() if v is not None}
        return self._set("concurrency", values)

    def registry(self, **fields: Any) -> Self:
        """Set ``RegistryConfig`` fields (``heartbeat_interval_seconds``)."""
        return self._set("registry", fields)

    def producer(self, **fields: Any) -> Self:
        """Set ``ProducerConfig`` fields (``group_commit``, ``linger_seconds``,
        ``max_batch_messages``, ``max_batch_bytes``)."""
        return self._set("producer", fields)

    def notify(self, **fields: Any) -> Self:
        """Set ``NotifyConfig`` fields (``enabled``, ``check_interval_seconds``)."""
        return self._set("notify", fields)

    def from_env(self, environ: Mapping[str, str] | None = None) -> Self:
        """Fill what the builder leaves unset from ``PAWNQUEUE_*`` variables.

        ``environ`` defaults to ``os.environ``, read now. See ``PawnQueueConfig.from_env``.
        """
        source = os.environ if environ is None else environ
        self._environ = {k: v for k, v in source.items() if k.startswith("PAWNQUEUE_")}
        return self

    def build_config(self) -> PawnQueueConfig:
        """Check everything set so far and return the config; raises ConfigError."""
        if self._environ is None:
            return PawnQueueConfig.from_dict(self._values)
        return PawnQueueConfig.from_env(self._environ, base=self._values, override=False)

    async def build(self) -> PawnQueue:
        """A PawnQueue for this config, not yet set up (``async with`` or ``setup()`` does that)."""
        return PawnQueue(self.build_config())

    def _set(self, section: str, values: Mapping[str, Any], *, backend: str | None = None) -> Self:
        # None means "not set", as in 0.1.x, so optional arguments can be passed through.
        given = {key: value for key, value in values.items() if value is not None}
        update: dict[str, Any] = {section: given}
        if backend is not None:
            update["backend"] = backend
        self._values = deep_merge(self._values, update)
        return self
