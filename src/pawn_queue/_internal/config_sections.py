"""The sections of the configuration: one immutable, strictly checked model per YAML section.

:class:`~pawn_queue.config.PawnQueueConfig` (in :mod:`pawn_queue.config`) holds them; import
them from there. Every failure is a :class:`~pawn_queue.exceptions.ConfigError` naming the key
path (see :func:`~pawn_queue._internal.config_sources.config_errors`).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal, Self, get_args
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pawn_queue._internal.config_sources import (
    AZURE_CREDENTIALS_HINT,
    CREDENTIALS_HINT,
    InvalidValue,
    config_errors,
)

# Warnings about a setting come from the module users configure through.
logger = logging.getLogger("pawn_queue.config")

Strategy = Literal["auto", "conditional_write", "csprng_verify"]
Backend = Literal["s3", "filesystem", "memory", "azure"]
BACKENDS: Final[tuple[str, ...]] = get_args(Backend)

# AWS's rule, which every S3-compatible store accepts; stricter stores may refuse some names.
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Azure's rules: a hyphen only between a letter or digit and another.
_CONTAINER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_ACCOUNT_NAME = re.compile(r"[a-z0-9]{3,24}")

_NUMBER_TYPES: Final = (int, float, int | None, float | None)

# Defaults of the settings that depend on the visibility timeout (when they are not set).
REFRESH_INTERVAL_SECONDS: Final = 10.0
SKEW_MARGIN_SECONDS: Final = 2.0


def default_refresh_interval(visibility_timeout: float) -> float:
    """``polling.lease_refresh_interval_seconds`` when not set: 10 s, or a third of the
    visibility timeout when that is less (so two refreshes may fail before a lease expires)."""
    return min(REFRESH_INTERVAL_SECONDS, visibility_timeout / 3)


def default_skew_margin(visibility_timeout: float) -> float:
    """``concurrency.clock_skew_margin_seconds`` when not set: 2 s, or a quarter of the
    visibility timeout when that is less (a margin must stay well inside a lease)."""
    return min(SKEW_MARGIN_SECONDS, visibility_timeout / 4)


LEASE_REQUEST_FLOOR_SECONDS: Final = 0.5  # no lease request is given up sooner


def claim_seconds(visibility_timeout: float) -> float:
    """How long a claim's requests may take before the claim is given up (rule 11): half the
    visibility timeout, so a lease claimed is held for at least the other half."""
    return max(LEASE_REQUEST_FLOOR_SECONDS, visibility_timeout / 2)


def renew_seconds(visibility_timeout: float, safe_seconds: float) -> float:
    """How long a refresh or release may take before it is given up (rule 11): a quarter of
    the visibility timeout, so a stalled refresh leaves time for the next one, and no longer
    than the ``safe_seconds`` the lease stays safe (but at least 1 s where a quarter allows)."""
    bound = min(visibility_timeout / 4, max(safe_seconds, 1.0))
    return max(LEASE_REQUEST_FLOOR_SECONDS, bound)


def set_derived(model: BaseModel, name: str, value: object) -> None:
    """Set a default computed from other fields on a frozen model, leaving the field out of
    ``model_fields_set``: it still counts as not set when the config is rebuilt."""
    object.__setattr__(model, name, value)


def shown_setting(model: BaseModel, name: str) -> str:
    """A field's value for an error message, saying when it is the default."""
    value = getattr(model, name)
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return shown if name in model.model_fields_set else f"{shown}, the default"


def store_prefix(value: str) -> str:
    """A key prefix without surrounding ``/``; InvalidValue for empty, ``.`` or ``..`` parts."""
    prefix = value.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise InvalidValue(
            "must be '/'-separated names, without empty, '.' or '..' parts", value=value
        )
    return prefix


def http_url(value: str, expected: str, credentials_hint: str, *, with_path: bool) -> str:
    """``value`` checked as ``http(s)://host[:port]`` (and a path if ``with_path``), without
    a trailing ``/``; InvalidValue saying ``expected`` otherwise."""
    if "@" in value:
        raise InvalidValue(
            f"credentials are not allowed in endpoint_url: {credentials_hint}", show_value=False
        )
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise InvalidValue(expected, value=value) from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or (parts.path not in ("", "/") and not with_path)
        or parts.query
        or parts.fragment
    ):
        raise InvalidValue(expected, value=value)
    path = parts.path.rstrip("/") if with_path else ""
    return f"{parts.scheme}://{parts.netloc}{path}"


