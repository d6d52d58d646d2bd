"""Configuration: the README's YAML keys, ``PAWNQUEUE_*`` variables and store URLs.

Entry points, all raising :class:`~pawn_queue.exceptions.ConfigError` (never pydantic's
ValidationError) with the key path, the bad value (never a secret) and what is allowed:

- :meth:`PawnQueueConfig.from_dict` / :meth:`~PawnQueueConfig.from_yaml`: that input only.
- :meth:`PawnQueueConfig.from_env`: ``PAWNQUEUE_*`` variables over (or under) a base config.
- :meth:`PawnQueueConfig.from_url`: a store URL; keyword sections and then the environment
  fill the rest (credentials come from the config or ``PAWNQUEUE_S3_AWS_ACCESS_KEY_ID`` /
  ``PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY`` / ``PAWNQUEUE_AZURE_ACCOUNT_KEY``, never from the URL).
- :func:`load_config`: what ``PawnQueue.from_config`` takes; a YAML path or a dict gets the
  environment applied on top (the README's "Environment variables"), a
  :class:`PawnQueueConfig` is used as it is.

Config objects are immutable, so a checked combination (rule 8) cannot be broken later. The
sections (``S3Config``, ``PollingConfig``...) are defined in
:mod:`pawn_queue._internal.config_sections` and importable from here.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any, Final, Self

from pydantic import BaseModel, Field, model_validator
from pydantic.fields import FieldInfo

from pawn_queue._internal.config_sections import (
    BACKENDS,
    AzureConfig,
    Backend,
    ConcurrencyConfig,
    CsprngVerifyConfig,
    FilesystemConfig,
    MemoryConfig,
    NotifyConfig,
    PollingConfig,
    ProducerConfig,
    RegistryConfig,
    S3Config,
    Section,
    Strategy,
    default_skew_margin,
    set_derived,
    shown_setting,
)
from pawn_queue._internal.config_sources import (
    InvalidValue,
    config_errors,
    deep_merge,
    has_path,
    is_secret_path,
    leaf_paths,
    model_class_of,
    parse_bool,
    parse_store_url,
    plain,
    read_yaml_mapping,
    set_path,
)
from pawn_queue.exceptions import ConfigError

__all__ = [
    "AZURE_URL_KEYS",
    "BACKENDS",
    "ENV_VARS",
    "OTHER_ENV_VARS",
    "S3_URL_KEYS",
    "URL_ENV_VAR",
    "AzureConfig",
    "Backend",
    "ConcurrencyConfig",
    "CsprngVerifyConfig",
    "FilesystemConfig",
    "MemoryConfig",
    "NotifyConfig",
    "PawnQueueConfig",
    "PollingConfig",
    "ProducerConfig",
    "RegistryConfig",
    "S3Config",
    "Strategy",
    "load_config",
    "parse_url",
]


class PawnQueueConfig(Section):
    """The whole configuration. ``backend`` picks which store section is used.

    Without ``backend``, the one store section given decides (the README's YAML, with only
    ``s3:``, is an s3 config); with none, it is ``s3``.
    """

    backend: Backend = "s3"
    s3: S3Config | None = None
    azure: AzureConfig | None = None
    filesystem: FilesystemConfig | None = None
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    polling: PollingConfig = Field(default_factory=PollingConfig)
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    producer: ProducerConfig = Field(default_factory=ProducerConfig)

    @model_validator(mode="before")
    @classmethod
    def _choose_backend(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or data.get("backend") is not None:
            return data
        stores = _given_stores(data)
        if len(stores) > 1:
            raise InvalidValue(_ambiguous_stores(stores), field="backend", show_value=False)
        return {**data, "backend": stores[0] if stores else "s3"}

    @model_validator(mode="after")
    def _check_combination(self) -> Self:
        if self.backend == "s3" and self.s3 is None:
            raise InvalidValue(
                "backend 's3' needs an s3 section with bucket_name "
                "(in the config, PAWNQUEUE_S3_BUCKET_NAME or an s3:// URL)",
                field="s3",
                show_value=False,
            )
        if self.backend == "azure" and self.azure is None:
            raise InvalidValue(
                "backend 'azure' needs an azure section with container_name "
                "(in the config, PAWNQUEUE_AZURE_CONTAINER_NAME or an az:// URL)",
                field="azure",
                show_value=False,
            )
        if self.backend == "filesystem" and self.filesystem is None:
            raise InvalidValue(
                "required for backend 'filesystem' "
                "(in the config, PAWNQUEUE_FILESYSTEM_PATH or a file:// URL)",
                field="filesystem.path",
                show_value=False,
            )
        visibility = self.polling.visibility_timeout_seconds
        if "clock_skew_margin_seconds" not in self.concurrency.model_fields_set:
            margin = default_skew_margin(visibility)
            if margin != self.concurrency.clock_skew_margin_seconds:
                concurrency = self.concurrency.model_copy()  # may be the caller's object
                set_derived(concurrency, "clock_skew_margin_seconds", margin)
                set_derived(self, "concurrency", concurrency)
        elif self.concurrency.clock_skew_margin_seconds >= visibility:
            # Expiry is judged on other machines' clocks; a margin this large means a lease
            # abandoned by a crashed consumer would never be taken over.
            shown = shown_setting(self.polling, "visibility_timeout_seconds")
            raise InvalidValue(
                f"must be less than polling.visibility_timeout_seconds ({shown})",
                field="concurrency.clock_skew_margin_seconds",
                value=self.concurrency.clock_skew_margin_seconds,
            )
        return self

    def consumer_polling(self, visibility_timeout: float) -> PollingConfig:
        """The polling settings of a consumer whose leases last ``visibility_timeout`` seconds
        (``register_consumer(..., visibility_timeout=...)``).

        A lease refresh interval that was not set follows that timeout, as it follows
        ``polling.visibility_timeout_seconds``; one that was set, and the clock-skew margin
        (shared by every consumer), must be shorter. Raises ConfigError.
        """
        polling = self.polling
        floors = [
            ("concurrency.clock_skew_margin_seconds", self.concurrency.clock_skew_margin_seconds)
        ]
        if "lease_refresh_interval_seconds" in polling.model_fields_set:
            floors.insert(
                0,
                ("polling.lease_refresh_interval_seconds", polling.lease_refresh_interval_seconds),
            )
        for path, floor in floors:
            if not visibility_timeout > floor:  # also refuses NaN
                raise ConfigError(
                    f"visibility_timeout: got {visibility_timeout!r}, must be greater than "
                    f"{path} ({floor:g})"
                )
        given = {name: getattr(polling, name) for name in polling.model_fields_set}
        return PollingConfig(**{**given, "visibility_timeout_seconds": visibility_timeout})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PawnQueueConfig:
        """Validate a mapping shaped like the YAML file. The environment is not read."""
        return _validate(data)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> PawnQueueConfig:
        """Load a YAML file shaped like ``config.example.yaml``. The environment is not read."""
        return _validate(read_yaml_mapping(path), origin=os.fspath(path))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        environ: Mapping[str, str] | None = None,
        **sections: Mapping[str, Any],
    ) -> PawnQueueConfig:
        """The store from a URL (see :func:`parse_url`), other sections from keywords.

        ``from_url("s3://b?endpoint_url=http://127.0.0.1:8333", polling={"interval_seconds": 1})``.
        ``PAWNQUEUE_*`` variables (``environ``, default ``os.environ``) fill what the URL and
        the sections leave unset, credentials in particular.
        """
        return _with_env(deep_merge(parse_url(url), sections), environ, override=False)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        base: PawnQueueConfig | Mapping[str, Any] | None = None,
        *,
        override: bool = True,
    ) -> PawnQueueConfig:
        """``base`` (default: nothing) combined with the ``PAWNQUEUE_*`` variables of ``environ``.

        ``override=True``: variables win over ``base``; ``False``: they only fill what ``base``
        leaves unset. Variables in ``ENV_VARS``; ``PAWNQUEUE_URL`` gives a store URL, whose
        values the specific variables override. Empty variables count as unset; any other
        ``PAWNQUEUE_*`` name (but ``OTHER_ENV_VARS``) raises ConfigError, as a YAML typo does.

        The store is chosen by ``PAWNQUEUE_BACKEND`` or ``PAWNQUEUE_URL`` and by ``base``
        (``override`` says which comes first), else ``filesystem`` when
        ``PAWNQUEUE_FILESYSTEM_PATH`` is set, else ``azure`` when
        ``PAWNQUEUE_AZURE_CONTAINER_NAME`` is, else ``s3``. Variables of the other stores
        are ignored, so unrelated credentials in the environment do no harm.
        """
        return _with_env(plain(base or {}), environ, override=override)


# --- environment --------------------------------------------------------------------------


def config_paths(model: type[BaseModel] = PawnQueueConfig, prefix: str = "") -> list[str]:
    """Every key of the configuration, as a dotted path (``polling.interval_seconds``)."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        section = model_class_of(field.annotation)
        if section is None:
            paths.append(prefix + name)
        else:
            paths += config_paths(section, f"{prefix}{name}.")
    return paths


