"""Schedules through the public API: definitions, their errors, firing (in this process and
in three runner processes at once: each tick once), pause and resume, and the priority and
expiry their ticks are published with."""

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
from pawn_queue.config import PawnQueueConfig, load_config
from tests.helpers.storage import schedule_key, schedule_tick_keys
from tests.helpers.support import keys_under, poll_count, start_schedule_runner


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
    # Refused by publish's own checks, with its messages.
    bad_ticks: list[tuple[dict[str, Any], str]] = [
        ({"priority": 10}, "priority: got 10, must be an int from 0"),
        ({"priority": -1}, "priority: got -1"),
        ({"priority": 1.5}, "priority: got 1.5"),
        ({"priority": True}, "priority: got True"),
        ({"priority": math.nan}, "priority: got nan"),
        ({"priority": "9"}, "priority: got '9'"),
        ({"expires_in": 0}, "expires_in: got 0, must be a number of seconds > 0"),
        ({"expires_in": -1}, "expires_in: got -1"),
        ({"expires_in": math.nan}, "expires_in: got nan"),
        ({"expires_in": math.inf}, "expires_in: got inf"),
        ({"expires_in": True}, "expires_in: got True"),
    ]
    for options, message in [*bad, *(({"every": 60, **o}, m) for o, m in bad_ticks)]:
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
    for options, message in bad_ticks:
        with pytest.raises(ArgumentError, match=message):
            await pq.update_schedule("s", **options)
    kept = await pq.schedule("s")
    assert (kept.every, kept.priority, kept.expires_in) == (60.0, 0, None)
    assert await pq.list_schedules() == [kept]


async def test_a_topic_whose_dedup_window_is_too_short_for_a_schedule_is_refused(
    pq: PawnQueue,
) -> None:
    """A runner that lost a tick looks whether the winner published it up to
    catch_up_seconds + jitter_seconds + 10 s after the tick, and trusts the topic's dedup
    marker until 10 s before its window is past: a topic whose window is shorter is refused
    (0 is no dedup at all), naming it, its window and the minimum, and nothing is written."""
    await pq.create_topic("nodedup", dedup_window_seconds=0)
    await pq.create_topic("short", dedup_window_seconds=79)
    await pq.create_topic("enough", dedup_window_seconds=80)
    refused: list[tuple[str, dict[str, Any], str]] = [
        ("nodedup", {}, r"topic 'nodedup' has dedup_window_seconds 0 \(no dedup\), under the 80"),
        ("short", {}, "topic 'short' has dedup_window_seconds 79, under the 80 its runners"),
        ("enough", {"jitter_seconds": 1}, "dedup_window_seconds 80, under the 81"),
        ("enough", {"catch_up_seconds": 61}, "under the 81 .*catch_up_seconds 61 "),
    ]
    for topic, options, message in refused:
        with pytest.raises(ArgumentError, match=message):
            await pq.create_schedule("s", topic, every=60, **options)
    assert await pq.list_schedules() == []
    await pq.create_schedule("s", "enough", every=60)  # 60 + 0 + 20: just enough

    # A change of the topic, or of the catch-up or jitter, is checked likewise.
    for change in ({"topic": "short"}, {"catch_up_seconds": 61}, {"jitter_seconds": 0.5}):
        with pytest.raises(ArgumentError, match="under the 8"):
            await pq.update_schedule("s", **change)
    kept = await pq.schedule("s")
    assert (kept.topic, kept.catch_up_seconds, kept.jitter_seconds) == ("enough", 60.0, 0.0)
    moved = await pq.update_schedule("s", topic="short", catch_up_seconds=59)
    assert (moved.topic, moved.catch_up_seconds) == ("short", 59.0)

    # A window lowered under a schedule is not refused: its runners say so (once each,
    # tests/protocol/test_schedule_ticks.py), and pausing or changing what it publishes
    # still works.
    await pq.update_topic("short", dedup_window_seconds=0)
    await pq.pause_schedule("s")
    assert (await pq.update_schedule("s", payload={"n": 1})).paused


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


