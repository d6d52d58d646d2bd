"""A count of blocks running in every process, kept in a JSON file under an fcntl lock, for
the worker processes of the limit tests."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path


def count(counter: Path, step: int) -> None:
    """Add ``step`` to the blocks running now, under the file's lock: ``now``, the ``most``
    at once and the blocks ``done``."""
    with counter.open("r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes
        state = json.loads(file.read() or "{}")
        now = state.get("now", 0) + step
        state = {
            "now": now,
            "most": max(state.get("most", 0), now),
            "done": state.get("done", 0) + (1 if step < 0 else 0),
        }
        file.seek(0)
        file.truncate()
        file.write(json.dumps(state))
