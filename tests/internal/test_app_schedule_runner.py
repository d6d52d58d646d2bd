"""The runner an App serves beside its subscribers (pawn_queue.app._schedules)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pawn_queue import PawnQueue
from pawn_queue.app._schedules import run_schedules
from pawn_queue.config import PawnQueueConfig


async def test_on_a_store_without_conditional_writes_it_says_so_once_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not restarted every minute with a traceback: it can never run there."""
    config = PawnQueueConfig.from_url("memory://", concurrency={"strategy": "csprng_verify"})
    async with PawnQueue(config) as pq:
        with caplog.at_level(logging.ERROR, logger="pawn_queue.app"):
            await asyncio.wait_for(run_schedules(pq, "app"), 10)
    [record] = [r for r in caplog.records if r.name == "pawn_queue.app"]
    assert "schedules are not run" in record.getMessage()
    assert "conditional writes" in record.getMessage()
