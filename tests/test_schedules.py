"""Schedules through the public API: definitions, their errors, firing (in this process and
in three runner processes at once: each tick once), pause and resume."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import (
    ArgumentError,
    ConfigError,
    Consumer,
    Message,
    PawnQueue,
    PayloadError,
    Schedule,
    ScheduleExistsError,
    ScheduleNotFoundError,
    TopicNotFoundError,
)
from pawn_queue.config import PawnQueueConfig
from tests.helpers.storage import schedule_key, schedule_tick_keys
from tests.helpers.support import poll_count, start_schedule_runner


async def test_create_read_update_and_delete(pq: PawnQueue) -> None:
    await pq.create_topic("reports")
    created = await pq.create_schedule(
        "nightly",
        "reports",
        cron="0 2 * * *",
        payload={"kind": "nightly"},
        attributes={"team": "ops"},
        timezone="Europe/Berlin",
    )
    assert isinstance(created, Schedule)
    assert (created.cron, created.every, created.paused) == ("0 2 * * *", None, False)
    assert await pq.schedule("nightly") == created
    assert [s.name for s in await pq.list_schedules()] == ["nightly"]
    await pq.store.head(schedule_key("nightly"))
    with pytest.raises(ScheduleExistsError, match="nightly"):
        await pq.create_schedule("nightly", "reports", every=60)

    changed = await pq.update_schedule("nightly", every=3600, jitter_seconds=5)
    assert (changed.cron, changed.every, changed.jitter_seconds) == (None, 3600.0, 5.0)
    assert changed.payload == {"kind": "nightly"} and changed.timezone == "Europe/Berlin"
    assert await pq.schedule("nightly") == changed

    stats = await pq.schedule_stats("nightly")
    assert (stats.fired, stats.missed, stats.last_fire_time, stats.paused) == (0, 0, None, False)
    assert stats.next_fire_time is not None and stats.next_fire_time.minute == 0

    await pq.delete_schedule("nightly")
    assert await pq.list_schedules() == []
    for missing in (
        pq.schedule("nightly"),
        pq.delete_schedule("nightly"),
        pq.pause_schedule("nightly"),
        pq.schedule_stats("nightly"),
        pq.trigger_schedule("nightly"),
    ):
        with pytest.raises(ScheduleNotFoundError, match="nightly"):
            await missing


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
async def test_bad_arguments_raise_clear_errors(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    bad: list[tuple[dict[str, Any], str]] = [
        ({"cron": "61 * * * *"}, "not a cron expression: Bad minute"),
        ({"cron": "* * *"}, "not a cron expression"),
        ({"cron": 5}, "cron: got 5"),
        ({"every": 60, "timezone": "Mars/Olympus"}, "'Mars/Olympus' is not a known time zone"),
        ({}, "exactly one of cron"),
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron"),
        ({"every": math.nan}, "every: got nan"),
        ({"every": math.inf}, "every: got inf"),
        ({"every": 0.5}, ">= 1"),
        ({"every": True}, "every: got True"),
        ({"every": 60, "jitter_seconds": math.inf}, "jitter_seconds"),
        ({"every": 60, "catch_up_seconds": -1}, "catch_up_seconds"),
        ({"every": 60, "start": datetime(2026, 1, 1)}, "timezone-aware"),
        (
            {
                "every": 60,
                "start": datetime(2026, 2, 1, tzinfo=UTC),
                "end": datetime(2026, 1, 1, tzinfo=UTC),
            },
            "must be after start",
        ),
    ]
    for options, message in bad:
        with pytest.raises(ArgumentError, match=message):
            await pq.create_schedule("s", "t", **options)
    # Payloads, attributes and names raise what they raise everywhere.
    bad_payloads: list[tuple[dict[str, Any], str]] = [
        ({"every": 60, "attributes": {"schedule": "x"}}, "set by the schedule"),
        ({"every": 60, "attributes": {"n": 1}}, "must map str to str"),
        ({"every": 60, "payload": {"x": math.nan}}, "payload"),
        ({"every": 60, "payload": b"raw"}, "bytes"),
    ]
    for options, message in bad_payloads:
        with pytest.raises(PayloadError, match=message):
            await pq.create_schedule("s", "t", **options)
    for name in ("", "a/b", "_hidden", ".dot", "x" * 129, 7):
        with pytest.raises(ConfigError, match="schedule name"):
            await pq.create_schedule(name, "t", every=60)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="topic name"):
        await pq.create_schedule("s", "a/b", every=60)
    with pytest.raises(TopicNotFoundError):
        await pq.create_schedule("s", "missing", every=60)
    await pq.create_schedule("s", "t", every=60)
    with pytest.raises(ArgumentError, match="not a cron expression"):
        await pq.update_schedule("s", cron="every minute")
    with pytest.raises(TopicNotFoundError):
        await pq.update_schedule("s", topic="missing")
    assert (await pq.schedule("s")).every == 60.0
    assert await pq.list_schedules() == [await pq.schedule("s")]


def tick_of(message: Message) -> datetime:
    return datetime.fromisoformat(message.attributes["schedule_time"])


async def test_trigger_publishes_one_tick_now(pq: PawnQueue) -> None:
    await pq.create_topic("jobs")
    await pq.create_schedule("hourly", "jobs", cron="0 * * * *", payload=[1], attributes={"a": "b"})
    before = datetime.now(UTC)
    message_id = await pq.trigger_schedule("hourly")
    consumer = await pq.register_consumer("reader", ["jobs"])
    [message] = await poll_count(consumer, 1)
    assert message.id == message_id and message.payload == [1]
    assert message.attributes["schedule"] == "hourly" and message.attributes["a"] == "b"
    assert before - timedelta(seconds=1) <= tick_of(message) <= datetime.now(UTC)
    await message.ack()


async def test_run_schedules_fires_each_tick_once(pq: PawnQueue) -> None:
    await pq.create_topic("jobs")
    created = await pq.create_schedule("fast", "jobs", every=1, payload={"n": 1})
    consumer = await pq.register_consumer("reader", ["jobs"])
    runner = asyncio.create_task(pq.run_schedules())
    try:
        messages = await poll_count(consumer, 3)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    ticks = [tick_of(m) for m in messages]
    assert len(set(ticks)) == len(ticks)
    assert all(t > created.created_at and t.microsecond == 0 for t in ticks)
    assert all(m.attributes["schedule"] == "fast" and m.payload == {"n": 1} for m in messages)
    stats = await pq.schedule_stats("fast")
    assert stats.fired >= 3 and stats.missed == 0
    assert stats.last_fire_time is not None and stats.last_fire_time >= max(ticks)
    assert len(await schedule_tick_keys(pq.store, "fast")) == stats.fired


async def test_pause_and_resume_are_seen_by_another_queue(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    await pq.create_topic("jobs")
    await pq.create_schedule("s", "jobs", every=60)
    async with PawnQueue.from_config(queue_config) as other:
        await pq.pause_schedule("s")
        assert (await other.schedule("s")).paused
        stats = await other.schedule_stats("s")
        assert stats.paused and stats.next_fire_time is None
        await other.resume_schedule("s")
        assert not (await pq.schedule("s")).paused
        assert (await pq.schedule_stats("s")).next_fire_time is not None


async def drain(consumer: Consumer) -> list[Message]:
    found: list[Message] = []
    while messages := await consumer.poll(wait=1.0):
        for message in messages:
            await message.ack()
        found += messages
    return found


async def test_three_processes_fire_each_tick_once(tmp_path: Path) -> None:
    config = {"backend": "filesystem", "filesystem": {"path": str(tmp_path / "store")}}
    async with PawnQueue.from_config(config) as pq:
        await pq.create_topic("jobs")
        created = await pq.create_schedule("every-second", "jobs", every=1)
        consumer = await pq.register_consumer("counter", ["jobs"])
        workers = [await start_schedule_runner(json.dumps(config)) for _ in range(3)]
        seen: list[Message] = []
        try:
            # About 20 s: until 20 distinct ticks came, every one seen while all three ran.
            async with asyncio.timeout(120):
                while len({tick_of(m) for m in seen}) < 20:
                    messages = await consumer.poll(wait=1.0)
                    for message in messages:
                        await message.ack()
                    seen += messages
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                await worker.wait()
        last_seen = max(tick_of(m) for m in seen)
        seen += await drain(consumer)
    counts = Counter(tick_of(m) for m in seen)
    assert [t for t, n in counts.items() if n > 1] == []  # no tick twice
    first = min(counts)
    span = int((last_seen - first).total_seconds()) + 1
    expected = [first + timedelta(seconds=k) for k in range(span)]
    assert sorted(t for t in counts if t <= last_seen) == expected  # no tick left out
    assert first > created.created_at and span >= 20


async def test_schedules_refuse_to_run_where_a_tick_could_fire_once_per_runner() -> None:
    """Without conditional writes every runner's create-only tick marker would succeed."""
    config = PawnQueueConfig.from_url("memory://", concurrency={"strategy": "csprng_verify"})
    async with PawnQueue(config) as pq:
        await pq.create_topic("jobs")
        await pq.create_schedule("tick", "jobs", every=1)
        with pytest.raises(ConfigError, match="conditional writes"):
            await asyncio.wait_for(pq.run_schedules(), 10)
