"""Raw configuration input: store URLs, YAML files, text values, and error messages.

Nothing here knows the config models; :mod:`pawn_queue.config` passes in what it needs.
Every failure is a :class:`~pawn_queue.exceptions.ConfigError` whose text never contains a
secret: values under a key naming a secret, key, token or password are not shown.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import ErrorDetails

from pawn_queue.exceptions import ConfigError

URL_SCHEMES = ("s3", "file", "memory", "az")
URL_FORMS = (
    "s3://bucket/optional/prefix?endpoint_url=..., file:///abs/dir, file://./rel/dir, "
    "memory://[name], az://container/optional/prefix?account_name=..."
)
URL_BACKENDS = {"s3": "s3", "az": "azure"}
"""The store of each scheme whose URL takes query parameters (its config section's keys)."""
CREDENTIALS_HINT = (
    "put credentials in the config (s3.aws_access_key_id, s3.aws_secret_access_key) "
    "or in PAWNQUEUE_S3_AWS_ACCESS_KEY_ID / PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY"
)
AZURE_CREDENTIALS_HINT = (
    "put the account key in the config (azure.account_key) or in PAWNQUEUE_AZURE_ACCOUNT_KEY"
)
_HINTS = {"s3": CREDENTIALS_HINT, "az": AZURE_CREDENTIALS_HINT}
_SECRET_WORDS = ("secret", "key", "token", "password")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class InvalidValue(ValueError):
    """Raised inside a model validator: which field (relative to the model) is wrong and why.

    ``value`` is shown in the final message unless ``show_value`` is false or the path names
    a secret. Pydantic's own ``input`` is not used for these errors: for a model-level check
    it is the whole section, secrets included.
    """

    def __init__(
        self, problem: str, *, field: str = "", value: object = None, show_value: bool = True
    ) -> None:
        super().__init__(problem)
        self.problem = problem
        self.field = field
        self.value = value
        self.show_value = show_value


def is_secret_path(path: str) -> bool:
    """Whether a dotted key path may hold a credential, so its value must never be shown."""
    lowered = path.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def parse_bool(text: str) -> bool:
    """``true/false/1/0/yes/no`` in any case; anything else raises ValueError."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)} (any case)")


def model_class_of(annotation: Any) -> type[BaseModel] | None:
    """The model class in ``annotation`` (``X`` or ``X | None``), if any."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


# --- nested dicts -------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """Models and mappings as nested plain dicts; models keep only the fields that were set."""
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_unset=True)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    return value


