"""Schedule ticks and runners with injected time: where ticks fall (intervals, cron in UTC
and across DST), catch-up after an outage, and skewed runners firing each tick once.

Runners share one memory store and read a virtual timeline through their own clocks; the
test moves the timeline and calls ``refresh``/``step`` itself, so nothing depends on this
machine's speed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.schedule_runner import ScheduleRunner
from pawn_queue._protocol.schedule_ticks import TickRule, plan
from pawn_queue._protocol.schedules import Schedule, Schedules
from pawn_queue.config import PawnQueueConfig
from pawn_queue.store.memory import MemoryStore

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def take(rule: TickRule, after: datetime, count: int) -> list[datetime]:
    ticks = rule.after(after)
    return [next(ticks) for _ in range(count)]


# -- where ticks fall --------------------------------------------------------------------------


def test_every_counts_from_the_epoch_or_from_start() -> None:
    rule = TickRule(None, 90)
    assert take(rule, utc(2026, 1, 1, 0, 0, 10), 2) == [
        utc(2026, 1, 1, 0, 1, 30),
        utc(2026, 1, 1, 0, 3),
    ]
    assert rule.next(utc(2026, 1, 1, 0, 1, 30)) == utc(2026, 1, 1, 0, 3)  # strictly after
    anchored = TickRule(None, 60, start=utc(2026, 1, 1, 0, 0, 7))
    assert take(anchored, utc(2025, 1, 1), 2) == [
        utc(2026, 1, 1, 0, 0, 7),
        utc(2026, 1, 1, 0, 1, 7),
    ]


def test_fractional_intervals_do_not_drift() -> None:
    rule = TickRule(None, 1.1)
    far = rule.next(utc(2026, 6, 1))
    assert far is not None
    since_epoch = (far - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert since_epoch % 1_100_000 == 0


def test_cron_in_utc_and_the_end_bound() -> None:
    rule = TickRule("0 */6 * * *", None, end=utc(2026, 1, 2))
    assert list(rule.after(utc(2026, 1, 1, 1))) == [
        utc(2026, 1, 1, 6),
        utc(2026, 1, 1, 12),
        utc(2026, 1, 1, 18),
    ]
    assert rule.next(utc(2026, 1, 2)) is None


def test_cron_before_start_never_fires() -> None:
    rule = TickRule("*/15 * * * *", None, start=utc(2026, 1, 1, 10, 20))
    assert take(rule, utc(2026, 1, 1), 2) == [utc(2026, 1, 1, 10, 30), utc(2026, 1, 1, 10, 45)]


def test_cron_across_the_march_transition_in_berlin() -> None:
    # 30 March 2025: 02:00 local does not exist (clocks go from 02:00 to 03:00).
    hourly = TickRule("0 * * * *", None, "Europe/Berlin")
    local = [t.astimezone(BERLIN).hour for t in take(hourly, utc(2025, 3, 29, 23, 30), 3)]
    assert local == [1, 3, 4]
    daily = TickRule("30 2 * * *", None, "Europe/Berlin")
    # The skipped 02:30 runs at 03:00 local that day (Debian cron's rule), 01:00 UTC.
    assert take(daily, utc(2025, 3, 29, 12), 2) == [utc(2025, 3, 30, 1), utc(2025, 3, 31, 0, 30)]


def test_cron_across_the_october_transition_in_berlin() -> None:
    # 26 October 2025: 02:00-03:00 local happens twice (UTC+2, then UTC+1).
    hourly = TickRule("0 * * * *", None, "Europe/Berlin")
    assert take(hourly, utc(2025, 10, 25, 23, 30), 3) == [
        utc(2025, 10, 26, 0),  # 02:00 summer time
        utc(2025, 10, 26, 1),  # 02:00 winter time: an hourly job runs both
        utc(2025, 10, 26, 2),
    ]
    daily = TickRule("30 2 * * *", None, "Europe/Berlin")
    # A daily job at 02:30 runs once, at the first 02:30.
    assert take(daily, utc(2025, 10, 25, 12), 2) == [
        utc(2025, 10, 26, 0, 30),
        utc(2025, 10, 27, 1, 30),
    ]


def test_plan_fires_the_window_and_counts_the_rest_as_missed() -> None:
    last = utc(2026, 3, 1, 12)
    due, missed = plan(TickRule(None, 60), last, last + timedelta(minutes=12), 300)
    assert due == [last + timedelta(minutes=m) for m in range(7, 13)]
    assert missed == 6


# -- runners ---------------------------------------------------------------------------------


@dataclass
class Timeline:
    """Virtual time; each host reads it through its own skew."""

    start: datetime
    elapsed: float = 0.0

    def clock(self, skew: float = 0.0) -> Callable[[], datetime]:
        return lambda: self.start + timedelta(seconds=self.elapsed + skew)


@dataclass
class Published:
    """Every publish the runners made: message ids by ``schedule_time``."""

    ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    calls: int = 0


@dataclass
class Hosts:
    store: MemoryStore
    timeline: Timeline
    published: Published
    queues: list[PawnQueue] = field(default_factory=list)

    async def runner(self, skew: float = 0.0) -> ScheduleRunner:
        config = PawnQueueConfig.from_url("memory://")
        pq = PawnQueue(config, store=self.store, clock=self.timeline.clock(skew))
        await pq.setup()
        self.queues.append(pq)
        producer = await pq.register_producer("ticks")
        published = self.published

        async def publish(
            topic: str, payload: Any, attributes: Mapping[str, str], ident: str
        ) -> str:
            published.calls += 1
            message_id = await producer.publish(
                topic, payload, attributes=attributes, dedup_id=ident
            )
            published.ids[attributes["schedule_time"]].add(message_id)
            return message_id

        runner = ScheduleRunner(pq.runtime, publish, grace_seconds=2.0)
        return runner


@pytest.fixture
async def hosts() -> AsyncIterator[Hosts]:
    # Half a minute past a whole minute: how many minute ticks a span holds is fixed.
    start = datetime.now(UTC).replace(second=30, microsecond=0)
    found = Hosts(MemoryStore(), Timeline(start), Published())
    yield found
    for pq in found.queues:
        await pq.teardown()


async def create(hosts: Hosts, **options: Any) -> Schedule:
    pq = hosts.queues[0]
    await pq.create_topic("jobs")
    schedule = Schedule(name="tick", topic="jobs", created_at=hosts.timeline.clock()(), **options)
    return await Schedules(pq.runtime).create(schedule)


async def run(
    runners: list[ScheduleRunner], timeline: Timeline, seconds: float, step: float
) -> None:
    for runner in runners:
        await runner.refresh()
    end = timeline.elapsed + seconds
    turn = 0
    while timeline.elapsed < end:
        timeline.elapsed += step
        turn += 1
        order = runners if turn % 2 else runners[::-1]  # neither always goes first
        for runner in order:
            await runner.step()


async def test_two_runners_two_seconds_apart_fire_each_tick_once(hosts: Hosts) -> None:
    exact = await hosts.runner(0.0)
    behind = await hosts.runner(-2.0)
    await create(hosts, cron=None, every=5.0)
    await run([exact, behind], hosts.timeline, 60, 0.25)
    ticks = sorted(hosts.published.ids)
    assert len(ticks) >= 11
    assert all(len(ids) == 1 for ids in hosts.published.ids.values())
    assert exact.won + behind.won == len(ticks)
    assert hosts.published.calls == len(ticks)  # the losers' checks found each published
    stats = await hosts.queues[0].schedule_stats("tick")
    assert stats.fired == len(ticks) and stats.missed == 0


async def test_catch_up_after_a_twelve_minute_outage(hosts: Hosts) -> None:
    first = await hosts.runner()
    await create(hosts, cron=None, every=60.0, catch_up_seconds=300.0)
    await run([first], hosts.timeline, 125, 1.0)
    before = dict(hosts.published.ids)
    assert len(before) == 2
    # Every runner is down for 12 minutes; a new one starts and looks at the markers.
    hosts.timeline.elapsed += 12 * 60
    second = await hosts.runner()
    await run([second], hosts.timeline, 0.5, 0.5)
    after = {t: ids for t, ids in hosts.published.ids.items() if t not in before}
    now = hosts.timeline.clock()()
    ages = sorted((now - datetime.fromisoformat(t)).total_seconds() for t in after)
    assert len(after) == 5 and all(age <= 300 for age in ages)  # ticks at +570 .. +810 s
    assert all(len(ids) == 1 for ids in after.values())
    stats = await hosts.queues[0].schedule_stats("tick")
    assert stats.missed == 7 and stats.fired == 7  # +150 .. +510 s missed; 2 + 5 fired


async def test_a_winner_that_crashed_before_publishing_is_covered(hosts: Hosts) -> None:
    runner = await hosts.runner()
    await create(hosts, cron=None, every=60.0)
    await run([runner], hosts.timeline, 1, 0.5)  # the runner knows the schedule
    tick = hosts.timeline.start + timedelta(seconds=30)
    # A crashed winner: its marker exists, its message does not.
    await hosts.store.put(layout.schedule_tick_key("tick", tick), b'{"runner":"gone"}', "create")
    hosts.timeline.elapsed = (tick - hosts.timeline.start).total_seconds() - 1
    await run([runner], hosts.timeline, 1.5, 0.5)  # the runner lost the tick's create
    assert dict(hosts.published.ids) == {}
    await run([runner], hosts.timeline, 5, 0.5)  # past the grace: published for the winner
    assert [len(ids) for ids in hosts.published.ids.values()] == [1]