class Section(BaseModel):
    """Strict, immutable, and failing with ConfigError however it is built."""

    # hide_input_in_errors: a ValidationError (kept as __context__) must not carry secrets.
    # allow_inf_nan: every number is finite ("inf" read from YAML or the environment too).
    model_config = ConfigDict(
        extra="forbid", frozen=True, hide_input_in_errors=True, allow_inf_nan=False
    )
    section_path: ClassVar[str] = ""

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        """``true`` is no number of seconds (pydantic would read it as 1)."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in _NUMBER_TYPES:
            raise ValueError("must be a number, not true or false")
        return value

    def __init__(self, **data: Any) -> None:
        with config_errors(type(self), prefix=self.section_path):
            super().__init__(**data)

    # Tells pydantic this __init__ only wraps its own (as RootModel does), so nested sections
    # are validated in one pass and their errors keep their full path.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        with config_errors(type(self), prefix=self.section_path):
            super().__setattr__(name, value)

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        with config_errors(cls, prefix=cls.section_path):
            return super().model_validate(obj, *args, **kwargs)


class S3Config(Section):
    """Where and how to reach an S3-compatible bucket.

    With an ``endpoint_url``, its scheme decides ``use_ssl`` (``http://`` means False).
    """

    section_path: ClassVar[str] = "s3"

    endpoint_url: str | None = None
    bucket_name: str
    prefix: str = ""
    aws_access_key_id: SecretStr | None = None
    aws_secret_access_key: SecretStr | None = None
    aws_session_token: SecretStr | None = None
    region_name: str = Field(default="us-east-1", min_length=1)
    use_ssl: bool = True
    verify_ssl: bool = True
    addressing_style: Literal["path", "virtual"] = "path"
    connect_timeout_seconds: float = Field(default=5.0, gt=0)
    request_timeout_seconds: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_timeout_seconds: float = Field(default=30.0, gt=0)
    throttle_timeout_seconds: float = Field(default=60.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _use_ssl_follows_endpoint(cls, data: Any) -> Any:
        endpoint = data.get("endpoint_url") if isinstance(data, Mapping) else None
        if not isinstance(endpoint, str) or "://" not in endpoint:
            return data
        scheme = endpoint.split("://", 1)[0].lower()
        if scheme not in ("http", "https"):
            return data  # the endpoint_url check reports it
        https = scheme == "https"
        given = data.get("use_ssl")
        if given is not None and given != https:
            # 0.1.x ignored use_ssl when the endpoint had a scheme; keep such configs working.
            logger.warning("s3.use_ssl=%r ignored: endpoint_url is %s://", given, scheme)
        return {**data, "use_ssl": https}

    @field_validator("bucket_name")
    @classmethod
    def _check_bucket_name(cls, value: str) -> str:
        if not _BUCKET_NAME.fullmatch(value):
            raise InvalidValue(
                "not a valid S3 bucket name: 3-63 characters of lowercase letters, digits, "
                "dots and hyphens, starting and ending with a letter or digit",
                value=value,
            )
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _check_endpoint_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        expected = "must be http(s)://host[:port], e.g. http://127.0.0.1:8333"
        return http_url(value, expected, CREDENTIALS_HINT, with_path=False)

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return store_prefix(value)


class AzureConfig(Section):
    """Where and how to reach an Azure Blob Storage container.

    ``use_emulator`` fills what is not set with Azurite's defaults: the account
    ``devstoreaccount1`` and its published key, the endpoint
    ``http://127.0.0.1:10000/devstoreaccount1`` (an ``endpoint_url`` without a path gets
    ``/<account>`` appended, as Azurite wants).
    """

    section_path: ClassVar[str] = "azure"

    container_name: str
    prefix: str = ""
    account_name: str | None = None
    account_key: SecretStr | None = None
    endpoint_url: str | None = None
    use_emulator: bool = False
    connect_timeout_seconds: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    request_timeout_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    max_retries: int = Field(default=3, ge=0)
    retry_timeout_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    throttle_timeout_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)

    @field_validator("container_name")
    @classmethod
    def _check_container_name(cls, value: str) -> str:
        if not _CONTAINER_NAME.fullmatch(value):
            raise InvalidValue(
                "not a valid Azure container name: 3-63 characters of lowercase letters, "
                "digits and hyphens, starting and ending with a letter or digit, no '--'",
                value=value,
            )
        return value

    @field_validator("account_name")
    @classmethod
    def _check_account_name(cls, value: str | None) -> str | None:
        if value is not None and not _ACCOUNT_NAME.fullmatch(value):
            raise InvalidValue(
                "not a valid Azure storage account name: 3-24 lowercase letters and digits",
                value=value,
            )
        return value

    @field_validator("account_key")
    @classmethod
    def _check_account_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        try:
            decoded = base64.b64decode(value.get_secret_value(), validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        if not decoded:
            raise InvalidValue(
                "not an account key: the base64 text of key1 or key2 (Azure portal, 'Access keys')",
                show_value=False,
            )
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _check_endpoint_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        expected = (
            "must be http(s)://host[:port][/path], e.g. https://myaccount.blob.core.windows.net "
            "or http://127.0.0.1:10000/devstoreaccount1"
        )
        return http_url(value, expected, AZURE_CREDENTIALS_HINT, with_path=True)

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return store_prefix(value)

    @model_validator(mode="after")
    def _account_known(self) -> Self:
        if self.account_name is None and not self.use_emulator:
            raise InvalidValue(
                "required unless use_emulator is true (in the config, "
                "PAWNQUEUE_AZURE_ACCOUNT_NAME or the az:// URL's account_name)",
                field="account_name",
                show_value=False,
            )
        return self


class FilesystemConfig(Section):
    """A local directory used as the store; a relative path is taken from the working
    directory, and a leading ``~`` or ``~user`` is that user's home directory."""

    section_path: ClassVar[str] = "filesystem"

    path: str = Field(min_length=1)

    @field_validator("path", mode="before")
    @classmethod
    def _accept_path_objects(cls, value: Any) -> Any:
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        # file://~/q and PAWNQUEUE_FILESYSTEM_PATH=~/q reach no shell that would expand ~.
        return os.path.expanduser(value) if isinstance(value, str) else value