def env_name(path: str) -> str:
    """The variable of a key: ``PAWNQUEUE_`` and its path in capitals, ``.`` as ``_``."""
    return "PAWNQUEUE_" + path.replace(".", "_").upper()


ENV_NAMES: Final[Mapping[str, str]] = {env_name(path): path for path in config_paths()}
"""A variable for every key: ``PAWNQUEUE_<SECTION>_<KEY>``."""

ENV_ALIASES: Final[Mapping[str, str]] = {
    # The names of pawn-queue 0.1.x's README (and of 0.2 before every key had one).
    "PAWNQUEUE_S3_ACCESS_KEY": "s3.aws_access_key_id",
    "PAWNQUEUE_S3_SECRET_KEY": "s3.aws_secret_access_key",
    "PAWNQUEUE_S3_SESSION_TOKEN": "s3.aws_session_token",
    "PAWNQUEUE_S3_REGION": "s3.region_name",
    "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "polling.visibility_timeout_seconds",
    "PAWNQUEUE_POLLING_LEASE_REFRESH_INTERVAL": "polling.lease_refresh_interval_seconds",
    "PAWNQUEUE_CSPRNG_JITTER_MIN_MS": "concurrency.csprng_verify.jitter_min_ms",
    "PAWNQUEUE_CSPRNG_JITTER_MAX_MS": "concurrency.csprng_verify.jitter_max_ms",
    "PAWNQUEUE_CSPRNG_VERIFY_RETRIES": "concurrency.csprng_verify.verify_retries",
    "PAWNQUEUE_CSPRNG_RETRY_DELAY_MS": "concurrency.csprng_verify.verify_retry_delay_ms",
    "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL": "registry.heartbeat_interval_seconds",
    "PAWNQUEUE_CLOCK_SKEW_MARGIN_SECONDS": "concurrency.clock_skew_margin_seconds",
}
"""Older names, still read: each sets the same key as its ``PAWNQUEUE_<SECTION>_<KEY>``."""

