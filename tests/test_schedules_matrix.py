"""Schedules on every store of the matrix: three runners, each with its own client of the
store, fire each tick of an ``every=1`` schedule once; a store without conditional writes
(s3rver) refuses to run them, since there each tick would fire once per runner."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from pawn_queue import ConfigError, PawnQueue
from tests.helpers.stores import STORE_MATRIX

TICKS = 5


@pytest.fixture(params=STORE_MATRIX)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_three_runners_fire_each_tick_once(
    backend: str, queue_config: dict[str, Any]
) -> None:
    queues = [await PawnQueue.from_config(queue_config) for _ in range(3)]
    runners: list[asyncio.Task[None]] = []
    try:
        for pq in queues:
            await pq.setup()
        admin = queues[0]
        await admin.create_topic("jobs")
        await admin.create_schedule("tick", "jobs", every=1)
        if backend == "s3-s3rver":
            with pytest.raises(ConfigError, match="conditional writes"):
                await asyncio.wait_for(admin.run_schedules(), 30)
            return
        runners = [asyncio.create_task(pq.run_schedules()) for pq in queues]
        consumer = await admin.register_consumer("c", ["jobs"])
        ticks: Counter[datetime] = Counter()
        async with asyncio.timeout(120):
            while len(ticks) < TICKS + 1:
                for message in await consumer.poll(wait=1.0):
                    ticks[datetime.fromisoformat(message.attributes["schedule_time"])] += 1
                    await message.ack()
        for runner in runners:
            runner.cancel()
        # What the runners published up to their stop is all in the topic now.
        while messages := await consumer.poll(wait=1.0):
            for message in messages:
                ticks[datetime.fromisoformat(message.attributes["schedule_time"])] += 1
                await message.ack()
        assert [tick for tick, count in ticks.items() if count > 1] == []
        first, last = min(ticks), max(ticks)
        assert len(ticks) == (last - first).total_seconds() + 1  # none left out
    finally:
        for runner in runners:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        for pq in queues:
            await pq.teardown()
