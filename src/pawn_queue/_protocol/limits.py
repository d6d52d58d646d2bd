"""Concurrency limits: at most ``limit`` holders of a name at a time, across every process
and host on one store (docs/concepts/flow-control.md).

A limit of N is N slots, ``_limits/{name}/{slot}.lease`` (slot 0 to N - 1), each a lease that
changes hands as a message's does (rule 3): won with a create-only PUT, or with an if-match
PUT over a released or expired one; refreshed in the background with if-match on the
holder's own etag; given back with an if-match PUT marked released. Never with a DELETE: no
store makes a DELETE conditional, so a late one could remove a slot another holder had taken
over. A taker may have a slot ``clock_skew_margin`` after its expiry, at once after a release.

A process remembers what it learned of each slot (its etag, until when it is live) and the
slots it holds or is trying, so that it asks for what it cannot know: a slot it gave back
itself costs one PUT to win again, a slot live when last read one GET per try.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pawn_queue._internal.config_sections import claim_seconds, renew_seconds
from pawn_queue._internal.durations import count_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import LeaseBody
from pawn_queue._protocol.lease_protocol import (
    RELEASED,
    Lease,
    LeaseProtocol,
    bounded,
    conditional_put,
    free_at,
    nonce,
)
from pawn_queue.config import PollingConfig
from pawn_queue.exceptions import (
    ArgumentError,
    ConfigError,
    LimitTimeoutError,
    NotFound,
    StoreError,
    StoreUnavailableError,
)
from pawn_queue.store.base import IfMatch, PutMode, Store, StoredObject

logger = logging.getLogger(__name__)

MAX_LIMIT = 1000
"""The most slots a limit may have: a waiter's round reads each slot live when last seen."""
FIRST_PAUSE_SECONDS = 0.05
MAX_PAUSE_SECONDS = 1.0
"""A waiter that found every slot live pauses 50 ms, doubling up to 1 s, each pause
jittered by +-50 % so that waiters drift apart; a release in the process wakes one sooner."""
_SEEN_MEMORY = 10_000  # slots remembered per process; all forgotten past this (names are many)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # when a released slot is free: on every clock


def limit_argument(what: str, value: object) -> int:
    """``value`` as a number of slots, 1 to :data:`MAX_LIMIT`; else ArgumentError naming
    ``what``."""
    limit = count_argument(what, value, minimum=1)
    if limit > MAX_LIMIT:
        raise ArgumentError(f"{what}: got {limit!r}, must be at most {MAX_LIMIT}")
    return limit


def conditional_writes(strategy: str, what: str) -> None:
    """ConfigError unless ``strategy`` is conditional writes: on another store each waiter's
    create-only write would win, so ``what`` could not hold."""
    if strategy != "conditional_write":
        raise ConfigError(
            f"{what} hold only on a store with conditional writes: this one runs strategy "
            f"{strategy} (docs/concepts/flow-control.md)"
        )


class LimitSlot:
    """The slot ``async with pq.concurrency_limit(name, limit)`` holds (it makes them)."""

    def __init__(
        self, name: str, limit: int, slot: int, lease: Lease, leases: LeaseProtocol
    ) -> None:
        self.name = name
        """The limit's name."""
        self.limit = limit
        """How many holders it lets run at once."""
        self.slot = slot
        """Which of its slots this is: 0 to ``limit`` - 1."""
        self._lease = lease
        self._leases = leases
        self._stop = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._unsure: LeaseBody | None = None  # a write whose outcome is unknown

    @property
    def held(self) -> bool:
        """Whether this holder can be sure it still holds the slot. False after the block,
        once another holder took the slot over (this one stalled past its lease, or could
        not refresh it: logged at WARNING), and while its lease is within the clock-skew
        margin of running out with no refresh landed. Nothing interrupts the block's code:
        check this before a step that must stay within the limit."""
        lease = self._lease
        if lease.lost or lease.released:
            return False
        return self._leases.clock() < lease.expires - self._leases.margin

    @property
    def expires_at(self) -> datetime:
        """When the slot's lease runs out unless refreshed (it is, in the background, while
        the block runs)."""
        return self._lease.expires

    def __repr__(self) -> str:
        return (
            f"LimitSlot(name={self.name!r}, limit={self.limit}, slot={self.slot}, held={self.held})"
        )


