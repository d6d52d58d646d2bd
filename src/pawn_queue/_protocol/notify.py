"""Change signals: how an idle consumer learns that a topic has new messages.

After publishing, a producer writes the next version of the signal log
(:mod:`pawn_queue._protocol.signal_log`), which names the topics changed in the last
seconds, to the key of the signal ring that version goes to (coalesced per topic, off the
publish's critical path; :mod:`pawn_queue._protocol.signal_ring`). A new version is written
at most once per ``notify.signal_interval_seconds`` across every process
(:mod:`pawn_queue._protocol.signal_writer`), so each of the ring's 16 keys at most once per
16 intervals; a signal that had to wait for that says the topic is busy, and watchers
elsewhere then have its consumers list it every few checks until it is not (docs/protocol.md,
"Request rates"). A process whose consumers are idle HEADs the key of the next version every
``notify.check_interval_seconds`` (slowing down to ``idle_check_interval_seconds`` after 10 s
without a change); only when it changed does it GET it, and wake the consumers of the
topics named since the version it saw last. Within one process, a publish (or a lease given
back) wakes the idle consumers of its topic at once, with no request.

Each topic has a generation here that every change bumps; a consumer lists a topic only
when its generation moved since the consumer's last listing, or when that listing said
something comes due (:mod:`pawn_queue._protocol.freshness`). Correctness never depends on a
signal: a sweep bumps each topic consumed here at least every
``notify.sweep_interval_seconds``, at most one topic every ``notify.sweep_pace_seconds`` (a
producer killed before its signal), so idle topics cost a bounded number of LISTs a minute
whatever their number (docs/protocol.md, rule 14).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from pawn_queue._protocol import layout
from pawn_queue._protocol.local_signals import LocalSignals
from pawn_queue._protocol.shares import Shares
from pawn_queue._protocol.signal_log import SignalLog, decode, merge_names
from pawn_queue._protocol.signal_ring import RingReader, SignalRing
from pawn_queue._protocol.signal_writer import LIMITED_INTERVAL_SECONDS, WARM_CHECKS, SignalWriter
from pawn_queue.config import NotifyConfig
from pawn_queue.exceptions import NotFound, StoreError
from pawn_queue.store.base import Store

logger = logging.getLogger(__name__)

_WATCH_GRACE_CHECKS = 50  # checks the watch goes on after the last wait ended
_BUSY_SECONDS = 10.0  # after a change, check at the fast interval this long
# Looks between two changes of the root by others: when those come further apart than this
# many check intervals, the looks are spaced to 1/_LOOKS_PER_CHANGE of the shortest of the
# last _CHANGE_GAPS gaps between them. A wake-up then waits at most a quarter of that gap
# (an eighth on average), and a message of a trickle pays four looks, not one per check.
_LOOKS_PER_CHANGE = 4
_CHANGE_GAPS = 3
_ROOT_LOOKS = 10  # every this many looks, one at 0.2.0's root (its producers write there)
_CLOSE_SECONDS = 2.0
_MAX_HINTS = 256  # keys hinted to a topic's consumers at most; past it, they list
_HINTED_SECONDS = 30.0  # a name hinted is not hinted again for this long (entries last 10 s)
_HINTED_MEMORY = 4096


class ChangeSignals:
    """Marks topics for other processes and watches their marks, over one store."""

    def __init__(self, store: Store, config: NotifyConfig, shares: Shares | None = None) -> None:
        """``shares``: the consumer processes sharing the queues watched here; n of them
        each check the root n times less often (:attr:`_watch_gap`)."""
        self._store = store
        self._config = config
        self._shares = shares
        self.local = LocalSignals()
        self._named: dict[str, Callable[[], None]] = {}  # signals that are not topics'
        # topic -> the names of the objects to signal (None: unknown, "list it")
        self._to_mark: dict[str, frozenset[str] | None] = {}
        self._last_marked: dict[str, float] = {}
        # The writer and the watch share what they know of the signal ring.
        ring = SignalRing(store)
        self._writer = SignalWriter(
            store,
            ring,
            config.signal_interval_seconds,
            config.check_interval_seconds,
            slots=config.slot_signals,
        )
        self._marker: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._look_lock = asyncio.Lock()
        self._reader = RingReader(ring)
        self._seq: int | None = None  # the version of the signal log seen last (0: none yet)
        self._looks = 0
        self._root: str | None = None  # last seen etag of 0.2.0's root _notify/_
        self._hints: dict[str, set[str]] = {}  # topic -> object keys named, not yet taken
        # topic -> how many messages of each priority (1-9) were published or named here: a
        # consumer drops what its last listing left once one of a higher priority came.
        self._prioritised: dict[str, list[int]] = {}
        self._hinted_at: dict[str, float] = {}  # key -> when it was hinted (monotonic)
        # Topics whose last signal came late (busy), until when they count as busy, and
        # when they were last listed for it (monotonic).
        self._busy_until: dict[str, float] = {}
        self._warmed: dict[str, float] = {}
        self._checked = 0.0  # when the last look at the store succeeded
        self._look_began = -1.0  # when the last look that succeeded began (monotonic)
        self._moved_at = float("-inf")  # when a look last found the root changed
        self._changed_at = float("-inf")  # when a look last found another process's change
        self._change_gaps: list[float] = []  # the last gaps between those (seconds)
        # The topics consumed here, and when a consumer here last began to list each: the
        # sweep bumps the one looked at longest ago.
        self._watched: dict[str, float] = {}
        self._swept = time.monotonic()
        self._waiting = 0  # waits in progress: the watch runs as long as any lasts
        self._last_wait = 0.0  # when the last wait (or poll) ended
        self._closing = False
        self._close_requested = asyncio.Event()

    # -- producer side ----------------------------------------------------------------------

    def published(self, topic: str, key: str | None = None) -> None:
        """A message was written to ``topic`` (at ``key``, if given: a message visible now;
        else given back, or anything a consumer must list to find): wake local consumers,
        signal other processes."""
        if layout.is_retained_log(topic):
            return  # nobody consumes it
        if key is not None:
            self._count_priority(topic, key)
        self.local.changed(topic)
        if not self._config.enabled:
            return
        name = None if key is None else frozenset([key.rpartition("/")[2]])
        marked = self._to_mark.get(topic, frozenset())
        self._to_mark[topic] = merge_names(marked, name) if topic in self._to_mark else name
        if self._marker is None or self._marker.done():
            self._marker = asyncio.create_task(self._mark_loop())

    async def _mark_loop(self) -> None:
        # One mark per topic per check interval is all a watcher can tell apart.
        while self._to_mark:
            now = time.monotonic()
            due = {
                t: names
                for t, names in self._to_mark.items()
                if self._closing or now - self._last_marked.get(t, 0.0) >= self._gap
            }
            if not due:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._close_requested.wait(), self._gap / 2)
                continue
            for topic in due:
                del self._to_mark[topic]
            try:
                # Closing: write at once (one early write per process at most), or a process
                # that publishes and exits would linger for the interval.
                await self._writer.signal(due, at_once=self._closing)
            except StoreError as exc:
                # A lost signal only delays delivery until the sweep.
                logger.warning("change signal failed topics=%s error=%s", sorted(due), exc)
            for topic in due:
                self._last_marked[topic] = now

    async def marked(self) -> None:
        """Return once the signals pending here are written (or given up on)."""
        while self._marker is not None and not self._marker.done():
            await asyncio.shield(self._marker)

    @property
    def _gap(self) -> float:
        return self._config.check_interval_seconds

    # -- consumer side ----------------------------------------------------------------------

    def snapshot(self, topics: Iterable[str]) -> dict[str, int]:
        return self.local.snapshot(topics)

    def generation(self, topic: str) -> int:
        """The topic's change count here: it moves with every change seen for it that calls
        for a listing (not with objects named to its consumers)."""
        return self.local.generation(topic)

    @property
    def backfill_seconds(self) -> float:
        """How often a topic whose messages come named by signals is listed all the same."""
        return self._config.backfill_interval_seconds

    def idle_wait(self, poll_interval: float) -> float:
        """How long an idle consumer waits at most before it looks again (with signals on,
        a look that finds nothing changed lists nothing)."""
        return self._config.backfill_interval_seconds if self._config.enabled else poll_interval

    def on_signal(self, name: str, heard: Callable[[], None]) -> None:
        """Call ``heard`` when a signal for ``name`` comes (one of this process's or
        another's) or the root cannot tell what changed. ``name`` is not a topic's (those
        never start with ``_``): ``layout.LISTENERS_CHANGED``, ``layout.PAUSES_CHANGED``."""
        self._named[name] = heard

    def watch(self, topics: Iterable[str]) -> None:
        """Consumers here consume ``topics``: wake them on their slots' changes, sweep them."""
        now = time.monotonic()
        for topic in topics:
            self._watched.setdefault(topic, now)

    def listed(self, topic: str) -> None:
        """A consumer here begins a listing of ``topic``: the sweep need not bump it soon."""
        self._watched[topic] = time.monotonic()

    async def refresh(self) -> bool:
        """Bring the topics' generations up to every signal in the store now, give or take
        one check of a running watch (then nothing is sent; else a HEAD, and a LIST if the
        root changed). False when signals are off or the store did not answer: only a
        listing tells then."""
        if not self._config.enabled:
            return False
        self._last_wait = time.monotonic()  # a poll keeps the watch going, as a wait does
        running = self._watcher is not None and not self._watcher.done()
        # A watch that failed its last checks knows nothing new: look here, or list.
        asked = time.monotonic()
        if running and asked - self._checked <= 2 * self._idle_gap() + 1.0:
            return True
        try:
            await self._look(since=asked)
        except StoreError as exc:
            logger.warning("change-signal look failed error=%s", exc)
            return False
        self._start_watcher()
        return True

    async def wait(
        self, topics: Iterable[str], within: float, since: dict[str, int] | None = None
    ) -> bool:
        """Wait until one of ``topics`` may have new messages, at most ``within`` seconds."""
        names = list(topics)
        self._waiting += 1
        try:
            if self._config.enabled:
                new = [topic for topic in names if topic not in self._watched]
                self.watch(new)
                if not await self.refresh():
                    # Transient: the caller polls on (listing), and the next wait looks again.
                    return await self.local.wait(names, min(within, self._gap), since)
                if new:
                    # A caller that listed before these topics were watched would miss a
                    # signal between its listing and the first look: have it poll once more.
                    return True
            return await self.local.wait(names, within, since)
        finally:
            self._waiting -= 1
            self._last_wait = time.monotonic()

    def _start_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._swept = time.monotonic()  # the sweep's pace counts from here
            self._watcher = asyncio.create_task(self._watch())

    async def _look(self, since: float | None = None) -> bool:
        """Read the ring's key of the next version of the signal log (a HEAD, and a GET if
        it changed; a GET alone if another process wrote in the last ``_BUSY_SECONDS``);
        wake the topics a new version names since the version seen last (every watched
        topic if it cannot tell). Every ``_ROOT_LOOKS``-th look also HEADs 0.2.0's root.
        True if another process wrote a version. With ``since``, a look that began after
        that time (polls asking together) is enough."""
        async with self._look_lock:
            if since is not None and self._look_began >= since:
                return False
            began = time.monotonic()
            if self._reader.version is None:
                # The first look only learns where things stand.
                self._seq = (await self._reader.start()).seq
                self._root = await self._root_etag()
                self._checked = self._look_began = began
                return False
            if self._reader.saw_own():  # not a sign that others write
                self._moved_at = float("-inf")
            self._looks += 1
            moved = self._looks % _ROOT_LOOKS == 0 and await self._look_at_root()
            found, restarted = await self._reader.next(busy=began - self._moved_at < _BUSY_SECONDS)
            now = time.monotonic()
            if restarted:
                logger.info("the change-signal ring was begun again; every topic is looked at")
                self._wake(None, now)
            elif found is not None:
                if not found.mine:  # not a sign that others write
                    self._moved_at = now
                    self._changed(now)
                    moved = True
                self._wake(found.log, now)
            self._seq = self._reader.seen
            self._checked, self._look_began = now, began
            return moved

    async def _look_at_root(self) -> bool:
        """HEAD 0.2.0's root, and GET it if it changed: a 0.2.0 producer's signal (a token:
        every watched topic is woken), or a copy of a version (``notify.slot_signals``),
        whose changes are woken if the ring has not shown them yet. True if it moved."""
        etag = await self._root_etag()
        if etag == self._root:
            return False
        self._root = etag
        if etag is None or self._writer.wrote_root(etag):
            return False
        _, log = await self._root_log()
        if log is not None and self._seq is not None and log.seq <= self._seq:
            return False
        self._wake(log, time.monotonic())
        return True

    def _changed(self, now: float) -> None:
        if self._changed_at > float("-inf"):
            self._change_gaps = [*self._change_gaps[1 - _CHANGE_GAPS :], now - self._changed_at]
        self._changed_at = now

    def _wake(self, log: SignalLog | None, now: float) -> None:
        """Wake the watched topics that ``log`` names since the version seen last; all of
        them when it cannot tell (a 0.2.0 root, the root gone, entries dropped unseen)."""
        watched = set(self._watched) | self.local.waited_on()
        changes = None if log is None else log.after(self._seq)
        if changes is None:
            for topic in watched:
                self.local.changed(topic)
            for callback in self._named.values():
                callback()
            return
        for change in changes:
            if change.topic in self._named:
                self._named[change.topic]()
            if change.topic not in watched:
                continue
            self._note_busy(change.topic, change.busy, now)
            # Names go to this process's consumers (busy: warm listings come anyway); a
            # topic only waited on (the dashboard, a Spark source) counts it as a change.
            named = None if self._seq is None else change.named_after(self._seq)
            if named is None or change.busy or change.topic not in self._watched:
                self.local.changed(change.topic)
            else:
                self._hint(change.topic, named)

    def _hint(self, topic: str, names: Iterable[str]) -> None:
        """Have the topic's consumers here claim these objects, without a listing. A name
        already hinted lately (a later entry of the topic repeats the earlier names) is not
        hinted again."""
        now = time.monotonic()
        if len(self._hinted_at) > _HINTED_MEMORY:
            self._hinted_at = {
                k: t for k, t in self._hinted_at.items() if now - t < _HINTED_SECONDS
            }
        prefix = layout.messages_prefix(topic)
        keys = {prefix + name for name in names} - self._hinted_at.keys()
        if not keys:
            return
        self._hinted_at.update(dict.fromkeys(keys, now))
        for key in keys:
            self._count_priority(topic, key)
        hints = self._hints.setdefault(topic, set())
        hints |= keys
        if len(hints) > _MAX_HINTS:  # nobody here takes them: list instead
            del self._hints[topic]
            self.local.changed(topic)
        else:
            self.local.hinted(topic)

    def _count_priority(self, topic: str, key: str) -> None:
        if priority := layout.priority_of(key):
            self._prioritised.setdefault(topic, [0] * len(layout.PRIORITIES))[priority] += 1

    def prioritised(self, topic: str) -> tuple[int, ...]:
        """How many messages of each priority were published to ``topic`` or named by its
        signals here so far (compare two with :func:`outranks`)."""
        return tuple(self._prioritised.get(topic, [0] * len(layout.PRIORITIES)))

    def take_hints(self, topic: str) -> list[str]:
        """The keys of ``topic``'s objects that signals named since the last call, in key
        order: the caller claims them, or (any it leaves) has the topic listed
        (``local.changed``)."""
        return sorted(self._hints.pop(topic, ()))

    def _note_busy(self, topic: str, busy: bool, now: float) -> None:
        if busy:
            # Until the signal after next would have come: a later one says again.
            # (A writer's interval is 1 s or more where the store limits writes per key.)
            interval = max(self._config.signal_interval_seconds, LIMITED_INTERVAL_SECONDS)
            self._busy_until[topic] = now + 2 * interval
            self._warmed[topic] = now
        else:
            self._busy_until.pop(topic, None)

    def _warm(self) -> None:
        """Wake the consumers here of the busy topics every ``WARM_CHECKS`` check
        intervals: they list them without waiting for the signal interval."""
        now = time.monotonic()
        for topic, until in list(self._busy_until.items()):
            if until <= now:
                del self._busy_until[topic]
            elif now - self._warmed.get(topic, 0.0) >= WARM_CHECKS * self._watch_gap:
                self._warmed[topic] = now
                self.local.changed(topic)

    def _sweep(self) -> None:
        """Bump the topics looked at longest ago, one per pace, once they waited a sweep
        interval: their consumers list them, whatever the signals said."""
        pace = self._config.sweep_pace_seconds
        now = time.monotonic()
        # Whole paces since the last step, never more than one check's worth: no burst
        # after a pause (the remainder is dropped, so the rate stays at most 1 per pace).
        steps = min(int((now - self._swept) / pace), max(1, int(self._idle_gap() / pace)))
        if not steps:
            return
        self._swept = now
        oldest = sorted(self._watched.items(), key=lambda item: item[1])[:steps]
        for topic, looked in oldest:
            if now - looked >= self._config.sweep_interval_seconds:
                self._watched[topic] = now
                self.local.changed(topic)

    async def _watch(self) -> None:
        gap = self._watch_gap
        last_change = time.monotonic()
        failing = False
        # Watch while anyone waits, however long, and a while after the last wait or poll
        # ended: consumers alternate polls and waits.
        while self._waiting or time.monotonic() - self._last_wait < _WATCH_GRACE_CHECKS * self._gap:
            await asyncio.sleep(gap)
            self._sweep()
            self._warm()
            try:
                moved = await self._look()
            except StoreError as exc:
                # Transient, as a rule: check again, less often. Polls list meanwhile.
                if not failing:
                    logger.warning("change-signal check failed error=%s; retrying", exc)
                failing = True
                gap = min(gap * 2, self._idle_gap())
                continue
            if failing:
                logger.info("change-signal checks work again")
                failing = False
            if moved:
                gap, last_change = self._busy_gap(), time.monotonic()
            elif time.monotonic() - last_change > _BUSY_SECONDS:
                # Quiet: check less often, up to the idle interval (cheaper, slower).
                gap = min(gap * 1.5, self._idle_gap())
            else:
                gap = self._busy_gap()

    def _idle_gap(self) -> float:
        return max(self._watch_gap, self._config.idle_check_interval_seconds)

    def _busy_gap(self) -> float:
        """The gap between looks while the root changes: :attr:`_watch_gap`, or, when the
        others' changes come further apart, ``1 / _LOOKS_PER_CHANGE`` of the shortest of
        their last gaps (one short gap, a burst beginning, is enough to look fast again),
        up to the idle interval."""
        if len(self._change_gaps) < _CHANGE_GAPS:
            return self._watch_gap
        spaced = min(self._change_gaps) / _LOOKS_PER_CHANGE
        return max(self._watch_gap, min(spaced, self._idle_gap()))

    @property
    def _watch_gap(self) -> float:
        """The check interval, times the number of processes sharing the queues watched here
        (the fewest of any), up to ``shared_check_interval_seconds``: together they check as
        often as one would."""
        fleet = 1 if self._shares is None else self._shares.fewest(self._watched)
        longest = self._config.shared_check_interval_seconds
        return max(self._gap, min(self._gap * fleet, longest))

    async def _root_etag(self) -> str | None:
        try:
            return (await self._store.head(layout.NOTIFY_ROOT)).etag
        except NotFound:
            return None

    async def _root_log(self) -> tuple[str | None, SignalLog | None]:
        try:
            stored = await self._store.get(layout.NOTIFY_ROOT)
        except NotFound:
            return None, None
        return stored.meta.etag, decode(stored.data)

    async def close(self) -> None:
        """Stop watching; give pending marks a last chance to go out."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._marker is not None and not self._marker.done():
            self._closing = True
            self._close_requested.set()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._marker, _CLOSE_SECONDS)


def outranks(now: tuple[int, ...], then: tuple[int, ...], priority: int) -> bool:
    """Whether a message of a priority above ``priority`` came between the counts ``then``
    and ``now`` of :meth:`ChangeSignals.prioritised`."""
    return now[priority + 1 :] != then[priority + 1 :]