ENV_VARS: Final[Mapping[str, str]] = {**ENV_NAMES, **ENV_ALIASES}
"""Every ``PAWNQUEUE_*`` variable read, and the config path it sets (docs are checked against
it)."""

URL_ENV_VAR: Final = "PAWNQUEUE_URL"
"""Selects the store by URL (see :func:`parse_url`); the variables above override its values."""

OTHER_ENV_VARS: Final[frozenset[str]] = frozenset(
    {
        # The Python of pawn-queue 0.1.3 for the compatibility tests (set by `make pytest`).
        "PAWNQUEUE_COMPAT_PYTHON",
        # The token of `pawn-queue dashboard` (its --token).
        "PAWNQUEUE_DASHBOARD_TOKEN",
    }
)
"""``PAWNQUEUE_*`` names read by tools of the project, not by the configuration. Any other
name that is neither in ``ENV_VARS`` nor ``URL_ENV_VAR`` is refused as a likely typo."""

# Keys an s3:// URL accepts: everything but what the URL's own parts give and the credentials.
S3_URL_KEYS: Final[tuple[str, ...]] = tuple(
    name
    for name in S3Config.model_fields
    if name not in ("bucket_name", "prefix") and not is_secret_path(name)
)
# The same for az:// URLs.
AZURE_URL_KEYS: Final[tuple[str, ...]] = tuple(
    name
    for name in AzureConfig.model_fields
    if name not in ("container_name", "prefix") and not is_secret_path(name)
)


