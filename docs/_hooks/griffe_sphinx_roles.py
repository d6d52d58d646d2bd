"""A griffe extension for the docs site's API reference (mkdocs.yml loads it): the
docstrings' Sphinx roles (``:class:`~pawn_queue.x.Y```, ``:meth:`...```) become code that
links to the object's entry when the site has one, and ``::`` before a literal block
becomes ``:``. The docstrings themselves stay as they are."""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>[a-z]+):`(?P<tilde>~?)(?P<target>[^`]+)`")
CALLABLE_ROLES = frozenset({"func", "meth"})


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as written in ``obj``'s docstring (its own name, a
    dotted path, or a name in scope), or ``target`` unchanged."""
    if target.startswith("pawn_queue"):
        return target
    head, _, rest = target.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            path = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            scope = scope.parent
            continue
        return f"{path}.{rest}" if rest else path
    return target


def convert(text: str, obj: griffe.Object) -> str:
    def role(match: re.Match[str]) -> str:
        target = match["target"].strip()
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        if match["role"] in CALLABLE_ROLES:
            shown += "()"
        identifier = html.escape(_resolve(obj, target), quote=True)
        return (
            f'<autoref identifier="{identifier}" optional>'
            f"<code>{html.escape(shown)}</code></autoref>"
        )

    text = ROLE.sub(role, text)
    # reST's "text::" before an indented block: Markdown shows the block as code already.
    text = re.sub(r"(?m)^[ \t]*::[ \t]*$", "", text)
    return re.sub(r"(?m)(\S)::[ \t]*$", r"\1:", text)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()

        def walk(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj)
            for member in obj.members.values():
                if not member.is_alias:
                    walk(member)  # type: ignore[arg-type]

        walk(pkg)
