"""The dashboard's picture of the queue, kept in memory while it runs, and how it stays fresh
at little cost.

A :class:`Monitor` reads every topic once at start, then:

- waits on the change signals (:class:`~pawn_queue.notify.ChangeSignals`, checked with one
  HEAD of ``_notify/_`` every ``refresh`` seconds while nothing changes) and re-reads only
  the topics a producer signalled;
- re-reads, every ``refresh`` seconds, the topics whose state moves without a signal: those
  with messages in flight (their consumers ack, which signals nothing) and those whose
  delayed messages came due;
- reads everything (topics, counts, settings, registry) every ``full_refresh`` seconds;
- never reads twice within ``refresh`` seconds (a page's "refresh now" included).

Each read of a topic lists its messages, leases and dead letters (three LISTs per 1,000
objects) and keeps the message keys, so two successive reads tell how many objects were
published and settled in between (a batch object counts once; an object published and
settled between two reads is not seen). The pages render from memory: looking costs nothing
but the reads above, the peeks and dead letters a page shows (kept until the topic changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pawn_queue import layout
from pawn_queue._aio import gather_limited
from pawn_queue.client import PawnQueue
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.dashboard.prometheus import Scraper
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.exceptions import ConfigError, PawnQueueError, TopicNotFoundError
from pawn_queue.registry import RegistryEntry
from pawn_queue.topics import PeekedMessage, TopicSettings, TopicStats, classify

logger = logging.getLogger(__name__)

PROBLEM_WINDOW_SECONDS = 300.0  # dead letters added within this long make a topic a problem
PEEK_LIMIT = 10
DEAD_LETTER_LIMIT = 100
_READ_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class Point:
    """One read of a topic: its counts, and the objects that came and went since the last."""

    at: float  # epoch seconds
    pending: int
    in_flight: int
    delayed: int
    dead_letter: int
    published: int  # message objects that appeared since the previous read
    settled: int  # message objects that left (acked, dead-lettered, expired, purged)
    dead_lettered: int  # dead letters that appeared


@dataclass(frozen=True, slots=True)
class FlowPoint:
    """Message counters of the Prometheus exporters, per scrape interval (exact flow)."""

    at: float
    published: float
    acked: float
    dead_lettered: float


@dataclass(slots=True)
class TopicView:
    """What the dashboard knows of one topic."""

    name: str
    valid: bool = True  # False for a stored name the library refuses (shown, never read)
    settings: TopicSettings | None = None
    stats: TopicStats | None = None
    read_at: float = 0.0  # epoch seconds of the last read
    next_due: float | None = None  # epoch seconds when the first delayed message comes due
    groups: dict[str, int] = field(default_factory=dict)  # group hash -> objects
    history: deque[Point] = field(default_factory=deque)
    flow: deque[FlowPoint] = field(default_factory=deque)
    version: int = 0  # bumped whenever what the pages show of it changed
    error: str | None = None
    keys: frozenset[str] = frozenset()
    dead_keys: frozenset[str] = frozenset()

    def oldest_age(self, now: float) -> float | None:
        """Age of the oldest pending message now (it ages between reads too)."""
        if self.stats is None or self.stats.oldest_age_seconds is None:
            return None
        return self.stats.oldest_age_seconds + max(0.0, now - self.read_at)

    def dead_lettered_since(self, since: float) -> int:
        return sum(p.dead_lettered for p in self.history if p.at >= since)

    def problems(self, now: float, max_age: float) -> list[str]:
        """Why an operator should look at this topic now (empty: nothing)."""
        found = []
        if not self.valid:
            found.append("not a valid topic name")
        elif self.error:
            found.append(self.error)
        age = self.oldest_age(now)
        if age is not None and age > max_age:
            found.append(f"oldest pending message older than {max_age:g}s")
        growth = self.dead_lettered_since(now - PROBLEM_WINDOW_SECONDS)
        if growth:
            found.append(f"dead letters growing: +{growth} in {PROBLEM_WINDOW_SECONDS / 60:g} min")
        return found


class Monitor:
    """Keeps :class:`TopicView`s and the registry fresh; answers the pages from memory."""

    def __init__(self, queue: PawnQueue, meter: RequestMeter, settings: DashboardSettings) -> None:
        self.queue = queue
        self.meter = meter
        self.settings = settings
        self.topics: dict[str, TopicView] = {}
        self.consumers: list[RegistryEntry] = []
        self.producers: list[RegistryEntry] = []
        self.version = 0
        self.last_full: float | None = None
        self.full_cost = 0  # requests the last full refresh sent
        self.error: str | None = None  # the last refresh's store error, None once one works
        self.group_names: dict[str, str] = {}  # group hash -> name, learnt from peeks
        self.scraper = Scraper(settings.metrics_urls)
        self._peeks: dict[str, tuple[int, list[PeekedMessage]]] = {}
        self._letters: dict[str, tuple[int, list[DeadLetter]]] = {}
        self._refresh_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> bool:
        """Open the queue, read everything once, start refreshing; False if it had started."""
        if self._started:
            return False
        await self.queue.setup()
        try:
            await self.full_refresh()
        except BaseException:
            await self.queue.teardown()
            raise
        self._started = True
        self._tasks = [asyncio.create_task(self._loop())]
        if self.settings.metrics_urls:
            self._tasks.append(asyncio.create_task(self._scrape_loop()))
        return True

    async def stop(self) -> None:
        """Stop refreshing and close the queue. Idempotent."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._started:
            self._started = False
            await self.queue.teardown()

    def refresh_soon(self) -> None:
        """Read everything at the next chance (no sooner than ``refresh`` after the last)."""
        self._refresh_now.set()

    def now(self) -> float:
        return self._clock().timestamp()

    def _clock(self) -> datetime:
        return self.queue.runtime.clock()

    # -- the refresh loop -------------------------------------------------------------------

    async def _loop(self) -> None:
        signals = self.queue.runtime.signals
        next_full = time.monotonic() + self.settings.full_refresh
        while True:
            names = self._valid_names()
            since = signals.snapshot(names)
            timeout = self._next_wait(next_full)
            if timeout > 0:
                await self._wait(signals.wait(names, timeout, since))
            forced = self._refresh_now.is_set()
            self._refresh_now.clear()
            started = time.monotonic()
            try:
                if forced or started >= next_full:
                    await self.full_refresh()
                    next_full = started + self.settings.full_refresh
                else:
                    after = signals.snapshot(names)
                    changed = {name for name in names if after[name] != since[name]}
                    due = changed | self._moving(self.now())
                    if due:
                        await self.refresh_topics(due)
                self._note_error(None)
            except PawnQueueError as exc:
                self._note_error(exc)
            except Exception as exc:
                # Not the store's: still keep refreshing, and say so on the page.
                logger.exception("dashboard refresh failed")
                self._note_error(exc)
            # At most one round per refresh interval, whatever woke it.
            rest = self.settings.refresh - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _wait(self, signalled: Coroutine[Any, Any, bool]) -> None:
        """Until ``signalled`` returns or a page asks for a refresh."""
        waiter = asyncio.ensure_future(signalled)
        forced = asyncio.ensure_future(self._refresh_now.wait())
        try:
            await asyncio.wait({waiter, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, forced):
                task.cancel()
            # A failed look at the signals only means reading now; the refresh reports errors.
            await asyncio.gather(waiter, forced, return_exceptions=True)

    def _next_wait(self, next_full: float) -> float:
        now = time.monotonic()
        wait = next_full - now
        views = [v for v in self.topics.values() if v.valid and v.stats is not None]
        if any(v.stats is not None and v.stats.in_flight for v in views):
            wait = min(wait, self.settings.refresh)
        dues = [v.next_due for v in views if v.next_due is not None]
        if dues:
            wait = min(wait, max(0.0, min(dues) - self.now()))
        return max(0.0, wait)

    def _moving(self, now: float) -> set[str]:
        """Topics whose counts change without a signal: messages in flight, or come due."""
        return {
            name
            for name, view in self.topics.items()
            if view.valid
            and view.stats is not None
            and (view.stats.in_flight or (view.next_due is not None and view.next_due <= now))
        }

    def _valid_names(self) -> list[str]:
        return [name for name, view in self.topics.items() if view.valid]

    def _note_error(self, exc: Exception | None) -> None:
        message = None if exc is None else (str(exc).splitlines() or [type(exc).__name__])[0]
        if message != self.error:
            if message is not None:
                logger.warning("dashboard refresh failed error=%s", message)
            self.error = message
            self.version += 1

    # -- reading ----------------------------------------------------------------------------

    async def full_refresh(self) -> None:
        """Read the topic list, every topic's settings and counts, and the registry."""
        before = self.meter.counts.total()
        names = await self.queue.list_topics()
        listed = set(names)
        for gone in set(self.topics) - listed:
            del self.topics[gone]
            self.version += 1
        for name in names:
            if name not in self.topics:
                self.topics[name] = TopicView(name, valid=_valid_name(name))
                self.version += 1
        valid = [name for name in names if self.topics[name].valid]
        results = await gather_limited(
            _READ_CONCURRENCY, (self.queue.topic_settings(name) for name in valid)
        )
        for name, result in zip(valid, results, strict=True):
            view = self.topics[name]
            if isinstance(result, TopicNotFoundError):
                self.topics.pop(name, None)
                self.version += 1
            elif isinstance(result, BaseException):
                raise result
            elif result != view.settings:
                view.settings = result
                view.version += 1
                self.version += 1
        await self.refresh_topics(name for name in valid if name in self.topics)
        consumers = await self.queue.registry.list("consumers")
        producers = await self.queue.registry.list("producers")
        if (consumers, producers) != (self.consumers, self.producers):
            self.consumers, self.producers = consumers, producers
            self.version += 1
        self.last_full = self.now()
        self.full_cost = self.meter.counts.total() - before

    def idle_per_minute(self) -> float:
        """Requests per minute while nothing changes: the HEADs of the change signals, and
        the full refreshes at what the last one cost."""
        heads = 60.0 / self.settings.refresh if self.queue.config.notify.enabled else 0.0
        return round(heads + self.full_cost * 60.0 / self.settings.full_refresh, 1)

    async def refresh_topics(self, names: Iterable[str]) -> None:
        """Read the counts of ``names`` (three LISTs each) and record what changed."""
        wanted = [name for name in names if name in self.topics and self.topics[name].valid]
        results = await gather_limited(
            _READ_CONCURRENCY, (self._read_topic(self.topics[name]) for name in wanted)
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _read_topic(self, view: TopicView) -> None:
        store = self.queue.store
        name = view.name
        visibility = self.queue.config.polling.visibility_timeout_seconds
        messages = await store.list(layout.messages_prefix(name))
        leases = await store.list(layout.leases_prefix(name))
        dead = await store.list(layout.dead_letter_prefix(name))
        now = self._clock()
        counts = dict.fromkeys(("pending", "in_flight", "delayed"), 0)
        oldest: datetime | None = None
        next_due: datetime | None = None
        groups: Counter[str] = Counter()
        keys = []
        for listed in classify(name, messages, leases, now, visibility):
            counts[listed.state] += 1
            keys.append(listed.meta.key)
            if listed.pending.kind == "group":
                groups[listed.pending.group_hash] += 1
            if listed.state == "pending":
                oldest = listed.due if oldest is None else min(oldest, listed.due)
            elif listed.state == "delayed":
                next_due = listed.due if next_due is None else min(next_due, listed.due)
        age = (now - oldest).total_seconds() if oldest is not None else None
        stats = TopicStats(
            counts["pending"], counts["in_flight"], counts["delayed"], len(dead), age
        )
        key_set = frozenset(keys)
        dead_set = frozenset(m.key for m in dead)
        first = view.stats is None
        point = Point(
            at=now.timestamp(),
            pending=stats.pending,
            in_flight=stats.in_flight,
            delayed=stats.delayed,
            dead_letter=stats.dead_letter,
            published=0 if first else len(key_set - view.keys),
            settled=0 if first else len(view.keys - key_set),
            dead_lettered=0 if first else len(dead_set - view.dead_keys),
        )
        changed = (
            first
            or key_set != view.keys
            or dead_set != view.dead_keys
            or _counts(stats) != _counts(view.stats)
            or dict(groups) != view.groups
            or view.error is not None
        )
        view.stats, view.read_at, view.error = stats, now.timestamp(), None
        view.next_due = None if next_due is None else next_due.timestamp()
        view.keys, view.dead_keys, view.groups = key_set, dead_set, dict(groups)
        if changed:
            view.history.append(point)
            self._trim(view.history, point.at)
            view.version += 1
            self.version += 1

    def _trim(self, points: deque[Point] | deque[FlowPoint], now: float) -> None:
        while points and points[0].at < now - self.settings.history_seconds:
            points.popleft()

    # -- on demand (cached until the topic changes) -----------------------------------------

    async def peek(self, topic: str) -> list[PeekedMessage]:
        """The head of the topic (cached while the topic's counts stay the same)."""
        view = self.topics.get(topic)
        cached = self._peeks.get(topic)
        if view is not None and cached is not None and cached[0] == view.version:
            return cached[1]
        peeked = await self.queue.peek(topic, limit=PEEK_LIMIT)
        for message in peeked:
            if message.group is not None:
                self.group_names[layout.group_hash(message.group)] = message.group
        if view is not None:
            self._peeks[topic] = (view.version, peeked)
        return peeked

    async def dead_letters(self, topic: str) -> list[DeadLetter]:
        """The topic's oldest dead letters (at most DEAD_LETTER_LIMIT; cached likewise)."""
        view = self.topics.get(topic)
        cached = self._letters.get(topic)
        if view is not None and cached is not None and cached[0] == view.version:
            return cached[1]
        letters = await self.queue.dead_letters(topic, limit=DEAD_LETTER_LIMIT)
        if view is not None:
            self._letters[topic] = (view.version, letters)
        return letters

    async def changed(self, topic: str) -> None:
        """Read ``topic`` now: an action of the dashboard changed it."""
        if topic in self.topics:
            await self.refresh_topics([topic])

    # -- Prometheus -------------------------------------------------------------------------

    async def _scrape_loop(self) -> None:
        while True:
            deltas = await self.scraper.scrape()
            now = self.now()
            for topic, (published, acked, dead_lettered) in deltas.items():
                view = self.topics.get(topic)
                if view is None:
                    continue
                view.flow.append(FlowPoint(now, published, acked, dead_lettered))
                self._trim(view.flow, now)
                if published or acked or dead_lettered:
                    view.version += 1
                    self.version += 1
            await asyncio.sleep(self.settings.refresh)


def _counts(stats: TopicStats | None) -> tuple[int, ...] | None:
    if stats is None:
        return None
    return (stats.pending, stats.in_flight, stats.delayed, stats.dead_letter)


def _valid_name(name: str) -> bool:
    try:
        layout.validate_name(name, "topic name")
    except ConfigError:
        return False
    return True
