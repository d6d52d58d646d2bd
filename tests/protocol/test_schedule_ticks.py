"""Schedule ticks and runners with injected time: where ticks fall (intervals, cron in UTC
and across DST), catch-up after an outage, and skewed runners firing each tick once.

Runners share one memory store and read a virtual timeline through their own clocks; the
test moves the timeline and calls ``refresh``/``step`` itself, so nothing depends on this
machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
from prometheus_client import CollectorRegistry

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout, schedule_runner
from pawn_queue._protocol.schedule_runner import ScheduleRunner
from pawn_queue._protocol.schedule_ticks import TickRule, plan
from pawn_queue._protocol.schedules import Schedule, Schedules, tick_iso
from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import StoreUnavailableError
from pawn_queue.metrics import QueueMetrics
from pawn_queue.observe import Observer
from pawn_queue.store.base import IfMatch, Store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

BERLIN = ZoneInfo("Europe/Berlin")
T = TypeVar("T")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type, misc]


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
    store: Store
    timeline: Timeline
    published: Published
    queues: list[PawnQueue] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    """Config sections of every host's queue."""

    async def runner(self, skew: float = 0.0, observers: Sequence[Observer] = ()) -> ScheduleRunner:
        config = PawnQueueConfig.from_url("memory://", **self.sections)
        clock = self.timeline.clock(skew)
        pq = PawnQueue(config, store=self.store, clock=clock, observers=observers)
        await pq.setup()
        self.queues.append(pq)
        producer = await pq.register_producer("ticks")
        published = self.published

        async def publish(
            topic: str, payload: Any, attributes: Mapping[str, str], ident: str, **options: Any
        ) -> str:
            published.calls += 1
            message_id = await producer.publish(
                topic, payload, attributes=attributes, dedup_id=ident, **options
            )
            published.ids[attributes["schedule_time"]].add(message_id)
            return message_id

        runner = ScheduleRunner(pq.runtime, publish, grace_seconds=2.0)
        return runner


@contextlib.asynccontextmanager
async def open_hosts(store: Store | None = None, **sections: Any) -> AsyncIterator[Hosts]:
    # Half a minute past a whole minute: how many minute ticks a span holds is fixed.
    start = datetime.now(UTC).replace(second=30, microsecond=0)
    found = Hosts(store or MemoryStore(), Timeline(start), Published(), sections=sections)
    try:
        yield found
    finally:
        for pq in found.queues:
            await pq.teardown()


@pytest.fixture
async def hosts() -> AsyncIterator[Hosts]:
    async with open_hosts() as found:
        yield found


async def create(hosts: Hosts, **options: Any) -> Schedule:
    pq = hosts.queues[0]
    # Long enough for the catch-up of every schedule here (create refuses a shorter one).
    await pq.create_topic("jobs", dedup_window_seconds=600)
    schedule = Schedule(name="tick", topic="jobs", created_at=hosts.timeline.clock()(), **options)
    return await Schedules(pq.runtime).create(schedule)


async def run(
    runners: list[ScheduleRunner], timeline: Timeline, seconds: float, step: float
) -> None:
    for runner in runners:
        await runner.refresh()
    await advance(runners, timeline, seconds, step)


async def advance(
    runners: list[ScheduleRunner], timeline: Timeline, seconds: float, step: float
) -> None:
    """Move the timeline on ``seconds`` by ``step``, each runner stepping at each."""
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
    await create(hosts, cron=None, every=60.0, priority=9, expires_in=600.0)
    await run([runner], hosts.timeline, 1, 0.5)  # the runner knows the schedule
    tick = hosts.timeline.start + timedelta(seconds=30)
    # A crashed winner: its marker exists, its message does not.
    await hosts.store.put(layout.schedule_tick_key("tick", tick), b'{"runner":"gone"}', "create")
    hosts.timeline.elapsed = (tick - hosts.timeline.start).total_seconds() - 1
    await run([runner], hosts.timeline, 1.5, 0.5)  # the runner lost the tick's create
    assert dict(hosts.published.ids) == {}
    await run([runner], hosts.timeline, 5, 0.5)  # past the grace: published for the winner
    assert [len(ids) for ids in hosts.published.ids.values()] == [1]
    # With the schedule's priority and expiry, counted from this publish (the grace, 2 s
    # here, after the tick at the earliest), not from the tick.
    published_by = hosts.timeline.clock()()
    consumer = await hosts.queues[0].register_consumer("reader", ["jobs"])
    [message] = await consumer.poll(wait=1)
    assert message.priority == 9 and message.expires_at is not None
    expires_at = datetime.fromisoformat(message.expires_at)
    assert tick + timedelta(seconds=602) <= expires_at <= published_by + timedelta(seconds=600)