class MemoryConfig(Section):
    """An in-process store. Stores with the same non-empty ``name`` are shared in a process."""

    section_path: ClassVar[str] = "memory"

    name: str = ""


class PollingConfig(Section):
    """How consumers poll and hold leases.

    ``lease_refresh_interval_seconds``, when not set, follows the visibility timeout (see
    :func:`default_refresh_interval`); when set, it must be shorter than the timeout.
    """

    section_path: ClassVar[str] = "polling"

    interval_seconds: float = Field(default=5.0, gt=0)
    max_messages_per_poll: int = Field(default=10, ge=1)
    visibility_timeout_seconds: float = Field(default=30.0, gt=0)
    lease_refresh_interval_seconds: float = Field(default=10.0, gt=0)
    jitter_max_ms: int = Field(default=200, ge=0)  # accepted for 0.1 configs; unused
    # How long a stopping listen() lets running handlers finish before releasing their leases.
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)

    @model_validator(mode="after")
    def _refresh_before_expiry(self) -> Self:
        visibility = self.visibility_timeout_seconds
        if "lease_refresh_interval_seconds" not in self.model_fields_set:
            set_derived(
                self, "lease_refresh_interval_seconds", default_refresh_interval(visibility)
            )
            return self
        # Rule 8: a refresh that cannot land before the lease expires lets another consumer
        # take the message over while this one still works on it.
        if self.lease_refresh_interval_seconds >= visibility:
            shown = shown_setting(self, "visibility_timeout_seconds")
            raise InvalidValue(
                f"must be shorter than visibility_timeout_seconds ({shown}) "
                "so a lease is refreshed before it expires",
                field="lease_refresh_interval_seconds",
                value=self.lease_refresh_interval_seconds,
            )
        return self


