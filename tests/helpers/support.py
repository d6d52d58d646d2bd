"""Helpers shared by test modules."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pawn_queue import PawnQueue


async def settled(pq: PawnQueue) -> None:
    """Wait for the deletes that follow acks (leases; a finished batch object): they run
    after ``ack()`` returned. The leases kept as tombstones (S3) are deleted now."""
    await pq.runtime.leases.flush_tombstones()  # with the rest of the background work


async def keys_under(pq: PawnQueue, prefix: str) -> list[str]:
    """The keys under ``prefix`` once the deletes that follow past acks landed."""
    await settled(pq)
    return [m.key for m in await pq.store.list(prefix)]


def leftover_temp_files(root: Path) -> list[Path]:
    """The filesystem store's temp files under ``root`` (none once writes are over)."""
    return list((root / ".pawnqueue" / "tmp").iterdir())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)
