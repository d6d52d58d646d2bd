"""The dashboard's picture of the queue, kept in memory while it runs, and how it stays fresh
at little cost.

A :class:`Monitor` reads every topic once at start, then:

- waits on the change signals (:class:`~pawn_queue._protocol.notify.ChangeSignals`,
  checked with one HEAD of the signal ring's next key every ``refresh`` seconds while
  nothing changes) and re-reads only the topics a producer signalled;
- re-reads, every ``refresh`` seconds, the topics whose state moves without a signal: those
  with messages in flight (their consumers ack, which signals nothing) and those whose
  delayed messages came due;
- re-reads a topic whose exporters (``metrics_urls``) counted messages going;
- reads everything (topics, counts, settings, registry) every ``full_refresh`` seconds.

Acks and claims signal nothing, so that alone leaves counts up to ``full_refresh`` old.
What a page shows is therefore read again when the page (or its script, every ``refresh``
seconds) asks for it and it is ``refresh`` seconds old (:meth:`Monitor.look`): the
overview's topic list and every topic's counts, a topic page's counts. While no page is
open that costs nothing; while one is, its reads every ``refresh`` seconds (the footer
says how many). A page naming a topic the dashboard does not know yet looks for it (one
GET of its marker).

A topic's subscriptions are read only while a page of the topic is open, when they are
``refresh`` seconds old; the schedules likewise while the schedules page is open. What each
read costs and tells, and how concurrent pages share one, is
:class:`~pawn_queue.dashboard.reader.Reader`'s. Pages render from memory: looking costs
those reads, and the peeks and dead letters a page shows (kept until the topic changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from pawn_queue._protocol import layout
from pawn_queue._protocol.topics import PeekedMessage
from pawn_queue.client import PawnQueue
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.dashboard.prometheus import Scraper
from pawn_queue.dashboard.reader import Reader, valid_name
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dashboard.views import FlowPoint, TopicView
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.exceptions import PawnQueueError, TopicNotFoundError

logger = logging.getLogger(__name__)

PEEK_LIMIT = 10
DEAD_LETTER_LIMIT = 100
OVERVIEW = ""  # what :meth:`Monitor.look` is asked for by the overview: every topic
SCHEDULES = "_schedules"  # by the schedules page (no topic has a name starting with _)
LIMITS = "_limits"  # by the limits page
_MISSING_KEPT = 1000  # names of topics found missing lately, kept to answer 404s cheaply


class Monitor(Reader):
    """Keeps :class:`TopicView`s and the registry fresh (when to read what; the reading is
    :class:`Reader`'s); answers the pages from memory."""

    def __init__(self, queue: PawnQueue, meter: RequestMeter, settings: DashboardSettings) -> None:
        super().__init__(queue, meter, settings)
        self.group_names: dict[str, str] = {}  # group hash -> name, learnt from peeks
        self.scraper = Scraper(settings.metrics_urls)
        self._peeks: dict[str, tuple[int, list[PeekedMessage]]] = {}
        # (topic, subscription) -> the topic's version when read, and its dead letters
        self._letters: dict[tuple[str, str | None], tuple[int, list[DeadLetter]]] = {}
        self._missing: dict[str, float] = {}  # topic -> until when it is known missing
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
        tasks = [*self._tasks, *self._reads.values()]
        self._tasks = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._started:
            self._started = False
            await self.queue.teardown()

    def refresh_soon(self) -> None:
        """Read everything at the next chance (no sooner than ``refresh`` after the last),
        and the schedules when their page is next looked at."""
        self.schedules_read_at = None
        self.limits_read_at = None
        self._refresh_now.set()

    # -- what a page shows ------------------------------------------------------------------

    async def look(self, subject: str, *, discover: bool = False) -> TopicView | None:
        """A page is about to show ``subject``: :data:`OVERVIEW` (the topic list and every
        topic's counts), :data:`SCHEDULES` (the schedules and their stats) or a topic's name
        (its counts). Read again what of it is ``refresh`` seconds old, so that no page
        shows older counts. ``discover``: look in the store for a topic the dashboard does
        not know yet. Returns the topic's view (None: no such topic, or another subject). A
        failed read shows on the page as any refresh's; a failed look for an unknown topic
        raises the store's error."""
        view = None
        if subject not in (OVERVIEW, SCHEDULES, LIMITS):
            view = self.topics.get(subject)
            if view is None and discover:
                view = await self._discover(subject)
            if view is None:
                return None
        before = self.meter.counts.total()
        try:
            if subject == SCHEDULES:
                read = await self._read_stale_schedules()
            elif subject == LIMITS:
                read = await self._read_stale_limits()
            else:
                read = await self._read_stale(view)
        except PawnQueueError as exc:
            self._note_error(exc)
            return view
        except Exception as exc:
            logger.exception("dashboard read failed")
            self._note_error(exc)
            return view
        if read:
            self._note_error(None)
            self.look_cost[subject] = self.meter.counts.total() - before
        return view

    async def _read_stale(self, view: TopicView | None) -> bool:
        """Read what is ``refresh`` seconds old of ``view`` (None: of the overview); whether
        anything was."""
        listed = False
        if view is None:
            if self._stale(self._listed_at):
                await self._read_settings(await self._once("topics", self._list_topics))
                listed = True
            names = [n for n, v in self.topics.items() if v.valid and self._stale_view(v)]
        else:
            names = [view.name] if view.valid and self._stale_view(view) else []
            if view.valid and self._stale(view.subscriptions_read_at):
                subscriptions = self._once(
                    f"subscriptions/{view.name}", lambda: self._read_subscriptions(view)
                )
                await asyncio.gather(self.refresh_topics(names), subscriptions)
                return True
        await self.refresh_topics(names)
        return listed or bool(names)

    async def _read_stale_schedules(self) -> bool:
        """Read the schedules if they are ``refresh`` seconds old; whether they were."""
        if not self._stale(self.schedules_read_at):
            return False
        await self._once(SCHEDULES, self._read_schedules)
        return True

    async def _read_stale_limits(self) -> bool:
        """Read the limits if they are ``refresh`` seconds old; whether they were."""
        if not self._stale(self.limits_read_at):
            return False
        await self._once(LIMITS, self._read_limits)
        return True

    def _stale(self, read_at: float | None) -> bool:
        return read_at is None or self.now() - read_at >= self.settings.refresh

    def _stale_view(self, view: TopicView) -> bool:
        return self._stale(view.read_at if view.stats is not None else None)

    async def _discover(self, name: str) -> TopicView | None:
        """The view of topic ``name`` if the store has it (one GET of its marker), else None;
        a name found missing is not looked for again within ``refresh`` seconds."""
        now = self.now()
        if not valid_name(name) or self._missing.get(name, float("-inf")) > now:
            return None
        try:
            settings = await self.queue.topic_settings(name)
        except TopicNotFoundError:
            if len(self._missing) >= _MISSING_KEPT:
                self._missing.clear()
            self._missing[name] = now + self.settings.refresh
            return None
        view = self.topics.get(name)
        if view is None:
            view = self.topics[name] = TopicView(name, settings=settings)
            self.version += 1
        return view

    def open_per_minute(self, subject: str | None) -> float:
        """Requests per minute while nothing changes and a page showing ``subject`` is open
        (None: a page that reads nothing): :meth:`idle_per_minute` and, every ``refresh``
        seconds, what the last look of it cost."""
        looks = self.look_cost.get(subject, 0) if subject is not None else 0
        return round(self.idle_per_minute() + looks * 60.0 / self.settings.refresh, 1)

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

    def idle_per_minute(self) -> float:
        """Requests per minute while nothing changes and no page is open: the HEADs of the
        change signals, and the full refreshes at what the last one cost."""
        heads = 60.0 / self.settings.refresh if self.queue.config.notify.enabled else 0.0
        return round(heads + self.full_cost * 60.0 / self.settings.full_refresh, 1)

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

    async def dead_letters(self, topic: str, subscription: str | None = None) -> list[DeadLetter]:
        """The oldest dead letters of the topic (or of one of its subscriptions): at most
        DEAD_LETTER_LIMIT, cached while the topic's counts (its subscriptions' with them)
        stay the same."""
        view = self.topics.get(topic)
        cached = self._letters.get((topic, subscription))
        if view is not None and cached is not None and cached[0] == view.version:
            return cached[1]
        letters = await self.queue.dead_letters(
            topic, subscription=subscription, limit=DEAD_LETTER_LIMIT
        )
        if view is not None:
            self._letters[(topic, subscription)] = (view.version, letters)
        return letters

    async def changed(self, topic: str) -> None:
        """Read ``topic`` now: an action of the dashboard changed it (or its subscriptions,
        whose counts are read again with the next page)."""
        for key in [key for key in self._letters if key[0] == topic]:
            del self._letters[key]
        view = self.topics.get(topic)
        if view is not None:
            view.subscriptions_read_at = None
            await self.refresh_topics([topic])

    # -- Prometheus -------------------------------------------------------------------------

    async def _scrape_loop(self) -> None:
        while True:
            deltas = await self.scraper.scrape()
            now = self.now()
            moved = []
            for topic, (published, acked, dead_lettered) in deltas.items():
                view = self.topics.get(topic)
                if view is None:
                    continue
                view.flow.append(FlowPoint(now, published, acked, dead_lettered))
                self._trim(view.flow, now)
                if published or acked or dead_lettered:
                    view.version += 1
                    self.version += 1
                    moved.append(topic)
            # Counted going by an exporter: its counts changed, though no signal said so.
            try:
                await self.refresh_topics(moved)
            except PawnQueueError as exc:
                self._note_error(exc)
            except Exception as exc:
                logger.exception("dashboard read failed")
                self._note_error(exc)
            await asyncio.sleep(self.settings.refresh)
