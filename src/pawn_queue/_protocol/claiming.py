"""Claiming: how a consumer finds messages in a listing, claims them and reads them.

Alone, a consumer claims the head of the listing (FIFO) and remembers the rest of the page
for its next polls. When its last listing found nothing (it just started, or was idle), it
claims the head message alone, and the rest of the poll only once that claim is won: so
consumers that start or wake together waste one claim each on the race for the head rather
than a poll's worth.

Once it met a competitor, a consumer works one lane (:mod:`~pawn_queue._protocol.lanes`), so
competing consumers seldom race for the same message, with no coordination. Claims run concurrently;
stragglers are not waited for long: their messages, and those won behind them, are kept for the
next poll, in listing order, so a slow claim does not let later messages overtake it.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Coroutine, Iterable
from datetime import datetime
from functools import partial
from typing import Any

from pawn_queue._internal.aio import IO_CONCURRENCY
from pawn_queue._protocol import layout
from pawn_queue._protocol.claimed_reads import ClaimedReader
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.freshness import ListingMemory, hinted_candidates
from pawn_queue._protocol.handout import Handout
from pawn_queue._protocol.lanes import LANE_WIDTH, LANES, Candidates, Lanes, claims_for
from pawn_queue._protocol.lease_keeper import LeaseKeeper
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.notify import outranks
from pawn_queue._protocol.orphan_sweeps import OrphanSweeps
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.scanning import scan_page
from pawn_queue.exceptions import StoreError
from pawn_queue.store.base import ObjectMeta

logger = logging.getLogger(__name__)


_MIN_PAGE = 100
_MIN_PATIENCE_SECONDS = 0.05
_REMEMBER_SECONDS = 1.0


class _Late:
    """A claim not answered within a poll's patience (:meth:`Claimer._claim_all`)."""


_LATE = _Late()
# What a claim gave: its messages (None if another consumer won it), its error, or _LATE.
_Claimed = list[Message] | BaseException | None | _Late
# A run's other messages in a chunk, and those of them its claim took in once won.
_RunFollowers = tuple[list[str], set[str]]


def _in_listing_order(message: Message) -> tuple[str, int]:
    return message._claimed.key, message._index


