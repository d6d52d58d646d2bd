"""MkDocs hooks of the docs site (mkdocs.yml, ``hooks:``).

Lists right after a paragraph line: GitHub (CommonMark) starts a list there, Python-Markdown
needs a blank line first and would run the items into the paragraph. CHANGELOG.md (included
by docs/changelog.md) and pages written for GitHub too are written the CommonMark way, so a
blank line is added before such a list, outside code blocks, once snippets are included.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ITEM = re.compile(r"^ {0,3}(?:[-*+]|\d{1,9}[.)])\s+\S")
NOT_A_PARAGRAPH = re.compile(r"^\s*(?:#|\||<|>|!!!|\?\?\?|===|-{3,}\s*$|\*{3,}\s*$)")


def separate_lists(markdown: str) -> str:
    out: list[str] = []
    fence: str | None = None
    in_list = False
    for line in markdown.split("\n"):
        match = FENCE.match(line)
        if fence is not None:
            if match and match.group(1).startswith(fence):
                fence = None
            out.append(line)
            continue
        if match:
            fence = match.group(1)
            out.append(line)
            continue
        previous = out[-1] if out else ""
        if ITEM.match(line):
            if previous.strip() and not in_list and not NOT_A_PARAGRAPH.match(previous):
                out.append("")
            in_list = True
        elif not line.strip():
            pass  # a blank line: a list may go on after it (indented continuation)
        elif not line.startswith((" ", "\t")) and not previous.strip():
            in_list = False  # a new block at the margin after a blank line
        out.append(line)
    return "\n".join(out)


class _SeparateLists(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return separate_lists("\n".join(lines)).split("\n")


class SeparateLists(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # After pymdownx.snippets (32) has included files, before everything else.
        md.preprocessors.register(_SeparateLists(md), "separate_lists", 31)


def on_config(config: Any, **kwargs: Any) -> Any:
    config.markdown_extensions.append(SeparateLists())
    return config