@dataclass(slots=True)
class _Seen:
    """What this process last learned of a slot."""

    etag: str
    free_at: datetime  # when a taker may have it
    read_at: float  # monotonic


class Limits:
    """The concurrency limits of one queue: waits for slots, keeps and gives them back."""

    def __init__(self, store: Store, leases: LeaseProtocol, polling: PollingConfig) -> None:
        self._store = store
        self._leases = leases
        self.lease_seconds = polling.visibility_timeout_seconds
        self._refresh_seconds = polling.lease_refresh_interval_seconds
        self._holder = f"{socket.gethostname()}:{os.getpid()}"  # shown in the slot, for people
        self._seen: dict[str, _Seen] = {}
        self._held: dict[str, LimitSlot] = {}
        self._trying: set[str] = set()
        self._unsure: dict[str, str] = {}  # slot key -> the nonce of a claim of unknown outcome
        self._waiters: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # releases and attempts left running

    async def acquire(self, name: str, limit: int, within: float | None) -> LimitSlot:
        """A slot of ``name``, once one is free: every slot is tried (in random order, those
        likely free first), then the waiter pauses and tries again. LimitTimeoutError once
        ``within`` seconds passed (None: never); after at least one round, so 0 tries once.
        A StoreUnavailableError is tried again the same way, and raised as is once that
        time passed or the store failed for a whole lease term."""
        deadline = None if within is None else time.monotonic() + within
        pause = FIRST_PAUSE_SECONDS
        looked: float | None = None  # when this waiter's last round ended
        failing_since: float | None = None
        while True:
            try:
                slot = await self._round(name, limit, looked)
            except StoreUnavailableError as exc:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if (deadline is not None and now >= deadline) or (
                    now - failing_since >= self.lease_seconds
                ):
                    raise
                logger.info("concurrency limit: store unavailable name=%s error=%s", name, exc)
                slot = None
            else:
                failing_since = None
            if slot is not None:
                return slot
            now = looked = time.monotonic()
            if deadline is not None and now >= deadline:
                raise LimitTimeoutError(
                    f"no slot of concurrency limit {name!r} (limit {limit}) came free "
                    f"within {within:g} s"
                )
            wait = pause * random.uniform(0.5, 1.5)
            await self._pause(name, wait if deadline is None else min(wait, deadline - now))
            pause = min(pause * 2, MAX_PAUSE_SECONDS)

    async def release(self, slot: LimitSlot) -> None:
        """Give the slot back; runs to its end even if the caller is cancelled. A failure is
        logged: the slot then frees when its lease runs out."""
        await asyncio.shield(self._start(self._release(slot)))

    async def close(self) -> None:
        """Give back every slot held here and wait for the writes in flight (teardown)."""
        for slot in list(self._held.values()):
            self._start(self._release(slot))
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- winning a slot ---------------------------------------------------------------------

    async def _round(self, name: str, limit: int, looked: float | None) -> LimitSlot | None:
        """Try each slot once; the first won. A slot another waiter here read live after
        ``looked`` (the end of this waiter's last round) is skipped: it was just read."""
        now = self._leases.clock()
        keys = [layout.limit_slot_key(name, n) for n in range(limit)]

        def likely_free_first(n: int) -> int:
            seen = self._seen.get(keys[n])
            return 1 if seen is None else 0 if seen.free_at < now else 2

        for n in sorted(random.sample(range(limit), limit), key=likely_free_first):
            key, seen = keys[n], self._seen.get(keys[n])
            if key in self._held or key in self._trying:
                continue
            if (
                looked is not None
                and seen is not None
                and seen.free_at > now
                and seen.read_at > looked
            ):
                continue  # read live by another waiter here since this one's last round
            slot = await self._try_to_the_end(name, limit, n, key)
            if slot is not None:
                return slot
        return None

    async def _try_to_the_end(self, name: str, limit: int, n: int, key: str) -> LimitSlot | None:
        """:meth:`_try`, finished even if the waiter is cancelled: its write may land all the
        same, and a slot it won is then given back at once rather than left to expire."""
        self._trying.add(key)
        attempt = asyncio.ensure_future(self._try(name, limit, n, key))
        attempt.add_done_callback(lambda _: self._trying.discard(key))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            self._start(self._give_back(attempt))
            raise

    async def _give_back(self, attempt: asyncio.Future[LimitSlot | None]) -> None:
        with contextlib.suppress(Exception):
            slot = await attempt
            if slot is not None:
                await self._release(slot)

    async def _try(self, name: str, limit: int, n: int, key: str) -> LimitSlot | None:
        """Win slot ``n`` if it is free; None if it is live (or the race was lost)."""
        body = self._new_body(name)
        try:
            etag, current = await self._win(key, body)
        except StoreUnavailableError:
            # The write may have landed: a later read that finds its nonce wins the slot
            # again, rather than wait a lease for a holder that is not there.
            if len(self._unsure) >= _SEEN_MEMORY:
                self._unsure.clear()
            self._unsure[key] = body.nonce
            raise
        if etag is None:
            if current is None:
                self._seen.pop(key, None)  # gone (a delete by hand): the next try creates it
            return None
        return self._hold(name, limit, n, key, etag, body)

    async def _win(self, key: str, body: LeaseBody) -> tuple[str | None, StoredObject | None]:
        """Create the slot, or write over it with if-match on the etag of a version that is
        released, expired or ours: ``(etag, None)`` once ``body`` is stored, else ``(None,
        what is stored)``."""
        bound = claim_seconds(self.lease_seconds)  # rule 11: a slot won holds half its lease
        seen = self._seen.get(key)
        etag: str | None = None
        if seen is not None and seen.free_at > self._leases.clock():
            current = await self._read(key, bound)  # live when last read: is it free now?
            if current is None:
                etag, current = await conditional_put(self._store, key, body, "create", bound)
        else:
            mode: PutMode = "create" if seen is None else IfMatch(seen.etag)
            etag, current = await conditional_put(self._store, key, body, mode, bound)
        if etag is None and current is not None and self._takeable(key, current):
            # Whoever writes over this version first has the slot.
            match = IfMatch(current.meta.etag)
            etag, current = await conditional_put(self._store, key, body, match, bound)
            if current is not None:
                self._learn(key, current)
        return etag, current

    def _takeable(self, key: str, current: StoredObject) -> bool:
        """Learn what a read of the slot told; whether it may be taken: released, expired,
        or left by a write of ours whose outcome was unknown."""
        stored, free = self._learn(key, current)
        ours = self._unsure.pop(key, None)
        return free < self._leases.clock() or (ours is not None and stored.nonce == ours)

    def _new_body(self, name: str) -> LeaseBody:
        now = self._leases.clock()
        expires = now + timedelta(seconds=self.lease_seconds)
        # A message lease's body; message_id names the limit, for people reading the store.
        return LeaseBody(self._holder, name, now.isoformat(), expires.isoformat(), nonce())

    async def _read(self, key: str, bound: float) -> StoredObject | None:
        try:
            return await bounded(bound, key, self._store.get(key))
        except NotFound:
            return None

    def _learn(self, key: str, current: StoredObject) -> tuple[LeaseBody, datetime]:
        """Remember what a read of the slot told: the stored body, and when a taker may
        have it."""
        stored, free = free_at(current.data, current.meta.last_modified, self._leases.margin)
        if len(self._seen) >= _SEEN_MEMORY:
            self._seen.clear()
        self._seen[key] = _Seen(current.meta.etag, free, time.monotonic())
        return stored, free

    def _hold(
        self, name: str, limit: int, n: int, key: str, etag: str, body: LeaseBody
    ) -> LimitSlot:
        lease = Lease(name, "", "", key, etag, body, self.lease_seconds)
        slot = LimitSlot(name, limit, n, lease, self._leases)
        self._held[key] = slot
        self._seen[key] = _Seen(etag, body.expires + self._leases.margin, time.monotonic())
        slot._keeper = asyncio.create_task(self._keep(slot))
        return slot

    async def _pause(self, name: str, seconds: float) -> None:
        """Sleep ``seconds``, or until a slot of ``name`` is given back in this process."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiters.setdefault(name, collections.deque())
        waiting.append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, seconds)
        finally:
            with contextlib.suppress(ValueError):
                waiting.remove(waiter)
            if not waiting and self._waiters.get(name) is waiting:
                del self._waiters[name]

    def _wake_one(self, name: str) -> None:
        waiting = self._waiters.get(name)
        while waiting:
            waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- keeping and giving back ------------------------------------------------------------

    async def _keep(self, slot: LimitSlot) -> None:
        """Refresh the slot every refresh interval until it is given back or lost. It stops
        between writes, never in one: a cancelled write could land after the release."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot._stop.wait(), self._refresh_seconds)
            if slot._stop.is_set():
                return
            expires = self._leases.clock() + timedelta(seconds=self.lease_seconds)
            if await self._write(slot, expires.isoformat(), released=False) is None:
                return

    async def _release(self, slot: LimitSlot) -> None:
        lease = slot._lease
        if slot._stop.is_set():
            return  # given back already (the block's end and a teardown both ask)
        slot._stop.set()
        if slot._keeper is not None:
            await slot._keeper
        if self._held.get(lease.key) is slot:
            del self._held[lease.key]
        if lease.lost:
            return
        etag = await self._write(slot, RELEASED, released=True)
        lease.released = True
        if etag is not None:
            self._seen[lease.key] = _Seen(etag, _EPOCH, time.monotonic())
            self._wake_one(slot.name)

    async def _write(self, slot: LimitSlot, expires_at: str, *, released: bool) -> str | None:
        """Write the slot over with if-match on our etag; its etag, or None if the slot is no
        longer ours (marked lost, logged at WARNING). A failed write is logged: a refresh is
        tried again at the next interval; a release is not (the slot frees at its expiry)."""
        lease = slot._lease
        try:
            if slot._unsure is not None and not await self._landed(slot):
                self._lost(slot)
                return None
            body = replace(lease.body, expires_at=expires_at, nonce=nonce(), released=released)
            try:
                etag = await self._leases.write_over(lease, body)
            except StoreUnavailableError:
                slot._unsure = body
                raise
        except StoreError as exc:
            logger.warning(
                "concurrency limit slot %s failed name=%s slot=%d error=%s",
                "release" if released else "refresh",
                slot.name,
                slot.slot,
                exc,
            )
            return None if released else lease.etag
        if etag is None:
            self._lost(slot)
            return None
        lease.etag, lease.body = etag, body
        return etag

    async def _landed(self, slot: LimitSlot) -> bool:
        """After a write whose outcome was unknown: whether the slot is still ours, as we
        last knew it or as that write left it (then adopted: rule 6)."""
        lease, unsure = slot._lease, slot._unsure
        assert unsure is not None
        current = await self._read(lease.key, renew_seconds(self.lease_seconds, 0))
        slot._unsure = None
        if current is None:
            return False
        if current.meta.etag == lease.etag:
            return True
        stored, _ = free_at(current.data, current.meta.last_modified, self._leases.margin)
        if stored.nonce != unsure.nonce:
            return False
        lease.etag, lease.body = current.meta.etag, unsure
        return True

    def _lost(self, slot: LimitSlot) -> None:
        lease = slot._lease
        lease.lost = True
        self._seen.pop(lease.key, None)
        if self._held.get(lease.key) is slot:
            del self._held[lease.key]
        logger.warning(
            "concurrency limit slot lost: another holder took it over after its lease ran out "
            "name=%s slot=%d key=%s",
            slot.name,
            slot.slot,
            lease.key,
        )

    def _start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
