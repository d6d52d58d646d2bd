"""Directories the demos write into, and the one rule for clearing them: never delete what
the demo did not create.

A demo takes a missing or empty directory and marks it with :data:`MARKER`. A later run
clears only a marked directory, and only the entries that demo writes; any other non-empty
directory is refused untouched. Used by ``pawn-queue demo`` and ``examples/orders_pipeline.py``.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

MARKER = ".pawn-queue-demo"
"""The file a demo writes into the directory it takes: only a directory holding it is
cleared by a later run."""


def claim_directory(directory: Path, entries: Sequence[str], owner: str = "the demo") -> None:
    """Make ``directory`` fresh for ``owner``, deleting only the ``entries`` an earlier run
    wrote there. A missing or empty directory is taken and marked; a marked one has those
    entries removed (anything else in it is left alone). Any other directory is refused with
    SystemExit."""
    marker = directory / MARKER
    if not os.path.lexists(directory):
        directory.mkdir(mode=0o700, parents=True)
    elif not directory.is_dir():
        raise SystemExit(f"error: {directory} is not a directory")
    elif _is_file(marker):
        for name in entries:
            _remove(directory / name)
        return
    elif any(directory.iterdir()):
        raise SystemExit(
            f"error: {directory} is not empty and was not made by {owner} (no {MARKER} file); "
            f"{owner} deletes nothing it did not create: give a new or empty directory"
        )
    marker.write_text(
        f"{owner} keeps its files in this directory. A later run of it here deletes only\n"
        f"what it wrote: {', '.join(entries)}.\n"
    )


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove(path: Path) -> None:
    """Remove ``path``; a symbolic link is removed itself, never what it points to."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
