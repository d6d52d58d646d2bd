"""The schedule runner: fires the ticks of every schedule on a store, with the other
runners, once each (docs/concepts/schedules.md).

A runner fires a tick by creating its marker (create-only): of all runners, exactly one
create succeeds, and that runner publishes. A runner that lost (or could not tell) looks
again ``GRACE_SECONDS`` later and publishes with the same dedup id if the winner did not.
A runner that starts looks so at the ticks of the catch-up window that have a marker: the
runners that lost them, which would have looked, may have stopped since. The topic's dedup
window must outlast the latest of these looks (``dedup_window_needed``, which
``create_schedule`` checks); a window lowered since is logged once per schedule.

The queue's observers hear of each tick this runner published (``schedule_fired``, with how
late) and of the missed ticks it recorded in a marker (``schedule_missed``): across runners,
each tick is reported once (:mod:`pawn_queue.metrics` counts them).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.dedup import decode_marker
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.schedules import (
    GRACE_SECONDS,
    Publish,
    Schedule,
    decode_schedule,
    dedup_id,
    dedup_window_needed,
    marker_body,
    schedule_name_of,
    tick_attributes,
    tick_iso,
)
from pawn_queue.exceptions import (
    AlreadyExists,
    NotFound,
    PawnQueueError,
    StoreUnavailableError,
)
from pawn_queue.store.base import LIST_PAGE, Store

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0
"""How often a runner LISTs the definitions: a pause, resume or change applies that late."""
IDLE_REFRESH_SECONDS = 60.0
"""How often, at most, while the queue has no schedule: each empty LIST doubles the pause
up to this (every worker runs a runner; most queues have no schedule)."""
SWEEP_SECONDS = 600.0
"""A runner that won a tick sweeps the schedule's old markers at most this often."""


@dataclass
class _Running:
    """What one runner knows of one schedule."""

    schedule: Schedule
    etag: str
    last: datetime
    """The newest tick this runner has dealt with (fired, lost or missed)."""
    missed: int = 0
    """Ticks skipped since the last marker, recorded in the next one this runner wins."""
    next_tick: datetime | None = None
    attempt_at: datetime | None = None
    """When this runner tries ``next_tick``: the tick plus its random jitter."""
    swept_at: datetime | None = None
    short_window: bool = False
    """Its topic's dedup window was found too short for it (and that was logged, once)."""


@dataclass(order=True, frozen=True)
class _Check:
    """A tick whose marker another runner created: see at ``at`` that it was published."""

    at: datetime
    name: str
    tick: datetime


