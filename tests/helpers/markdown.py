"""The fenced blocks of the project's Markdown (README.md and docs/), for the tests that run
or check them as the docs give them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")


@dataclass(frozen=True)
class Fenced:
    """One fenced block: where it opens, its language (lower case; "" if none), its text
    with the fence's indentation taken off, and the last non-blank line before it."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    before: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def fenced_blocks(path: Path) -> list[Fenced]:
    """The file's fenced blocks, in tabs and admonitions too (indented fences)."""
    blocks: list[Fenced] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        indent, ticks, start = match["indent"], match["ticks"], index
        index += 1
        body: list[str] = []
        while index < len(lines) and not re.match(
            rf"^{re.escape(indent)}{re.escape(ticks)}\s*$", lines[index]
        ):
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            index += 1
        index += 1  # the closing fence
        before = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        text = "\n".join(body) + "\n"
        blocks.append(Fenced(path, start + 1, match["lang"].lower(), text, before))
    return blocks
