"""Concurrency limits across processes on a local directory (issue 43's target): four
worker processes (``tests/workers/limit_worker.py``) never run more than ``limit`` blocks at
once and do all their work; a holder killed with SIGKILL frees its slot once its lease and
the clock-skew margin ran out, not before, and within the bound docs/concepts/flow-control.md
gives ("When a holder dies")."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import LimitTimeoutError, PawnQueue
from tests.helpers.storage import limit_slots
from tests.helpers.support import sigkill

WORKER = str(Path(__file__).parent / "workers" / "limit_worker.py")
LEASE_SECONDS = 2.0
MARGIN_SECONDS = 0.2


def store_config(tmp_path: Path) -> dict[str, Any]:
    """A local directory, with a short slot lease for the kill test."""
    return {
        "backend": "filesystem",
        "filesystem": {"path": str(tmp_path / "store")},
        "polling": {
            "visibility_timeout_seconds": LEASE_SECONDS,
            "lease_refresh_interval_seconds": 0.5,
        },
        "concurrency": {"clock_skew_margin_seconds": MARGIN_SECONDS},
    }


async def worker(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, WORKER, *args, stdout=asyncio.subprocess.PIPE
    )


async def test_four_processes_never_run_more_than_the_limit(tmp_path: Path) -> None:
    config = json.dumps(store_config(tmp_path))
    counter = tmp_path / "counter.json"
    counter.write_text("{}")
    tasks, items = 4, 5
    workers = [
        await worker("work", config, "api", "3", str(tasks), str(items), str(counter))
        for _ in range(4)
    ]
    try:
        async with asyncio.timeout(240):
            codes = [await process.wait() for process in workers]
    finally:
        for process in workers:
            if process.returncode is None:
                sigkill(process)
                await process.wait()
    assert codes == [0, 0, 0, 0]
    assert json.loads(counter.read_text()) == {"now": 0, "most": 3, "done": 4 * tasks * items}


@pytest.mark.alone  # measures a bound in seconds: not on a machine the other tests load
async def test_a_killed_holders_slot_frees_once_its_lease_ran_out(tmp_path: Path) -> None:
    config = store_config(tmp_path)
    holder = await worker("hold", json.dumps(config), "api", "1")
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 60) == b"holding 0\n"
        async with PawnQueue.from_config(config) as pq:
            # While the holder lives, its refreshes keep the slot beyond one lease.
            with pytest.raises(LimitTimeoutError):
                async with pq.concurrency_limit("api", 1, timeout=LEASE_SECONDS + 1):
                    pytest.fail("took the slot of a live holder")
            sigkill(holder)
            await holder.wait()
            killed_at = time.time()
            last_write = (await limit_slots(pq.store, "api", 1))[0]
            async with pq.concurrency_limit("api", 1, timeout=30):
                taken_at = time.time()
    finally:
        sigkill(holder)
        await holder.wait()
    # Never before the lease the holder last wrote, and the margin, ran out; within the
    # documented bound (lease + margin after the death), a waiter's pause and some slack.
    assert taken_at > (last_write.expires.timestamp() + MARGIN_SECONDS)
    assert taken_at - killed_at < LEASE_SECONDS + MARGIN_SECONDS + 3.0