def parse_url(url: str) -> dict[str, Any]:
    """A store URL as a config mapping, e.g. ``{"backend": "s3", "s3": {...}}``.

    ``s3://bucket/optional/prefix?endpoint_url=http://127.0.0.1:8333&region_name=us-east-1``
    (query keys: ``S3_URL_KEYS``), ``az://container/optional/prefix?account_name=myaccount``
    (query keys: ``AZURE_URL_KEYS``), ``file:///abs/dir``, ``file://./rel/dir``,
    ``file://localhost/abs``, ``memory://`` (a fresh store), ``memory://name`` (shared in the
    process). Credentials in the URL are refused.
    """
    if not isinstance(url, str):
        raise ConfigError(f"url: got {type(url).__name__}, must be a store URL string")
    data = parse_store_url(url, {"s3": S3_URL_KEYS, "az": AZURE_URL_KEYS})
    section = data[data["backend"]]
    for key, raw in section.items():
        section[key] = _coerce(f"{data['backend']}.{key}", raw, f"URL parameter {key}")
    return data


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | PawnQueueConfig,
    *,
    environ: Mapping[str, str] | None = None,
) -> PawnQueueConfig:
    """A config from a YAML path, a mapping or a config (what ``PawnQueue.from_config`` takes).

    For a path or a mapping, ``PAWNQUEUE_*`` variables of ``environ`` (default ``os.environ``)
    override its values, as the README documents; pass ``environ={}`` to ignore the
    environment. A :class:`PawnQueueConfig` is returned unchanged.
    """
    if isinstance(source, PawnQueueConfig):
        return source
    if isinstance(source, Mapping):
        return _with_env(plain(source), environ, override=True)
    if isinstance(source, str | os.PathLike):
        data = read_yaml_mapping(source)
        return _with_env(data, environ, override=True, origin=os.fspath(source))
    raise ConfigError(
        f"a config is a YAML file path, a mapping or a PawnQueueConfig, not {type(source).__name__}"
    )


def _validate(
    data: Any, *, sources: Mapping[str, str] | None = None, origin: str | None = None
) -> PawnQueueConfig:
    with config_errors(PawnQueueConfig, sources=sources, origin=origin):
        # Past the model_validate override, so errors carry sources and origin.
        config: PawnQueueConfig = PawnQueueConfig.__pydantic_validator__.validate_python(data)
        return config


