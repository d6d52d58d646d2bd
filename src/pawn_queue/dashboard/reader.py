"""Reading the queue into the dashboard's memory (:class:`Reader`): the topic list, each
topic's settings and counts, its subscriptions' counts, and the registry. Each read of a
topic lists its messages, leases and dead letters (three LISTs per 1,000 objects), counts
messages, not objects, and the dead letters by reason, a GET of each dead letter not seen
before (:mod:`~pawn_queue._protocol.counts`); two successive reads tell how
many messages were published and settled in between (a message published and settled
between two reads is not seen), and a read that changed what the pages show bumps the
versions they are cached by. A topic's subscriptions are read from its subscription index
(one GET, none when the queue read it less than 2 s before), then each subscription's queue
as a topic's (three LISTs, and the batch objects not seen yet, at most
:data:`SUBSCRIPTION_BATCHES_PER_READ`), for the first :data:`SUBSCRIPTIONS_READ` by name. A
read already under way is shared: concurrent pages never read one thing twice at once. The
schedules are read with one LIST of their definitions, then for each of the first
:data:`SCHEDULES_READ` by name what ``schedule_stats`` reads: a GET of its definition, a
LIST of its tick markers (a page per 1,000) and a GET of each marker that records missed
ticks. The limits page's reads are :mod:`~pawn_queue.dashboard.limits`'. When to read is
:class:`~pawn_queue.dashboard.snapshots.Monitor`'s."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from pawn_queue._internal.aio import gather_limited
from pawn_queue._protocol import layout
from pawn_queue._protocol.counts import read_topic
from pawn_queue._protocol.registry import Liveness
from pawn_queue._protocol.schedules import Schedules, schedule_name_of
from pawn_queue.client import PawnQueue
from pawn_queue.dashboard.limits import LimitsView, read_limits
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dashboard.views import (
    FlowPoint,
    Point,
    ScheduleView,
    SubscriptionView,
    TopicView,
    counts_key,
)
from pawn_queue.exceptions import ConfigError, ScheduleNotFoundError, TopicNotFoundError

logger = logging.getLogger(__name__)

SUBSCRIPTIONS_READ = 50  # a topic's subscriptions read (by name) for its pages, at most
SUBSCRIPTION_BATCHES_PER_READ = 100  # batch objects first seen a read of one GETs, at most
SCHEDULES_READ = 100  # schedules read (by name) for the schedules page, at most
_READ_CONCURRENCY = 8

T = TypeVar("T")


class Reader:
    """Reads the queue into :class:`TopicView`s and the registry's rows, and records what
    changed (:attr:`version`, each view's ``version``) and the last refresh's error."""

    def __init__(self, queue: PawnQueue, meter: RequestMeter, settings: DashboardSettings) -> None:
        self.queue = queue
        self.meter = meter
        self.settings = settings
        self.topics: dict[str, TopicView] = {}
        self.consumers: list[Liveness] = []  # one row per process running each name
        self.producers: list[Liveness] = []
        # The schedules (the first SCHEDULES_READ by name), read while their page is open;
        # None until then.
        self.schedules: list[ScheduleView] | None = None
        self.schedules_unread = 0  # schedules beyond those read
        self.schedules_read_at: float | None = None  # epoch seconds
        # The limits, rates and pauses, read while their page is open; None until then.
        self.limits: LimitsView | None = None
        self.limits_read_at: float | None = None  # epoch seconds
        self.version = 0
        self.last_full: float | None = None
        self.full_cost = 0  # requests the last full refresh sent
        self.look_cost: dict[str, int] = {}  # requests the last look of a page sent, by subject
        self.error: str | None = None  # the last refresh's store error, None once one works
        self._listed_at: float | None = None  # epoch seconds of the last topic listing
        self._reads: dict[str, asyncio.Future[Any]] = {}  # reads under way, by what they read

    def now(self) -> float:
        return self._clock().timestamp()

    def _clock(self) -> datetime:
        return self.queue.runtime.clock()

    def _valid_names(self) -> list[str]:
        return [name for name, view in self.topics.items() if view.valid]

    def _note_error(self, exc: Exception | None) -> None:
        message = None if exc is None else (str(exc).splitlines() or [type(exc).__name__])[0]
        if message != self.error:
            if message is not None:
                logger.warning("dashboard refresh failed error=%s", message)
            self.error = message
            self.version += 1

    async def _once(self, key: str, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``, or the same read already under way (by the loop or another page):
        concurrent pages never read one thing twice at once. ``key``: what it reads."""
        future = self._reads.get(key)
        if future is None:
            future = asyncio.ensure_future(read())
            self._reads[key] = future

            def done(finished: asyncio.Future[Any]) -> None:
                if self._reads.get(key) is finished:
                    del self._reads[key]
                if not finished.cancelled():
                    finished.exception()  # retrieved here: its waiters may all be gone

            future.add_done_callback(done)
        result: T = await asyncio.shield(future)
        return result

    async def full_refresh(self) -> None:
        """Read the topic list, every topic's settings and counts, and the registry."""
        before = self.meter.counts.total()
        await self._once("topics", self._list_topics)
        valid = [name for name, view in self.topics.items() if view.valid]
        await self._read_settings(valid)
        await self.refresh_topics(name for name in valid if name in self.topics)
        window = 2 * self.queue.config.registry.heartbeat_interval_seconds
        consumers = await self.queue.registry.liveness("consumers", window)
        producers = await self.queue.registry.liveness("producers", window)
        if _states(consumers + producers) != _states(self.consumers + self.producers):
            self.version += 1
        self.consumers, self.producers = consumers, producers
        self.last_full = self.now()
        self.full_cost = self.meter.counts.total() - before

    async def _list_topics(self) -> list[str]:
        """Read the topic list; returns the valid names it added."""
        names = await self.queue.list_topics()
        listed = set(names)
        for gone in set(self.topics) - listed:
            del self.topics[gone]
            self.look_cost.pop(gone, None)
            self.version += 1
        new = []
        for name in names:
            if name not in self.topics:
                view = self.topics[name] = TopicView(name, valid=valid_name(name))
                self.version += 1
                if view.valid:
                    new.append(name)
        self._listed_at = self.now()
        return new

    async def _read_settings(self, names: list[str]) -> None:
        """Read the settings of ``names``; a topic found deleted is dropped."""
        results = await gather_limited(
            _READ_CONCURRENCY, (self.queue.topic_settings(name) for name in names)
        )
        for name, result in zip(names, results, strict=True):
            view = self.topics.get(name)
            if view is None:
                continue  # dropped meanwhile by another listing
            if isinstance(result, TopicNotFoundError):
                self.topics.pop(name, None)
                self.version += 1
            elif isinstance(result, BaseException):
                raise result
            elif result != view.settings:
                view.settings = result
                view.version += 1
                self.version += 1

    async def refresh_topics(self, names: Iterable[str]) -> None:
        """Read the counts of ``names`` (three LISTs each, and the batch objects not seen
        yet) and record what changed."""
        wanted = [name for name in names if name in self.topics and self.topics[name].valid]
        results = await gather_limited(
            _READ_CONCURRENCY, (self._read_once(self.topics[name]) for name in wanted)
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _read_once(self, view: TopicView) -> None:
        await self._once(f"topic/{view.name}", lambda: self._read_topic(view))

    async def _read_topic(self, view: TopicView) -> None:
        visibility = self.queue.config.polling.visibility_timeout_seconds
        reading = await read_topic(
            self.queue.store, view.name, visibility, self._clock, view.batches, reasons=view.reasons
        )
        stats = reading.counts
        first = view.stats is None
        published = sum(n for key, n in reading.sizes.items() if key not in view.sizes)
        # Messages that left: the ones there before and the new ones, less those there now
        # (a batch's members settle one by one, so its object's coming and going is not it).
        settled = sum(view.sizes.values()) + published - sum(reading.sizes.values())
        point = Point(
            at=reading.at.timestamp(),
            pending=stats.pending,
            in_flight=stats.in_flight,
            delayed=stats.delayed,
            dead_letter=stats.dead_letter,
            published=0 if first else published,
            settled=0 if first else max(0, settled),
            dead_lettered=0 if first else len(reading.dead_keys - view.dead_keys),
        )
        changed = (
            first
            or reading.sizes != view.sizes
            or reading.dead_keys != view.dead_keys
            or counts_key(stats) != counts_key(view.stats)
            or reading.groups != view.groups
            or (reading.dead_reasons, reading.dead_unread) != (view.dead_reasons, view.dead_unread)
            or view.error is not None
        )
        view.stats, view.read_at, view.error = stats, reading.at.timestamp(), None
        view.next_due = None if reading.next_due is None else reading.next_due.timestamp()
        view.sizes, view.dead_keys, view.groups = reading.sizes, reading.dead_keys, reading.groups
        view.dead_reasons, view.dead_unread = reading.dead_reasons, reading.dead_unread
        if changed:
            view.history.append(point)
            self._trim(view.history, point.at)
            view.version += 1
            self.version += 1

    async def _read_subscriptions(self, view: TopicView) -> None:
        """Read the topic's subscriptions (its index) and the counts of each (the first
        :data:`SUBSCRIPTIONS_READ` by name); record what changed."""
        destinations = await self.queue.runtime.subscriptions.destinations(view.name)
        filters = {layout.split_queue(d.queue)[1] or "": d.filter.to_json() for d in destinations}
        known = view.subscriptions or {}
        read: dict[str, SubscriptionView] = {}
        for name in sorted(filters)[:SUBSCRIPTIONS_READ]:
            old = known.get(name)
            # Kept while its filter is: its batch sizes save GETs.
            same = old is not None and old.filter == filters[name]
            read[name] = old if old is not None and same else SubscriptionView(name, filters[name])
        before = {name: _shown(sub) for name, sub in read.items()}
        results = await gather_limited(
            _READ_CONCURRENCY, (self._read_subscription(view.name, sub) for sub in read.values())
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        unread = len(filters) - len(read)
        changed = (
            view.subscriptions is None
            or read.keys() != known.keys()
            or any(known[name] is not sub for name, sub in read.items())
            or any(_shown(sub) != before[name] for name, sub in read.items())
            or unread != view.subscriptions_unread
        )
        view.subscriptions, view.subscriptions_unread = read, unread
        view.subscriptions_read_at = self.now()
        if changed:
            view.version += 1
            self.version += 1

    async def _read_subscription(self, topic: str, sub: SubscriptionView) -> None:
        """Read the counts of one subscription's queue (as a topic's)."""
        reading = await read_topic(
            self.queue.store,
            layout.subscription_queue(topic, sub.name),
            self.queue.config.polling.visibility_timeout_seconds,
            self._clock,
            sub.batches,
            SUBSCRIPTION_BATCHES_PER_READ,
            reasons=sub.reasons,
        )
        sub.stats, sub.read_at = reading.counts, reading.at.timestamp()
        sub.dead_reasons, sub.dead_unread = reading.dead_reasons, reading.dead_unread

    async def _read_schedules(self) -> None:
        """Read the schedules and their stats; record what changed."""
        metas = await self.queue.store.list(layout.SCHEDULES)
        names = sorted(n for meta in metas if (n := schedule_name_of(meta.key)) is not None)
        wanted = names[:SCHEDULES_READ]
        results = await gather_limited(
            _READ_CONCURRENCY, (self._read_schedule(name) for name in wanted)
        )
        rows = []
        for result in results:
            if isinstance(result, ScheduleNotFoundError):
                continue  # deleted since the listing
            if isinstance(result, BaseException):
                raise result
            rows.append(result)
        unread = len(names) - len(wanted)
        if rows != self.schedules or unread != self.schedules_unread:
            self.version += 1
        self.schedules, self.schedules_unread = rows, unread
        self.schedules_read_at = self.now()

    async def _read_limits(self) -> None:
        """Read the limits, rates and pauses; record what changed."""
        limits = await read_limits(self.queue.store, self._clock())
        if limits != self.limits:
            self.version += 1
        self.limits, self.limits_read_at = limits, self.now()

    async def _read_schedule(self, name: str) -> ScheduleView:
        schedules = Schedules(self.queue.runtime)
        try:
            schedule, _ = await schedules.get(name)
        except ValueError as exc:  # written by another program, or damaged
            return ScheduleView(name, error=f"its definition cannot be read: {exc}")
        return ScheduleView.of(schedule, await schedules.stats_of(schedule))

    def _trim(self, points: deque[Point] | deque[FlowPoint], now: float) -> None:
        while points and points[0].at < now - self.settings.history_seconds:
            points.popleft()


def valid_name(name: str) -> bool:
    try:
        layout.validate_name(name, "topic name")
    except ConfigError:
        return False
    return True


def _shown(sub: SubscriptionView) -> tuple[object, ...]:
    """What a page shows of a subscription, to tell whether a read changed it."""
    return (counts_key(sub.stats), sub.dead_reasons, sub.dead_unread)


def _states(rows: list[Liveness]) -> list[tuple[str, str | None, str, str | None]]:
    """What a registry page shows, but for how long ago (which changes every second)."""
    return [
        (
            r.entry.entity_id,
            r.instance.instance_id if r.instance else None,
            r.status,
            r.instance.last_seen if r.instance else None,
        )
        for r in rows
    ]