async def test_a_runner_that_starts_covers_a_crashed_winner_whose_losers_stopped(
    hosts: Hosts,
) -> None:
    """The winner of a tick crashed before publishing, and the runners that lost to it (and
    would have published it) stopped too: a runner that starts then, after the tick's
    marker, looks at it as they would have, and publishes it; the ticks before, published,
    are not published again."""
    first = await hosts.runner()
    await create(hosts, cron=None, every=5.0)
    await run([first], hosts.timeline, 20, 0.5)
    published = dict(hosts.published.ids)
    assert len(published) == 4
    tick = max(datetime.fromisoformat(t) for t in published) + timedelta(seconds=5)
    await hosts.store.put(layout.schedule_tick_key("tick", tick), b'{"runner":"gone"}', "create")
    # Every runner stopped; one starts a second after the tick, past its marker.
    hosts.timeline.elapsed = (tick - hosts.timeline.start).total_seconds() + 1
    second = await hosts.runner()
    await run([second], hosts.timeline, 0.5, 0.5)
    assert dict(hosts.published.ids) == published  # the winner has its grace
    await run([second], hosts.timeline, 2.5, 0.5)  # past the grace: published for it
    assert sorted(hosts.published.ids) == sorted([*published, tick_iso(tick)])
    assert all(len(ids) == 1 for ids in hosts.published.ids.values())
    assert hosts.published.calls == len(published) + 1