def _with_env(
    data: dict[str, Any],
    environ: Mapping[str, str] | None,
    *,
    override: bool,
    origin: str | None = None,
) -> PawnQueueConfig:
    """``data`` and the environment, the environment winning if ``override``."""
    source = os.environ if environ is None else environ
    _refuse_unknown_variables(source)
    env = {
        name: source[name].strip()
        for name in (*ENV_VARS, URL_ENV_VAR)
        if source.get(name, "").strip()
    }
    url_data = None
    if URL_ENV_VAR in env:
        try:
            url_data = parse_url(env[URL_ENV_VAR])
        except ConfigError as exc:
            raise ConfigError(f"{URL_ENV_VAR}: {exc}") from None

    from_data, from_env = _data_backend(data), _env_backend(env, url_data)
    chosen = (from_env or from_data) if override else (from_data or from_env)
    backend = chosen or (
        "filesystem"
        if "PAWNQUEUE_FILESYSTEM_PATH" in env
        else "azure"
        if "PAWNQUEUE_AZURE_CONTAINER_NAME" in env
        else "s3"
    )

    layer: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if url_data is not None and url_data["backend"] == backend:
        layer = {backend: url_data[backend]}
        sources = dict.fromkeys(leaf_paths(layer), URL_ENV_VAR)
    for name, path in ENV_VARS.items():
        store = path.split(".")[0]
        if name not in env or path == "backend" or (store in BACKENDS and store != backend):
            continue
        other = sources.get(path)
        if other is not None and other in ENV_VARS and env[other] != env[name]:
            # A key's variable and its older name, set to different values.
            raise ConfigError(f"{other} and {name} both set {path}, to different values")
        set_path(layer, path, _coerce(path, env[name], name))
        sources[path] = name

    if override:
        merged = deep_merge(data, layer)
    else:
        merged = deep_merge(layer, data)
        sources = {path: name for path, name in sources.items() if not has_path(data, path)}
    merged["backend"] = backend
    return _validate(merged, sources=sources, origin=origin)


def _refuse_unknown_variables(environ: Mapping[str, str]) -> None:
    """A ``PAWNQUEUE_*`` variable no one reads is a typo that would be silently ignored."""
    known = (*ENV_VARS, URL_ENV_VAR)
    unknown = sorted(
        name
        for name, value in environ.items()
        if name.startswith("PAWNQUEUE_")
        and value.strip()
        and name not in known
        and name not in OTHER_ENV_VARS
    )
    if not unknown:
        return
    described = []
    for name in unknown:  # the values are never shown: one may be a secret
        close = difflib.get_close_matches(name, known, n=1)
        described.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise ConfigError(
        f"unknown variable{'s' if len(unknown) > 1 else ''} {', '.join(described)}; "
        "the PAWNQUEUE_* variables are listed in docs/environment.md"
    )


def _data_backend(data: Mapping[str, Any]) -> str | None:
    if data.get("backend") is not None:
        return str(data["backend"])
    stores = _given_stores(data)
    if len(stores) > 1:
        raise ConfigError(f"backend: {_ambiguous_stores(stores)}")
    return stores[0] if stores else None


def _env_backend(env: Mapping[str, str], url_data: Mapping[str, Any] | None) -> str | None:
    named = env.get("PAWNQUEUE_BACKEND")
    if named is not None and named not in BACKENDS:
        raise ConfigError(
            f"PAWNQUEUE_BACKEND: {named!r} is not a backend; allowed: {', '.join(BACKENDS)}"
        )
    from_url = str(url_data["backend"]) if url_data is not None else None
    if named and from_url and named != from_url:
        raise ConfigError(
            f"PAWNQUEUE_BACKEND is {named!r} but PAWNQUEUE_URL selects {from_url!r}; set only one"
        )
    return named or from_url


def _given_stores(data: Mapping[str, Any]) -> list[str]:
    return [name for name in BACKENDS if data.get(name) is not None]


def _ambiguous_stores(stores: list[str]) -> str:
    return f"several store sections ({', '.join(stores)}): set backend to one of them"


def _coerce(path: str, raw: str, label: str) -> Any:
    """Text from a variable or URL for the field at ``path``: booleans parsed, the rest as is."""
    if _field(path).annotation is bool:
        try:
            return parse_bool(raw)
        except ValueError as exc:
            raise ConfigError(f"{label} ({path}): {raw!r} is not a boolean: {exc}") from None
    return raw  # pydantic converts numbers and checks everything, naming ``label``


def _field(path: str) -> FieldInfo:
    model: type[BaseModel] | None = PawnQueueConfig
    *sections, name = path.split(".")
    for section in sections:
        model = model_class_of(model.model_fields[section].annotation) if model else None
    assert model is not None, path
    return model.model_fields[name]
