"""Handlers ``bench/handlers/worker.py`` runs with ``pawn-queue worker`` and in-process."""

from __future__ import annotations

import sys
import time
from typing import Any


def spin(payload: dict[str, Any]) -> None:
    """``payload["spin"]`` seconds of pure Python; prints ``start end`` (perf_counter is
    per process: wall-clock ``time.time()`` here, to compare processes)."""
    start = time.time()
    deadline = time.perf_counter() + float(payload["spin"])
    while time.perf_counter() < deadline:
        pass
    sys.stdout.write(f"{start:.6f} {time.time():.6f}\n")
    sys.stdout.flush()


async def noop(payload: Any) -> None:
    """Nothing: the worker acks on return."""