async def test_ticks_carry_the_schedule_s_priority_and_expiry(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    """Each tick is published with its schedule's priority and expiry, the expiry counted
    from the tick's publish: a consumer on a clock 5 s ahead never gets the tick of a
    schedule whose ticks expire after 1 s, and gets the others with their priorities."""
    await pq.create_topic("jobs")
    declared: dict[str, dict[str, Any]] = {
        "routine": {},
        "urgent": {"priority": 9},
        "lasting": {"expires_in": 600},
        "fleeting": {"priority": 5, "expires_in": 1},
    }
    for name, options in declared.items():
        created = await pq.create_schedule(name, "jobs", every=3600, **options)
        assert (created.priority, created.expires_in) == (
            options.get("priority", 0),
            options.get("expires_in"),
        )
        assert await pq.schedule(name) == created
    before = datetime.now(UTC)
    ids = {name: await pq.trigger_schedule(name) for name in declared}
    after = datetime.now(UTC)

    def ahead() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=5)

    async with PawnQueue(load_config(queue_config), clock=ahead) as consuming:
        consumer = await consuming.register_consumer("reader", ["jobs"])
        received = await poll_count(consumer, 3)
        assert await consumer.poll(wait=1) == []  # the fleeting tick expired: removed
        await asyncio.gather(*(m.ack() for m in received))
    got = {m.attributes["schedule"]: m for m in received}
    assert sorted(got) == ["lasting", "routine", "urgent"]
    assert {name: m.id for name, m in got.items()} == {n: ids[n] for n in got}
    assert {name: m.priority for name, m in got.items()} == {
        "routine": 0,
        "urgent": 9,
        "lasting": 0,
    }
    assert got["routine"].expires_at is None and got["urgent"].expires_at is None
    expires_at = datetime.fromisoformat(str(got["lasting"].expires_at))
    assert before + timedelta(seconds=600) <= expires_at <= after + timedelta(seconds=600)
    assert await keys_under(pq, "jobs/messages/") == []


OLD_DEFINITION: dict[str, Any] = {
    "name": "old",
    "topic": "jobs",
    "cron": None,
    "every": 60.0,
    "payload": {"n": 1},
    "attributes": {},
    "timezone": "UTC",
    "jitter_seconds": 0.0,
    "catch_up_seconds": 60.0,
    "start": None,
    "end": None,
    "paused": False,
    "created_at": "2026-11-30T10:00:00+00:00",
}
"""A definition as written before schedules had a priority and an expiry: these keys."""


async def test_a_definition_written_before_priorities_reads_as_priority_0_without_expiry(
    pq: PawnQueue,
) -> None:
    await pq.create_topic("jobs")
    await pq.store.put(schedule_key("old"), json.dumps(OLD_DEFINITION).encode(), "create")
    old = await pq.schedule("old")
    assert (old.priority, old.expires_in, old.every, old.payload) == (0, None, 60.0, {"n": 1})
    message_id = await pq.trigger_schedule("old")
    consumer = await pq.register_consumer("reader", ["jobs"])
    [message] = await poll_count(consumer, 1)
    assert (message.id, message.priority, message.expires_at) == (message_id, 0, None)
    await message.ack()

    # Written again, it keeps every key as it was and adds the two: a reader that knows only
    # those keys reads the same schedule.
    await pq.update_schedule("old", priority=3, expires_in=90)
    stored = json.loads((await pq.store.get(schedule_key("old"))).data)
    assert stored == {**OLD_DEFINITION, "priority": 3, "expires_in": 90.0}

    # A stored value publish would refuse leaves the definition out, as any unreadable one.
    garbled = {**OLD_DEFINITION, "name": "garbled", "priority": 12}
    await pq.store.put(schedule_key("garbled"), json.dumps(garbled).encode(), "create")
    with pytest.raises(ValueError, match="not a schedule definition: priority: got 12"):
        await pq.schedule("garbled")
    assert [s.name for s in await pq.list_schedules()] == ["old"]


async def test_run_schedules_fires_each_tick_once(pq: PawnQueue) -> None:
    await pq.create_topic("jobs")
    created = await pq.create_schedule(
        "fast", "jobs", every=1, payload={"n": 1}, priority=7, expires_in=600
    )
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
    # Published with the schedule's priority and expiry, counted from each tick's publish.
    assert all(m.priority == 7 and m.expires_at is not None for m in messages)
    latest = datetime.now(UTC) + timedelta(seconds=600)
    for message, tick in zip(messages, ticks, strict=True):
        expires_at = datetime.fromisoformat(str(message.expires_at))
        assert tick + timedelta(seconds=600) <= expires_at <= latest
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
