"""The ``PAWNQUEUE_*`` variables as a Markdown page, generated from the config model:
``python -m tests.helpers.environment_table > docs/environment.md`` (a test checks the
page is up to date)."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import SecretStr
from pydantic_core import PydanticUndefined

from pawn_queue._internal.config_sources import model_class_of
from pawn_queue.config import ENV_ALIASES, ENV_NAMES, URL_ENV_VAR, PawnQueueConfig


def _field(path: str) -> Any:
    model: Any = PawnQueueConfig
    *sections, name = path.split(".")
    for section in sections:
        model = model_class_of(model.model_fields[section].annotation)
    return model.model_fields[name]


def _type(annotation: Any) -> str:
    args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    if all(isinstance(a, str) for a in args):
        return " \\| ".join(f"`{a}`" for a in args)  # a Literal's values
    names = []
    for arg in args:
        if arg is SecretStr:
            names.append("secret")
        else:
            names.append(getattr(arg, "__name__", str(arg)))
    return " \\| ".join(names)


def _default(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else "(section)"
    if field.default is None:
        return "none"
    return '`""`' if field.default == "" else f"`{field.default}`"


def environment_table() -> str:
    aliases: dict[str, list[str]] = {}
    for alias, path in ENV_ALIASES.items():
        aliases.setdefault(path, []).append(alias)
    lines = [
        "# Environment variables",
        "",
        "Every configuration key has a variable, `PAWNQUEUE_` and its path in capitals with",
        "`_` for `.`; older names are still read (a variable and its older name set to",
        "different values are refused). `PAWNQUEUE_URL` selects the store by URL, and the",
        "variables refine it. Generated from the configuration model",
        "(`python -m tests.helpers.environment_table`).",
        "",
        "| variable | key | type | default | also read as |",
        "|---|---|---|---|---|",
        f"| `{URL_ENV_VAR}` | a store URL | string | none | |",
    ]
    for name, path in ENV_NAMES.items():
        field = _field(path)
        also = ", ".join(f"`{alias}`" for alias in aliases.get(path, []))
        lines.append(
            f"| `{name}` | `{path}` | {_type(field.annotation)} | {_default(field)} | {also} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(environment_table(), end="")