class Claimer:
    """Claims messages for one consumer, holding their leases in ``keeper``. Messages it won
    but could not return at once (late claims, batch members beyond the poll's maximum) wait
    for the next poll (:meth:`buffered`, :meth:`keep`)."""

    def __init__(
        self,
        consumer_id: str,
        runtime: Runtime,
        visibility: float,
        keeper: LeaseKeeper,
        handout: Handout,
    ) -> None:
        self._consumer_id = consumer_id
        self._runtime = runtime
        self._listings = runtime.listings
        self._leases = runtime.leases
        self._clock = runtime.clock
        self._visibility = visibility
        self._reader = ClaimedReader(runtime, keeper, handout)
        # topic -> messages for later polls, in listing order
        self._buffer: dict[str, list[Message]] = {}
        self._next_due: datetime | None = None  # first delayed message the last listings saw
        # This poll left candidates unclaimed, or lost a race (a competitor is draining what
        # is there): the next poll should come soon, not after an idle wait for a signal
        # that may not come.
        self.candidates_left = False
        # A claim of this poll failed (a store error): its message needs another poll, and
        # no change signal will say so.
        self.claim_failed = False
        # Set when a late claim kept messages for the next poll: a consumer waiting for a
        # change signal wakes for it (no signal comes: the message was published before).
        self.arrived = asyncio.Event()
        # Topics where a claim is still in flight past its poll's patience: nothing later in
        # their listing is claimed or handed out until it answers, or it would be overtaken.
        self._stalled: set[str] = set()
        self._late: dict[str, int] = {}  # topic -> its claims still in flight after their poll
        self._background: set[asyncio.Task[Any]] = set()  # late claims, orphan-lease sweeps
        self._sweeps = OrphanSweeps(runtime.leases, consumer_id, visibility, self._background)
        self.lanes = Lanes(runtime, visibility)
        self.memory = ListingMemory(runtime.signals, runtime.leases, runtime.clock)
        # topic -> candidates left by the last listing, and until when to trust them
        self._remembered: dict[str, tuple[list[tuple[layout.PendingKey, str]], float]] = {}
        # topic -> the signals' priority counts as its last listing began
        self._listed_counts: dict[str, tuple[int, ...]] = {}
        self._with_messages: set[str] = set()  # topics whose last listing found any
        self._flowing: set[str] = set()  # topics whose last listing found candidates
        self._io_slots = asyncio.Semaphore(IO_CONCURRENCY)
        # Moving average of a claim's latency; csprng_verify claims wait on purpose (jitter,
        # verify delays), so their first polls give them that long, not a request's time.
        self._claim_seconds = _MIN_PATIENCE_SECONDS + self._leases.claim_pause_seconds

    @property
    def next_due(self) -> datetime | None:
        """When the first message the listings since :meth:`buffered` left for later (a
        delayed one) comes due."""
        return self._next_due

    def start_poll(self) -> None:
        """A poll begins: :attr:`next_due`, :attr:`candidates_left`, :attr:`claim_failed`
        and :attr:`arrived` start afresh."""
        self._next_due = None
        self.candidates_left = False
        self.claim_failed = False
        self.arrived.clear()
        self._stalled = {topic for topic, late in self._late.items() if late}

    @property
    def buffered_topics(self) -> list[str]:
        """The topics with messages kept for the next polls."""
        return list(self._buffer)

    def buffered(self, wanted: int, topic: str | None = None) -> list[Message]:
        """Up to ``wanted`` messages kept for this poll (of ``topic``, if given) whose lease
        is still held, in listing order; none of a topic whose earlier claim is in flight."""
        taken: list[Message] = []
        names: list[str] = [topic] if topic is not None else list(self._buffer)
        for name in names:
            if name in self._stalled:
                continue
            waiting = self._buffer.get(name, [])
            while waiting and len(taken) < wanted:
                message = waiting.pop(0)
                if message.lease_held:
                    taken.append(message)
            if not waiting:
                self._buffer.pop(name, None)
        return taken

    def keep(self, messages: Iterable[Message]) -> None:
        """Hand ``messages`` out with the next polls, in listing order (FIFO)."""
        for message in messages:
            bisect.insort(
                self._buffer.setdefault(message.queue, []), message, key=_in_listing_order
            )

    async def close(self) -> None:
        """Let claims still in flight finish (their leases are then held) and drop what was
        kept: the caller releases the leases."""
        await asyncio.gather(*self._background, return_exceptions=True)
        self._buffer.clear()

    async def claim(
        self, topic: str, wanted: int, shared: bool = False, watched: bool = False
    ) -> list[Message]:
        """Claim and read up to ``wanted`` messages of ``topic``, FIFO (within a lane when
        other consumers compete). With ``shared``, a listing may be one another consumer of
        this queue began (:mod:`pawn_queue._protocol.listings`); else it begins in this call.
        With ``watched`` (the change signals are watched), no LIST is sent when the last one
        could show nothing new (:mod:`pawn_queue._protocol.freshness`)."""
        claimed: list[Message] = []
        remembered, until = self._remembered.pop(topic, ([], 0.0))
        if remembered and time.monotonic() < until and not self._outranked(topic, remembered):
            # What the last listing found beyond its claims: claiming it spares a LIST. Kept
            # briefly, so a message released meanwhile waits at most that long to come first.
            remembered = self._worth_claiming(topic, remembered)
            if self.lanes.contended(topic):
                remembered = (
                    self._own(topic, remembered) or self.lanes.in_lane(topic, remembered) or []
                )
            claimed, rest, conflicts = await self._claim_candidates(topic, remembered, wanted)
            self.candidates_left |= bool(rest or conflicts)
            if conflicts:
                self._met_competitor(topic)
            elif rest:
                self._remembered[topic] = (rest, until)
            if len(claimed) >= wanted or conflicts or topic in self._stalled:
                return claimed
        hinted = self._runtime.signals.take_hints(topic)
        # Unwatched, the listing below finds them; so it does once a delayed message the
        # last one saw came due (it may outrank them, or be older), and whenever a listing
        # is due anyway: what it left (older, or of a higher priority) comes first.
        if hinted and watched and self.memory.may_skip(topic):
            self.memory.named(topic)
            claimed += await self._claim_hinted(topic, hinted, wanted - len(claimed))
            if len(claimed) >= wanted or topic in self._stalled:
                return claimed
        if watched and self.memory.may_skip(topic):
            if topic in self._with_messages:
                self._sweeps.maybe(topic)  # orphan leases go on being swept, listed or not
            return claimed
        return claimed + await self._list_and_claim(topic, wanted - len(claimed), shared, watched)

    async def _claim_hinted(self, topic: str, keys: list[str], wanted: int) -> list[Message]:
        """Claim objects a change signal named, with no listing; if it leaves any (a poll's
        maximum, a delayed or group message, a race lost), the topic is listed, as it is at
        once where other processes' consumers compete (each then claims in its lane) or share
        the topic: a listing then finds the messages of producers whose signal has not come
        yet, as names of several producers' messages come late (each waits for its turn to
        write the root)."""
        if self.lanes.contended(topic) or self._runtime.registry.shares.size(topic) > 1:
            self._runtime.signals.local.changed(topic)
            return []
        candidates, unsure = hinted_candidates(keys, self._clock(), self._leases.margin)
        candidates = self._worth_claiming(topic, candidates)
        # Those of other processes' shares: listed when this one may take them.
        self.memory.due_by(topic, self._leases.next_expiry(topic))
        won, rest, conflicts = await self._claim_candidates(topic, candidates, wanted)
        if conflicts:
            self._met_competitor(topic)
        if rest or conflicts or unsure:
            self._runtime.signals.local.changed(topic)
        return won

    def _own(self, topic: str, candidates: Candidates) -> Candidates:
        """The candidates of this process's share (:mod:`pawn_queue._protocol.shares`): a
        contended consumer claims those first, whatever its lane (nobody else claims them
        yet); its lane applies to the others' it may take."""
        shares = self._runtime.registry.shares
        return [c for c in candidates if shares.owns(topic, c[0].lease_id())]

    def _outranked(self, topic: str, remembered: list[tuple[layout.PendingKey, str]]) -> bool:
        """Whether a message of a higher priority than the first one the last listing left
        was published or signalled since it began: that listing is not trusted any more."""
        then = self._listed_counts.get(topic)
        now = self._runtime.signals.prioritised(topic)
        return then is None or outranks(now, then, layout.priority_of(remembered[0][1]))

    def _worth_claiming(
        self, topic: str, candidates: list[tuple[layout.PendingKey, str]]
    ) -> list[tuple[layout.PendingKey, str]]:
        """The candidates not known here to be leased or gone (no request)."""
        return [c for c in candidates if self._leases.worth_claiming(topic, c[0].lease_id(), c[1])]

    async def _list_and_claim(
        self, topic: str, wanted: int, shared: bool, watched: bool
    ) -> list[Message]:
        """Claim up to ``wanted`` messages from a listing of ``topic`` (paged as needed)."""
        claimed: list[Message] = []
        generation = self.memory.begin(topic)
        self._listed_counts[topic] = self._runtime.signals.prioritised(topic)
        pages: list[list[ObjectMeta]] = []
        complete = lost = False
        next_due: datetime | None = None
        contended = self.lanes.contended(topic)
        start_after: str | None = None
        groups_seen: set[str] = set()
        # Alone, the head of the listing is enough (FIFO). Competing, a page wide enough for
        # a few polls in every lane. Not wider: every key of a page costs CPU to look at.
        width = LANES * LANE_WIDTH if contended else 2
        page_size = min(layout.LIST_PAGE, max(_MIN_PAGE, wanted * width))
        while len(claimed) < wanted and topic not in self._stalled:
            page = await self._listings.page(topic, start_after, page_size, join=shared)
            pages.append(page)
            if page:
                self._with_messages.add(topic)
                self._sweeps.maybe(topic)  # orphan leases: a topic without messages has none
            elif start_after is None:
                self._with_messages.discard(topic)
            scanned = scan_page(page, self._clock(), self._leases.margin, groups_seen)
            if scanned.next_due is not None:
                due = scanned.next_due
                self._next_due = due if self._next_due is None else min(self._next_due, due)
                next_due = due if next_due is None else min(next_due, due)
            candidates = [
                (pending, meta.key)
                for pending, meta in scanned.found
                if self._leases.worth_claiming_listed(topic, pending.lease_id(), meta.key)
            ]
            if contended:
                candidates = self._own(topic, candidates) or await self.lanes.candidates(
                    topic, candidates
                )
            # The first claim after a listing found nothing takes the head alone: consumers
            # that start, or wake, together (and so claim the same head) lose one claim
            # each, not a poll's worth.
            probe = not contended and topic not in self._flowing
            if candidates:
                self._flowing.add(topic)
            else:
                self._flowing.discard(topic)
            won, rest, conflicts = await self._claim_candidates(
                topic, candidates, wanted - len(claimed), probe
            )
            claimed += won
            self.candidates_left |= bool(rest or conflicts)
            lost |= bool(conflicts)
            if conflicts:
                self._met_competitor(topic)
            elif rest:
                # Only the group heads of this page are in ``rest``: the next of a group is
                # found by a later listing, once the one before it is settled.
                self._remembered[topic] = (rest, time.monotonic() + _REMEMBER_SECONDS)
            if scanned.ends or len(page) < page_size:
                complete = True
                break
            start_after = scanned.next_start(page)
        # After a race lost, a competitor drains the topic: what it leaves needs a listing.
        # Unwatched, a signal may land unseen before the watch's first look: list again.
        self.memory.end(topic, generation, pages, complete and not lost and watched, next_due)
        return claimed

    async def _claim_candidates(
        self,
        topic: str,
        candidates: list[tuple[layout.PendingKey, str]],
        wanted: int,
        probe: bool = False,
    ) -> tuple[list[Message], list[tuple[layout.PendingKey, str]], int]:
        """Claim candidates in order until ``wanted`` messages are won or one is lost: the
        messages, the candidates not tried, and how many claims other consumers won. With
        ``probe``, the first candidate is claimed alone, and the others only once it is won."""
        claimed: list[Message] = []
        conflicts = 0
        contended = self.lanes.contended(topic)
        # After a lost race, stop: the competitor is likely claiming the same candidates.
        # After a straggler, too: what comes next in the listing would overtake it.
        while candidates and len(claimed) < wanted and not conflicts:
            if topic in self._stalled:
                break
            take = 1 if probe else wanted - len(claimed)
            if contended:
                take = claims_for(candidates, take)
            chunk, candidates = candidates[:take], candidates[take:]
            results = await self._claim_all(topic, chunk)
            for result in results:
                if result is _LATE:
                    self._stalled.add(topic)
                elif isinstance(result, list):
                    if topic in self._stalled:  # won behind a straggler: kept for later
                        self.keep(result)
                        if not self._late.get(topic):  # else the straggler's answer wakes it
                            self.arrived.set()  # the next poll hands them out, signal or not
                    else:
                        claimed += result
                elif result is None:
                    conflicts += 1
                elif isinstance(result, asyncio.CancelledError):
                    raise result
                elif isinstance(result, BaseException):
                    logger.warning("claim failed topic=%s error=%s", topic, result)
                    self.claim_failed = True
            if probe and not any(isinstance(r, list) for r in results):
                break  # lost, failed or not answered yet: the rest waits for the next poll
            probe = False
        return claimed, candidates, conflicts

    async def _claim_all(
        self, topic: str, chunk: list[tuple[layout.PendingKey, str]]
    ) -> list[_Claimed]:
        """Claim concurrently, then read what was won. Stragglers are not waited for long:
        some stores answer the losers of a claim race only after a second or two. A
        straggler that wins later is read in the background into the buffer (next poll),
        where it goes before what was won behind it (:meth:`keep`)."""
        # A candidate another consumer of this process took since the listing is skipped (no
        # lost race). A run's message: taken in if held here, else after its run's claim.
        joined: dict[str, Lease] = {}
        claims: dict[asyncio.Task[Lease | None], tuple[layout.PendingKey, str]] = {}
        runs: dict[str, tuple[asyncio.Task[Lease | None], list[str], set[str]]] = {}
        for pending, key in chunk:
            lease_id = pending.lease_id()
            if pending.kind == "run":
                held = self._leases.join_run(topic, lease_id, key, self._consumer_id)
                if held is not None:
                    joined[key] = held
                    continue
                if lease_id in runs:
                    run, followers, taken = runs[lease_id]
                    followers.append(key)
                    claims[asyncio.create_task(self._follow(run, key, taken))] = (pending, key)
                    continue
            if not self._leases.reserve(topic, lease_id, key):
                if pending.kind == "run" and self._leases.claiming(topic, lease_id):
                    # Its run's claim (an earlier poll's) is in flight: the next listing.
                    self.memory.forget(topic)
                    self.candidates_left = True
                continue
            run_of: _RunFollowers | None = ([], set()) if pending.kind == "run" else None
            claim = asyncio.create_task(self._claim_lease(topic, pending, key, run_of))
            if run_of is not None:
                runs[lease_id] = (claim, *run_of)
            claim.add_done_callback(partial(self._unreserve, topic, lease_id))
            claims[claim] = (pending, key)
        done: set[asyncio.Task[Lease | None]] = set()
        started = time.monotonic()
        try:
            if claims:
                # Patience follows what claims usually take here: a slow store is not cut off.
                done, waiting = await asyncio.wait(
                    claims,
                    timeout=max(_MIN_PATIENCE_SECONDS * 5, 5 * self._claim_seconds),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if done:
                    first = time.monotonic() - started
                    self._claim_seconds = 0.8 * self._claim_seconds + 0.2 * first
                if waiting and done:
                    patience = max(_MIN_PATIENCE_SECONDS, 3 * (time.monotonic() - started))
                    more, waiting = await asyncio.wait(waiting, timeout=patience)
                    done |= more
        finally:
            for claim, (pending, key) in claims.items():
                if not claim.done():
                    self._late[topic] = self._late.get(topic, 0) + 1
                    late = asyncio.create_task(self._read_late(claim, topic, pending, key))
                    self._background.add(late)
                    late.add_done_callback(self._background.discard)
        # In listing order (FIFO); a claim not answered yet is _LATE, read in the background.
        outcomes: list[_Claimed | Coroutine[Any, Any, list[Message] | None]] = []
        in_order = {key: claim for claim, (_, key) in claims.items()}
        for pending, key in chunk:
            task = in_order.get(key)
            if key in joined:
                outcomes.append(self._reader.read(topic, pending, key, joined[key]))
            elif task is None:
                continue  # taken by another consumer here since the listing
            elif task not in done:
                outcomes.append(_LATE)
            elif task.exception() is not None:
                outcomes.append(task.exception())
            elif (lease := task.result()) is None:
                outcomes.append(None)
            else:
                outcomes.append(self._reader.read(topic, pending, key, lease))
        reads = [o for o in outcomes if asyncio.iscoroutine(o)]
        read = iter(await asyncio.gather(*reads, return_exceptions=True))
        return [next(read) if asyncio.iscoroutine(o) else o for o in outcomes]

    async def _follow(
        self, run: asyncio.Task[Lease | None], key: str, taken: set[str]
    ) -> Lease | None:
        """The lease of a run claimed here (:meth:`_claim_run`) if it took the message at
        ``key`` in; None if another consumer won the run."""
        lease = await asyncio.shield(run)
        return lease if key in taken else None

    async def _claim_lease(
        self, topic: str, pending: layout.PendingKey, key: str, run: _RunFollowers | None = None
    ) -> Lease | None:
        """The lease on a message, batch, group or run message; None if someone else has it.
        A run's, once won, takes the run's other messages of the chunk (``run[0]``) in at once,
        before another poll could, and puts them in ``run[1]`` (:meth:`_follow`)."""
        lease_id = pending.lease_id()
        async with self._io_slots:
            lease = await self._leases.claim(
                topic,
                pending.object_id,
                key,
                self._consumer_id,
                self._visibility,
                lease_id=lease_id,
            )
            followers, taken = run if run is not None and lease is not None else ([], set())
            for follower in followers:
                if self._leases.join_run(topic, lease_id, follower, self._consumer_id):
                    taken.add(follower)
            return lease

    def _unreserve(self, topic: str, lease_id: str, _: object) -> None:
        self._leases.unreserve(topic, lease_id)

    async def _read_late(
        self, claim: asyncio.Task[Lease | None], topic: str, pending: layout.PendingKey, key: str
    ) -> None:
        try:
            lease = await claim
            if lease is not None:
                self.keep(await self._reader.read(topic, pending, key, lease) or [])
        except StoreError as exc:
            logger.warning("claim failed topic=%s error=%s", topic, exc)
            # The listing that found it took it as claimed here: list again, or the message
            # waits for a change signal or the sweep.
            self.memory.forget(topic)
        finally:
            self._late[topic] -= 1
            if not self._late[topic]:
                del self._late[topic]
                if topic in self._buffer:  # what was won behind it: the next poll, at once
                    self.arrived.set()

    def _met_competitor(self, topic: str) -> None:
        """Another consumer won a claim here: move lanes, forget the listing, and have the
        registry read again if other processes share the topic (a view gone stale)."""
        self.lanes.met_competitor(topic)
        self._runtime.registry.shares.stale(topic)
        self._remembered.pop(topic, None)