class CsprngVerifyConfig(Section):
    """Timings of the ``csprng_verify`` lease protocol (stores without conditional writes).

    With only one of ``jitter_min_ms`` / ``jitter_max_ms`` set, the other's default moves to
    make room for it; when both are set, min must not exceed max.
    """

    section_path: ClassVar[str] = "concurrency.csprng_verify"

    jitter_min_ms: int = Field(default=100, ge=0)
    jitter_max_ms: int = Field(default=400, ge=0)
    verify_retries: int = Field(default=2, ge=0)
    verify_retry_delay_ms: int = Field(default=150, ge=0)

    @model_validator(mode="after")
    def _jitter_range(self) -> Self:
        if self.jitter_min_ms <= self.jitter_max_ms:
            return self
        given = self.model_fields_set
        if "jitter_max_ms" not in given:
            set_derived(self, "jitter_max_ms", self.jitter_min_ms)
        elif "jitter_min_ms" not in given:
            set_derived(self, "jitter_min_ms", self.jitter_max_ms)
        else:
            raise InvalidValue(
                f"must not exceed jitter_max_ms ({self.jitter_max_ms})",
                field="jitter_min_ms",
                value=self.jitter_min_ms,
            )
        return self


class ConcurrencyConfig(Section):
    """Which lease strategy to use, and its settings.

    ``clock_skew_margin_seconds``, when not set, follows the visibility timeout in a whole
    config (see :func:`default_skew_margin`); alone, this section defaults it to 2 s.
    """

    section_path: ClassVar[str] = "concurrency"

    strategy: Strategy = "auto"
    csprng_verify: CsprngVerifyConfig = Field(default_factory=CsprngVerifyConfig)
    clock_skew_margin_seconds: float = Field(default=SKEW_MARGIN_SECONDS, ge=0)


class RegistryConfig(Section):
    """Producer and consumer registration."""

    section_path: ClassVar[str] = "registry"

    heartbeat_interval_seconds: float = Field(default=60.0, gt=0)


class NotifyConfig(Section):
    """Change signals: how idle consumers learn of new messages without listing.

    Producers write the next version of the signal log after publishing, naming the topics
    changed in the last seconds, to one of 16 keys (``_notify/r00`` to ``_notify/r15``, in
    turn); a process whose consumers are idle checks the key of the next version with one
    HEAD every
    ``check_interval_seconds`` (a quarter of the shortest of the last three gaps between
    other processes' changes, where that is longer), slowing down to
    ``idle_check_interval_seconds`` after 10 s without a change, GETs it when it changed,
    and lists a topic only when it was named (or something it saw comes due). An idle
    ``poll(wait=)`` looks again at least every ``backfill_interval_seconds``, and a topic
    whose messages come named by signals is listed that often all the same. Nothing depends
    on a signal arriving: each topic the process's consumers consume is listed at least
    every ``sweep_interval_seconds``, one topic at most every ``sweep_pace_seconds`` (so at
    most ``60 / sweep_pace_seconds`` sweep LISTs a minute, whatever the number of topics; a
    topic waits at most ``max(sweep_interval_seconds, topics * sweep_pace_seconds) +
    sweep_pace_seconds``). docs/protocol.md, rule 14. A version is written at most once
    per ``signal_interval_seconds`` by every process together, so each of the 16 keys once
    per 16 intervals (docs/protocol.md, "Request rates"); a process the store refuses a
    signal for its request rate takes 1 s from then on. Where ``n`` processes consume a
    queue (the registry says), each checks every ``n * check_interval_seconds``, up to
    ``shared_check_interval_seconds``: each watches for its own share of new messages
    (docs/protocol.md, "Strategy conditional_write").
    ``slot_signals``: also write the topic's slot ``_notify/{slot}`` and the root
    ``_notify/_``, which is how 0.2.0's consumers learn of new messages (while they run on
    the bucket)."""

    section_path: ClassVar[str] = "notify"

    enabled: bool = True
    check_interval_seconds: float = Field(default=0.1, gt=0)
    idle_check_interval_seconds: float = Field(default=1.0, gt=0)
    backfill_interval_seconds: float = Field(default=60.0, gt=0)
    sweep_interval_seconds: float = Field(default=600.0, gt=0)
    sweep_pace_seconds: float = Field(default=10.0, gt=0)
    signal_interval_seconds: float = Field(default=0.1, gt=0)
    shared_check_interval_seconds: float = Field(default=1.0, gt=0)
    slot_signals: bool = False


class ProducerConfig(Section):
    """How publishes are written. Group commit: concurrent ``publish()`` calls to one topic
    share batch objects (:mod:`pawn_queue._protocol.group_commit`); a lone publish is
    written at once."""

    section_path: ClassVar[str] = "producer"

    group_commit: bool = True
    linger_seconds: float = Field(default=0.0, ge=0, le=1)
    max_batch_messages: int = Field(default=1000, ge=1, le=100_000)
    max_batch_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
