"""The docs name each variable by its current name, ``PAWNQUEUE_<SECTION>_<KEY>``: the older
names that the code still reads (``pawn_queue.config.ENV_ALIASES``) appear only where they are
documented as older names."""

from __future__ import annotations

import re
from pathlib import Path

from pawn_queue.config import ENV_ALIASES, ENV_NAMES

REPO = Path(__file__).resolve().parents[2]

# Where the older names are documented as such, and how: nowhere else in those files either.
OLDER_NAMES_DOCUMENTED = {
    # The table's last column, "also read as" (generated: tests/helpers/environment_table.py).
    "docs/environment.md": re.compile(r"(?m)(?<=\| )`[A-Z0-9_]+`(?= \|$)"),
    # "- variable: `NAME` (also read as `OLDER`)" (generated: tests/helpers/config_reference.py).
    "docs/configuration/reference.md": re.compile(r"\(also read as `[A-Z0-9_]+`\)"),
    # "The names of pawn-queue 0.1 are read too (`...`, ...)".
    "docs/configuration/index.md": re.compile(
        r"The names of pawn-queue 0\.1 are\s+read too \([^)]*\)"
    ),
}


def texts() -> list[Path]:
    paths = [REPO / "README.md", REPO / "config.example.yaml"]
    paths += sorted((REPO / "docs").rglob("*.md"))
    paths += sorted(
        path for path in (REPO / "examples").rglob("*") if path.suffix in {".py", ".md", ".yaml"}
    )
    return paths


def older_names_in(text: str) -> list[tuple[int, str]]:
    """(line, name) of each older name in ``text`` (a whole name: not the start of another)."""
    found = []
    for name in ENV_ALIASES:
        for match in re.finditer(rf"(?<![A-Z0-9_]){name}(?![A-Z0-9_])", text):
            found.append((text.count("\n", 0, match.start()) + 1, name))
    return sorted(found)


def test_the_older_names_are_the_codes_and_not_current_names() -> None:
    assert "PAWNQUEUE_S3_ACCESS_KEY" in ENV_ALIASES
    assert "PAWNQUEUE_S3_AWS_ACCESS_KEY_ID" in ENV_NAMES
    assert not set(ENV_ALIASES) & set(ENV_NAMES)


def test_the_docs_use_the_current_names() -> None:
    used = []
    for path in texts():
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(REPO))
        if where in OLDER_NAMES_DOCUMENTED:
            # Blank out (keeping the lines) where the file documents the older names.
            text = OLDER_NAMES_DOCUMENTED[where].sub(
                lambda match: re.sub(r"[^\n]", " ", match[0]), text
            )
        used += [f"{where}:{line}: {name}" for line, name in older_names_in(text)]
    assert used == [], "name the variables by ENV_NAMES (the current names)"


def test_the_places_that_document_the_older_names_still_do() -> None:
    """Each allowed place still documents older names: an allowance that matches nothing
    would let an older name in unnoticed there."""
    for where, pattern in OLDER_NAMES_DOCUMENTED.items():
        text = (REPO / where).read_text(encoding="utf-8")
        spans = "\n".join(match[0] for match in pattern.finditer(text))
        assert older_names_in(spans), where
    assert "| also read as |" in (REPO / "docs/environment.md").read_text(encoding="utf-8")