class ScheduleRunner:
    """Fires the ticks of every schedule on the store, with the other runners, once each.

    :meth:`run` loops until cancelled; tests drive :meth:`refresh` and :meth:`step` with an
    injected clock instead.
    """

    def __init__(
        self,
        runtime: Runtime,
        publish: Publish,
        *,
        runner_id: str | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        idle_refresh_seconds: float = IDLE_REFRESH_SECONDS,
        grace_seconds: float = GRACE_SECONDS,
        rng: random.Random | None = None,
    ) -> None:
        self._runtime = runtime
        self._store = runtime.store
        self._publish = publish
        self._observers = runtime.observers
        self.runner_id = runner_id or str(uuid.uuid4())
        self._refresh_seconds = refresh_seconds
        self._idle_refresh_seconds = idle_refresh_seconds
        self._grace = timedelta(seconds=grace_seconds)
        self._rng = rng or random.Random()
        self._running: dict[str, _Running] = {}
        self._checks: list[_Check] = []
        self.won = 0
        """Ticks this runner fired (its marker create succeeded)."""

    async def run(self) -> None:
        """Refresh the definitions every few seconds and fire what is due, until cancelled.
        Errors are logged and retried: a runner outlives a store's bad minute or a deleted topic."""
        loop = asyncio.get_running_loop()
        next_refresh = loop.time()
        pause = self._refresh_seconds
        while True:
            try:
                if loop.time() >= next_refresh:
                    await self.refresh()
                    pause = (
                        self._refresh_seconds
                        if self._running
                        else min(2 * pause, self._idle_refresh_seconds)
                    )
                    next_refresh = loop.time() + pause
                wait = await self.step()
            except (PawnQueueError, OSError) as error:
                # A store's bad minute, or a schedule's topic deleted: the others keep firing.
                logger.warning("schedules: %s; trying again in 1 s", error)
                wait = 1.0
            await asyncio.sleep(max(0.0, min(wait, next_refresh - loop.time())))

    async def refresh(self) -> None:
        """LIST the definitions, GET the changed ones; drop the deleted ones."""
        metas = await self._store.list(layout.SCHEDULES)
        seen: dict[str, str] = {}
        for meta in metas:
            name = schedule_name_of(meta.key)
            if name is not None:
                seen[name] = meta.etag
        for name in set(self._running) - set(seen):
            del self._running[name]
        for name, etag in seen.items():
            running = self._running.get(name)
            if running is not None and running.etag == etag:
                continue
            try:
                found = await self._store.get(layout.schedule_key(name))
                schedule = decode_schedule(found.data)
            except NotFound:
                continue
            except ValueError as error:
                logger.warning("schedule %r cannot be read: %s", name, error)
                continue
            await self._adopt(schedule, found.meta.etag, running)

    async def _adopt(self, schedule: Schedule, etag: str, running: _Running | None) -> None:
        now = self._runtime.clock()
        if running is None:
            # Paused, it starts now: ticks while paused are neither fired nor missed.
            marked = [] if schedule.paused else await self._marked_ticks(schedule, now)
            first = now if schedule.paused else self._first(schedule, now)
            running = _Running(schedule, etag, max(marked, default=first))
            self._running[schedule.name] = running
            late = now - timedelta(seconds=schedule.catch_up_seconds + schedule.jitter_seconds)
            for tick in marked:
                if tick >= late:
                    self._expect(schedule.name, tick, tick)
        elif running.schedule.paused and not schedule.paused:
            running.last = max(running.last, now)  # ticks while paused are neither fired nor missed
        running.schedule, running.etag = schedule, etag
        running.next_tick = running.attempt_at = None  # the rule may have changed

    async def _marked_ticks(self, schedule: Schedule, now: datetime) -> list[datetime]:
        """The ticks whose markers are kept: this runner starts after the newest."""
        oldest = now - timedelta(seconds=schedule.keep_seconds())
        prefix = layout.schedule_ticks_prefix(schedule.name)
        metas = await self._store.list(prefix, layout.schedule_tick_key(schedule.name, oldest))
        return [tick for meta in metas if (tick := layout.tick_of(meta.key)) is not None]

    @staticmethod
    def _first(schedule: Schedule, now: datetime) -> datetime:
        """Where a runner that finds no marker starts: the schedule's creation (or as far
        back as markers are kept), so skipped ticks are counted."""
        return max(now - timedelta(seconds=schedule.keep_seconds()), schedule.created_at)

    async def step(self) -> float:
        """Fire (or count as missed) the ticks due now and look at the ticks other runners
        won; return the seconds until something is due again."""
        now = self._runtime.clock()
        for running in list(self._running.values()):
            if not running.schedule.paused:
                await self._advance(running, now)
        while self._checks and self._checks[0].at <= now:
            check = self._checks.pop(0)
            try:
                await self._check(check, now)
            except (PawnQueueError, OSError) as error:
                # Kept, or the tick would be lost with it: looked at again a second later.
                logger.warning(
                    "schedule %r tick %s: %s; looking again in 1 s",
                    check.name,
                    tick_iso(check.tick),
                    error,
                )
                self._checks.append(replace(check, at=now + timedelta(seconds=1)))
                self._checks.sort()
        wakes = [r.attempt_at for r in self._running.values() if r.attempt_at is not None]
        wakes += [check.at for check in self._checks[:1]]
        if not wakes:
            return math.inf
        return max(0.0, (min(wakes) - self._runtime.clock()).total_seconds())

    async def _advance(self, running: _Running, now: datetime) -> None:
        schedule = running.schedule
        rule = schedule.rule()
        while True:
            if running.next_tick is None:
                running.next_tick = rule.next(running.last)
                if running.next_tick is None:
                    return  # past its end
                jitter = self._rng.uniform(0.0, schedule.jitter_seconds)
                running.attempt_at = running.next_tick + timedelta(seconds=jitter)
            tick, attempt_at = running.next_tick, running.attempt_at
            assert attempt_at is not None
            if attempt_at > now:
                return
            if (now - attempt_at).total_seconds() > schedule.catch_up_seconds:
                running.missed += 1
            else:
                await self._fire(running, tick, now)
            running.last, running.next_tick, running.attempt_at = tick, None, None

    async def _fire(self, running: _Running, tick: datetime, now: datetime) -> None:
        schedule = running.schedule
        key = layout.schedule_tick_key(schedule.name, tick)
        try:
            await self._store.put(key, marker_body(self.runner_id, now, running.missed), "create")
        except AlreadyExists:
            running.missed = 0  # the winner recorded the skipped ticks (or will not know them)
            self._expect(schedule.name, tick, now)
            return
        except StoreUnavailableError as error:
            # Created or not: the check publishes the tick if nobody did.
            logger.warning("schedule %r tick %s: %s", schedule.name, tick_iso(tick), error)
            self._expect(schedule.name, tick, now)
            return
        # Reported here, where they were written down: a loser's own count is dropped.
        if running.missed and self._observers:
            self._observers.schedule_missed(schedule, running.missed)
        running.missed = 0
        self.won += 1
        try:
            await self._publish_tick(schedule, tick)
        except Exception as error:  # the check publishes it again
            logger.warning("schedule %r tick %s not published: %s", schedule.name, tick, error)
            self._expect(schedule.name, tick, now)
            return
        self._fired(schedule, tick)
        await self._maybe_sweep(running, now)

    def _fired(self, schedule: Schedule, tick: datetime) -> None:
        if self._observers:
            late = (self._runtime.clock() - tick).total_seconds()
            self._observers.schedule_fired(schedule, tick, max(0.0, late))  # a clock set back

    def _expect(self, name: str, tick: datetime, now: datetime) -> None:
        self._checks.append(_Check(max(now, tick) + self._grace, name, tick))
        self._checks.sort()

    async def _check(self, check: _Check, now: datetime) -> None:
        """Publish a tick whose winner did not (crashed between marker and publish), while
        the topic's dedup still remembers whether it did."""
        running = self._running.get(check.name)
        if running is None:
            return  # deleted
        schedule = running.schedule
        window = (await self._runtime.topics.settings(schedule.topic)).dedup_window_seconds
        short = window < dedup_window_needed(schedule, self._grace.total_seconds())
        if short and not running.short_window:
            # Lowered under the schedule (create_schedule refuses it): said once, not per tick.
            logger.warning(
                "schedule %r: the dedup window of topic %r (%g s) is shorter than the "
                "schedule needs (docs/concepts/schedules.md): a tick whose winner died "
                "before publishing it is published for it only within that window, else "
                "lost; ticks still fire, and this is not logged again for each tick",
                schedule.name,
                schedule.topic,
                window,
            )
        running.short_window = short
        ident = dedup_id(schedule.name, check.tick)
        try:
            marker = decode_marker(
                (await self._store.get(layout.dedup_key(schedule.topic, ident))).data
            )
            if marker is None or marker.written:
                return  # written, or a marker the dedup protocol alone can read
        except NotFound:
            pass
        # Sure only while the dedup marker (if the winner wrote one) cannot have been swept.
        if (now - check.tick).total_seconds() >= window - self._grace.total_seconds():
            logger.log(
                logging.DEBUG if short else logging.ERROR,  # a short window was said once
                "schedule %r tick %s: its message may be missing, and the dedup window of "
                "topic %r is past, so it is not published again",
                schedule.name,
                tick_iso(check.tick),
                schedule.topic,
            )
            return
        logger.warning("schedule %r tick %s: publishing for its winner", schedule.name, check.tick)
        await self._publish_tick(schedule, check.tick)
        self._fired(schedule, check.tick)

    async def _publish_tick(self, schedule: Schedule, tick: datetime) -> None:
        """Publish ``tick``'s message, with its dedup id: its ``expires_in`` counts from now."""
        await self._publish(
            schedule.topic,
            schedule.payload,
            tick_attributes(schedule, tick),
            dedup_id(schedule.name, tick),
            priority=schedule.priority,
            expires_in=schedule.expires_in,
        )

    async def _maybe_sweep(self, running: _Running, now: datetime) -> None:
        if (
            running.swept_at is not None
            and (now - running.swept_at).total_seconds() < SWEEP_SECONDS
        ):
            return
        running.swept_at = now
        await sweep_markers(self._store, running.schedule, now)


async def sweep_markers(store: Store, schedule: Schedule, now: datetime) -> int:
    """Delete the schedule's markers older than it keeps them (a page at most); how many."""
    oldest = now - timedelta(seconds=schedule.keep_seconds())
    metas = await store.list(layout.schedule_ticks_prefix(schedule.name), limit=LIST_PAGE)
    old = [m.key for m in metas if (tick := layout.tick_of(m.key)) is not None and tick < oldest]
    if old:
        await store.delete_many(old)
    return len(old)