async def test_a_dedup_window_lowered_under_a_schedule_is_logged_once_per_runner(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """create_schedule refuses a topic whose dedup window is too short for the schedule,
    but the window can be lowered later: then each runner that looks at a tick another
    runner won says so once, not an error per tick (nor one per tick of the catch-up
    window when it starts). Ticks keep firing; one whose winner died is published for it
    only while the window lasts, so not here; with the window raised again, it is."""
    caplog.set_level(logging.DEBUG, logger=schedule_runner.__name__)
    async with open_hosts(store) as hosts:
        first = await hosts.runner()
        await create(hosts, cron=None, every=5.0)
        pq = hosts.queues[0]
        await pq.update_topic("jobs", dedup_window_seconds=1)  # not refused
        await run([first], hosts.timeline, 1, 0.5)
        # Three ticks in a row whose winners crashed before publishing.
        due = hosts.timeline.start + timedelta(seconds=5)
        crashed = [due + timedelta(seconds=5 * k) for k in range(3)]
        for tick in crashed:
            await store.put(layout.schedule_tick_key("tick", tick), b'{"runner":"gone"}', "create")
        await advance([first], hosts.timeline, 25, 0.5)  # each looked at, past the grace
        # A runner that starts looks at the ticks of its catch-up window with a marker.
        second = await hosts.runner()
        await run([second], hosts.timeline, 5, 0.5)

        records = [r for r in caplog.records if r.name == schedule_runner.__name__]
        assert [r.levelno for r in records if r.levelno >= logging.ERROR] == []
        warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        assert len(warned) == 2, warned  # one per runner
        assert all("'tick'" in m and "'jobs' (1 s)" in m for m in warned), warned
        published = {datetime.fromisoformat(t) for t in hosts.published.ids}
        assert published and not published & set(crashed)  # the others fired, once each
        assert all(len(ids) == 1 for ids in hosts.published.ids.values())

        # Raised again: the next crashed winner's tick is published for it, which is all
        # that is logged at WARNING or above.
        await pq.update_topic("jobs", dedup_window_seconds=600)
        tick = TickRule(None, 5.0).next(hosts.timeline.clock()() + timedelta(seconds=1))
        assert tick is not None
        await store.put(layout.schedule_tick_key("tick", tick), b'{"runner":"gone"}', "create")
        caplog.clear()
        await advance([first, second], hosts.timeline, 10, 0.5)
        assert len(hosts.published.ids[tick_iso(tick)]) == 1
        loud = [
            r.getMessage()
            for r in caplog.records
            if r.name == schedule_runner.__name__ and r.levelno >= logging.WARNING
        ]
        assert len(loud) == 1 and "publishing for its winner" in loud[0], loud


class FailingDedupReads(StoreWrapper):
    """A store whose reads of dedup markers fail while ``failing`` is set."""

    failing = True

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if self.failing and call.operation == "get" and "/dedup/" in call.key:
            raise StoreUnavailableError("timed out (test)")
        return await run()


async def test_a_check_the_store_failed_is_made_again() -> None:
    """The check of a crashed winner's tick met a store error: the runner looks again a
    second later instead of dropping it (the tick was lost, once in a CI run on S3)."""
    store = FailingDedupReads(MemoryStore())
    async with open_hosts(store) as hosts:
        runner = await hosts.runner()
        await create(hosts, cron=None, every=60.0)
        await run([runner], hosts.timeline, 1, 0.5)
        tick = hosts.timeline.start + timedelta(seconds=30)
        await store.put(layout.schedule_tick_key("tick", tick), b'{"runner":"gone"}', "create")
        hosts.timeline.elapsed = (tick - hosts.timeline.start).total_seconds() - 1
        await run([runner], hosts.timeline, 5, 0.5)  # lost the create; the check fails
        assert dict(hosts.published.ids) == {}
        store.failing = False
        await run([runner], hosts.timeline, 1.5, 0.5)
        assert [len(ids) for ids in hosts.published.ids.values()] == [1]


# -- requests per tick, and what the runners report ------------------------------------------


@dataclass(frozen=True)
class Request:
    operation: str
    key: str
    mode: str | None
    accepted: bool


class Recorded(StoreWrapper):
    """Every request, in order, with its key, its put mode and whether the store took it."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.requests: list[Request] = []

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        mode = "if-match" if isinstance(call.mode, IfMatch) else call.mode
        accepted = False
        try:
            result = await run()
            accepted = True
            return result
        finally:
            self.requests.append(Request(call.operation, call.key, mode, accepted))


def writes_per_key(requests: list[Request]) -> Counter[int]:
    """How many keys were written once, twice... (accepted puts)."""
    return Counter(Counter(r.key for r in requests if r.accepted).values())


async def test_a_tick_of_three_runners_costs_three_marker_puts_and_its_publish() -> None:
    store = Recorded(MemoryStore())
    # Change signals are writes of their own, off the publish's path (test_notify.py).
    async with open_hosts(store, notify={"enabled": False}) as hosts:
        runners = [await hosts.runner() for _ in range(3)]
        await create(hosts, cron=None, every=5.0)
        # What one publish with a dedup id writes: the winner's publish of a tick is one.
        producer = await hosts.queues[0].register_producer("baseline")
        mark = len(store.requests)
        await producer.publish("jobs", None, attributes={"a": "b"}, dedup_id="baseline")
        publish = [r for r in store.requests[mark:] if r.operation == "put"]
        for runner in runners:
            await runner.refresh()
        mark = len(store.requests)
        await advance(runners, hosts.timeline, 60, 0.25)
        # Heartbeats are the processes' own, whatever their schedules.
        requests = [r for r in store.requests[mark:] if not r.key.startswith(layout.REGISTRY)]

    ticks = [datetime.fromisoformat(t) for t in sorted(hosts.published.ids)]
    assert len(ticks) == 12 and all(len(ids) == 1 for ids in hosts.published.ids.values())
    puts = [r for r in requests if r.operation == "put"]
    assert len(puts) == len(ticks) * (3 + len(publish))
    # Each marker: one create-only PUT per runner, one accepted.
    markers = [r for r in puts if r.key.startswith(layout.SCHEDULE_TICKS)]
    keys = {layout.schedule_tick_key("tick", tick) for tick in ticks}
    assert Counter(r.key for r in markers) == dict.fromkeys(keys, 3)
    assert {r.mode for r in markers} == {"create"}
    assert writes_per_key(markers) == {1: len(ticks)}
    # The rest: a publish per tick, keys written as often as one publish writes them (its
    # dedup marker twice: created, then marked written), none more.
    published = [r for r in puts if not r.key.startswith(layout.SCHEDULE_TICKS)]
    assert Counter(r.mode for r in published) == {
        mode: count * len(ticks) for mode, count in Counter(r.mode for r in publish).items()
    }
    assert writes_per_key(published) == {
        times: count * len(ticks) for times, count in writes_per_key(publish).items()
    }
    # No LIST per tick: the sweep of old markers, once per runner every 10 minutes at most.
    assert sum(r.operation == "list" for r in requests) <= 3


async def test_runners_report_ticks_fired_missed_and_how_late() -> None:
    metrics = QueueMetrics(CollectorRegistry())
    async with open_hosts() as hosts:
        first = await hosts.runner(observers=[metrics.observer])
        await create(hosts, cron=None, every=60.0, catch_up_seconds=300.0)
        await run([first], hosts.timeline, 125, 1.0)
        # Every runner is down for 12 minutes; three come back, each counting the gap.
        hosts.timeline.elapsed += 12 * 60
        back = [await hosts.runner(observers=[metrics.observer]) for _ in range(3)]
        await run(back, hosts.timeline, 0.5, 0.5)
        stats = await hosts.queues[0].schedule_stats("tick")

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(
            f"pawnqueue_{name}", {"schedule": "tick", **labels}
        )

    # Each tick and each missed tick reported once, by the runner that fired or recorded it.
    assert (stats.fired, stats.missed) == (7, 7)
    assert value("schedule_ticks_fired_total") == 7
    assert value("schedule_ticks_missed_total") == 7
    assert value("schedule_late_seconds_count") == 7
    # Two fired on time, five caught up 35.5 to 275.5 s after their ticks.
    assert value("schedule_late_seconds_bucket", le="1.0") == 2
    assert value("schedule_late_seconds_bucket", le="30.0") == 2
    assert value("schedule_late_seconds_bucket", le="60.0") == 3
    assert value("schedule_late_seconds_bucket", le="300.0") == 7


async def test_a_runner_on_a_queue_without_schedules_lists_ever_less_often() -> None:
    """Every worker runs a runner, most queues have no schedule: empty LISTs back off (to
    IDLE_REFRESH_SECONDS, here scaled down), and a schedule created meanwhile still fires."""
    store = Recorded(MemoryStore())
    async with PawnQueue(PawnQueueConfig.from_url("memory://"), store=store) as pq:
        await pq.create_topic("jobs")
        fired = asyncio.Event()

        async def publish(
            topic: str, payload: Any, attributes: Mapping[str, str], ident: str, **options: Any
        ) -> str:
            fired.set()
            return ident

        runner = ScheduleRunner(
            pq.runtime, publish, refresh_seconds=0.01, idle_refresh_seconds=0.16
        )
        running = asyncio.create_task(runner.run())
        try:
            await asyncio.sleep(1.0)  # the span over which LISTs are counted
            lists = [
                r for r in store.requests if r.operation == "list" and r.key == layout.SCHEDULES
            ]
            # Without the back-off: one LIST per 0.01 s, about 100.
            assert 3 <= len(lists) <= 15, len(lists)
            await pq.create_schedule("tick", "jobs", every=1)
            await asyncio.wait_for(fired.wait(), 10)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