def deep_merge(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """``low`` overlaid with ``high``: nested mappings merge, anything else is replaced."""
    merged: dict[str, Any] = plain(low)
    for key, value in plain(high).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``path="a.b"``, creating sections as needed."""
    *sections, key = path.split(".")
    for section in sections:
        data = data.setdefault(section, {})
    data[key] = value


def has_path(data: Mapping[str, Any], path: str) -> bool:
    """Whether ``path`` ("a.b") is present in nested ``data`` with a value other than None."""
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, Mapping) or node.get(key) is None:
            return False
        node = node[key]
    return True


def leaf_paths(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every dotted path to a non-mapping value in ``data``."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from leaf_paths(value, f"{path}.")
        else:
            yield path


# --- files and URLs ----------------------------------------------------------------------


def read_yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The top-level mapping of a YAML file (an empty file is an empty mapping)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {file}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # Only the position and the problem: YAML's context snippet may quote a secret.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot parse"
        raise ConfigError(f"invalid YAML in {file}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{file} must hold a mapping (s3:, polling:, ...), not a YAML list or scalar"
        )
    return data


def parse_store_url(url: str, query_keys: Mapping[str, Collection[str]]) -> dict[str, Any]:
    """A store URL as ``{"backend": ..., <backend>: {...}}`` with query values as raw strings.

    Forms: ``s3://bucket/optional/prefix?key=value``, ``az://container/optional/prefix?key=value``,
    ``file:///abs/dir``, ``file://./rel/dir``, ``file://localhost/abs``, ``memory://`` and
    ``memory://name``. ``query_keys``: the parameters each of ``s3`` and ``az`` accepts. The
    URL itself never appears in an error: it may carry credentials.
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        raise ConfigError(f"not a valid store URL; expected one of: {URL_FORMS}") from None
    scheme = parts.scheme.lower()
    if scheme not in URL_SCHEMES:
        shown = f"scheme {scheme!r}" if scheme else "no scheme"
        raise ConfigError(
            f"unsupported store URL ({shown}); allowed schemes: {', '.join(URL_SCHEMES)} "
            f"({URL_FORMS})"
        )
    if "@" in parts.netloc:
        if scheme in _HINTS:
            raise ConfigError(
                f"credentials are not allowed in an {scheme}:// URL: {_HINTS[scheme]}"
            )
        raise ConfigError(f"user info ('...@') is not allowed in a {scheme}:// URL")
    if parts.fragment:
        raise ConfigError(f"a {scheme}:// URL cannot have a '#' fragment")
    query = _query(parts.query, scheme, query_keys.get(scheme, ()))
    netloc = unquote(parts.netloc)
    path = unquote(parts.path)

    if scheme in URL_BACKENDS:
        backend = URL_BACKENDS[scheme]
        name = "bucket" if scheme == "s3" else "container"
        if not netloc:
            raise ConfigError(
                f"an {scheme}:// URL needs a {name}: {scheme}://{name}/optional/prefix"
            )
        section: dict[str, Any] = {f"{name}_name": netloc, **query}
        if path.strip("/"):
            section["prefix"] = path
        return {"backend": backend, backend: section}
    if scheme == "file":
        return {"backend": "filesystem", "filesystem": {"path": _file_path(netloc, path)}}
    if path not in ("", "/"):
        raise ConfigError("a memory URL is memory:// or memory://name, with no path")
    return {"backend": "memory", "memory": {"name": netloc}}


def _file_path(netloc: str, path: str) -> str:
    if netloc.lower() in ("", "localhost"):
        if not path:
            raise ConfigError(
                "a file:// URL needs a directory: file:///abs/dir or file://./rel/dir"
            )
        return path
    # Any other host part starts a relative path: file://./q, file://../q, file://queue/dir.
    return netloc + path


def _query(query: str, scheme: str, allowed: Collection[str]) -> dict[str, str]:
    pairs = parse_qsl(query, keep_blank_values=True)
    keys = [key for key, _ in pairs]
    if any(is_secret_path(key) for key in keys):
        hint = _HINTS.get(scheme, CREDENTIALS_HINT)
        raise ConfigError(f"credentials are not allowed in a store URL: {hint}")
    unknown = sorted({key for key in keys if key not in allowed})
    if unknown:
        accepted = ", ".join(allowed) if allowed else "none"
        raise ConfigError(
            f"unknown {scheme}:// URL parameter(s): {', '.join(unknown)}; allowed: {accepted}"
        )
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ConfigError(
            f"{scheme}:// URL parameter(s) given more than once: {', '.join(repeated)}"
        )
    return dict(pairs)


# --- validation errors --------------------------------------------------------------------


@contextmanager
def config_errors(
    root: type[BaseModel],
    *,
    prefix: str = "",
    sources: Mapping[str, str] | None = None,
    origin: str | None = None,
) -> Iterator[None]:
    """Turn a pydantic ValidationError raised inside the block into a ConfigError.

    ``root`` is the model being validated, ``prefix`` its path in the whole config (``"s3"``),
    ``sources`` maps a path to where its value came from (``"PAWNQUEUE_S3_REGION"``),
    ``origin`` names the input (a file) for the first line of the message.
    """
    try:
        yield
    except ValidationError as exc:
        # "from None": the ValidationError's own text shows raw input, secrets included.
        raise _to_config_error(exc, root, prefix, sources or {}, origin) from None


def _to_config_error(
    exc: ValidationError,
    root: type[BaseModel],
    prefix: str,
    sources: Mapping[str, str],
    origin: str | None,
) -> ConfigError:
    problems = [_describe(error, root, prefix, sources) for error in exc.errors(include_url=False)]
    head = "invalid pawn-queue configuration" + (f" in {origin}" if origin else "")
    if len(problems) == 1:
        return ConfigError(f"{head}: {problems[0]}")
    return ConfigError(f"{head} ({len(problems)} problems):\n  - " + "\n  - ".join(problems))


def _describe(
    error: ErrorDetails, root: type[BaseModel], prefix: str, sources: Mapping[str, str]
) -> str:
    loc = [str(part) for part in error["loc"]]
    cause = error.get("ctx", {}).get("error")
    value: object = error.get("input")
    show_value = True
    if isinstance(cause, InvalidValue):
        loc += cause.field.split(".") if cause.field else []
        problem, value, show_value = cause.problem, cause.value, cause.show_value
    elif error["type"] == "extra_forbidden":
        problem = _unknown_key(root, loc)
    elif error["type"] == "missing":
        problem, show_value = "required", False
    elif error["type"] == "frozen_instance":
        problem, show_value = "config objects are immutable; build a new one", False
    else:
        problem = error["msg"].removeprefix("Value error, ")
    path = ".".join([prefix, *loc] if prefix else loc)
    where = f"{path} (from {sources[path]})" if path in sources else path or "config"
    if show_value and not is_secret_path(path) and not isinstance(value, SecretStr):
        shown = repr(value)
        problem += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    return f"{where}: {problem}"


def _unknown_key(root: type[BaseModel], loc: list[str]) -> str:
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model else None
        model = model_class_of(field.annotation) if field else None
    if model is None:
        return "unknown key"
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1], allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; allowed: {', '.join(allowed)}"
