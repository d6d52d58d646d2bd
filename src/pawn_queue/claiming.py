"""Claiming: how a consumer finds messages in a listing, claims them and reads them.

Alone, a consumer claims the head of the listing (FIFO) and remembers the rest of the page
for its next polls. Once it met a competitor, it lists the leases too and claims a block at a
random place in a wider page, so competing consumers rarely collide. Claims run concurrently;
stragglers are not waited for long (their messages go to the buffer, for the next poll).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pawn_queue import layout
from pawn_queue.envelope import (
    CorruptObject,
    DeadLetterInfo,
    Envelope,
    decode_pending,
    encode_unreadable,
    now_utc,
)
from pawn_queue.exceptions import StoreError
from pawn_queue.leases import Lease, LeaseManager
from pawn_queue.message import ClaimedObject, Message
from pawn_queue.notify import ChangeSignals
from pawn_queue.store.base import Store
from pawn_queue.topics import Topics

logger = logging.getLogger(__name__)

IO_CONCURRENCY = 32  # requests in flight per consumer

_LIST_PAGE = 1000  # one S3 LIST request
_MIN_PAGE = 100
_CONTENDED_WIDTH = 30  # page size under contention, in claims per poll
_CONTENTION_MEMORY_SECONDS = 30.0
_MIN_PATIENCE_SECONDS = 0.05
_REMEMBER_SECONDS = 1.0
_SWEEP_SECONDS = 600.0  # how often a consumer looks for orphan leases in each topic


def _expired(key: str, retention_seconds: float) -> bool:
    due = layout.due_from_key(key)
    return due is not None and now_utc() - due > timedelta(seconds=retention_seconds)


class Claimer:
    """Claims messages for one consumer. Messages it won but could not return at once (late
    claims, batch members beyond the poll's maximum) wait in :attr:`buffer`."""

    def __init__(
        self,
        consumer_id: str,
        store: Store,
        leases: LeaseManager,
        signals: ChangeSignals,
        topic_settings: Topics,
        visibility: float,
        hold: Callable[[Lease], None],
        forget: Callable[[Lease], None],
    ) -> None:
        self._consumer_id = consumer_id
        self._store = store
        self._leases = leases
        self._signals = signals
        self._topic_settings = topic_settings
        self._visibility = visibility
        self._hold = hold
        self._forget = forget
        self.buffer: deque[Message] = deque()
        self.next_due: datetime | None = None  # first delayed message the last listing saw
        self.background: set[asyncio.Task[Any]] = set()  # late claims, orphan-lease sweeps
        self._contended_until: dict[str, float] = {}
        # topic -> candidates left by the last listing, and until when to trust them
        self._remembered: dict[str, tuple[list[tuple[layout.PendingKey, str]], float]] = {}
        self._sweep_after: dict[str, float] = {}
        self._io_slots = asyncio.Semaphore(IO_CONCURRENCY)
        self._claim_seconds = _MIN_PATIENCE_SECONDS  # moving average of a claim's latency

    async def claim(self, topic: str, wanted: int) -> list[Message]:
        """Claim and read up to ``wanted`` messages of ``topic``, FIFO."""
        self._maybe_sweep(topic)
        claimed: list[Message] = []
        contended = self._contended(topic)
        remembered, until = self._remembered.pop(topic, ([], 0.0))
        if remembered and not contended and time.monotonic() < until:
            # What the last listing found beyond its claims: claiming it spares a LIST. Kept
            # briefly, so a message released meanwhile waits at most that long to come first.
            remembered = [
                (pending, key)
                for pending, key in remembered
                if self._leases.worth_claiming(topic, pending.lease_id(), key)
            ]
            claimed, rest, conflicts = await self._claim_candidates(topic, remembered, wanted)
            if conflicts:
                self._contended_until[topic] = time.monotonic() + _CONTENTION_MEMORY_SECONDS
            elif rest:
                self._remembered[topic] = (rest, until)
            if len(claimed) >= wanted or conflicts:
                return claimed
        start_after: str | None = None
        recently_leased = await self._recently_leased(topic)
        groups_seen: set[str] = set()
        # Alone, the head of the listing is enough (FIFO). Competing, a wider page: each
        # consumer then claims a block at a random place in it, so blocks rarely overlap.
        # Not wider than that: every key of a page costs CPU to look at.
        page_size = min(_LIST_PAGE, max(_MIN_PAGE, wanted * (_CONTENDED_WIDTH if contended else 2)))
        while len(claimed) < wanted:
            page = await self._store.list(
                layout.messages_prefix(topic), start_after=start_after, limit=page_size
            )
            candidates: list[tuple[layout.PendingKey, str]] = []
            # Keys sort by the time messages become due: the first one not due yet ends the
            # scan (the skew margin keeps a producer's fast clock from hiding its messages).
            due_by = now_utc() + self._leases.margin
            not_due = False
            for meta in page:
                pending = layout.parse_pending_key(meta.key)
                if pending is None:
                    continue
                due = layout.due_from_key(meta.key)
                if due is not None and due > due_by:
                    not_due = True
                    due -= self._leases.margin
                    self.next_due = due if self.next_due is None else min(self.next_due, due)
                    break
                if pending.kind == "group":
                    # Only the oldest message of a group may be delivered, and one at a time.
                    if pending.group_hash in groups_seen:
                        continue
                    groups_seen.add(pending.group_hash)
                lease_id = pending.lease_id()
                lease_key = layout.lease_key(topic, lease_id)
                if lease_key in recently_leased and not self._leases.expiry_known(topic, lease_id):
                    continue
                if self._leases.worth_claiming(topic, pending.lease_id(), meta.key):
                    candidates.append((pending, meta.key))
            if contended and len(candidates) > wanted:
                offset = random.randrange(len(candidates))
                candidates = candidates[offset:] + candidates[:offset]
            won, rest, conflicts = await self._claim_candidates(
                topic, candidates, wanted - len(claimed)
            )
            claimed += won
            if conflicts:
                self._contended_until[topic] = time.monotonic() + _CONTENTION_MEMORY_SECONDS
            elif rest and not contended:
                # Only the group heads of this page are in ``rest``: the next of a group is
                # found by a later listing, once the one before it is settled.
                self._remembered[topic] = (rest, time.monotonic() + _REMEMBER_SECONDS)
            if not_due or len(page) < page_size:
                break
            start_after = page[-1].key
        return claimed

    async def _claim_candidates(
        self, topic: str, candidates: list[tuple[layout.PendingKey, str]], wanted: int
    ) -> tuple[list[Message], list[tuple[layout.PendingKey, str]], int]:
        """Claim candidates in order until ``wanted`` messages are won: the messages, the
        candidates not tried, and how many claims other consumers won."""
        claimed: list[Message] = []
        conflicts = 0
        while candidates and len(claimed) < wanted:
            # Batch objects hold many messages: one claim may be enough.
            take = wanted - len(claimed)
            chunk, candidates = candidates[:take], candidates[take:]
            results = await self._claim_all(topic, chunk)
            for result in results:
                if isinstance(result, list):
                    claimed += result
                elif result is None:
                    conflicts += 1
                elif isinstance(result, asyncio.CancelledError):
                    raise result
                elif isinstance(result, BaseException):
                    logger.warning("claim failed topic=%s error=%s", topic, result)
        return claimed, candidates, conflicts

    async def _claim_all(
        self, topic: str, chunk: list[tuple[layout.PendingKey, str]]
    ) -> list[list[Message] | BaseException | None]:
        """Claim concurrently, then read what was won. Stragglers are not waited for long:
        some stores answer the losers of a claim race only after a second or two. A
        straggler that wins later is read in the background into the buffer (next poll)."""
        claims = {
            asyncio.create_task(self._claim_lease(topic, pending, key)): (pending, key)
            for pending, key in chunk
        }
        started = time.monotonic()
        done: set[asyncio.Task[Lease | None]] = set()
        try:
            # Patience follows what claims usually take here, so a slow store is not cut off.
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
                    late = asyncio.create_task(self._read_late(claim, topic, pending, key))
                    self.background.add(late)
                    late.add_done_callback(self.background.discard)
        results: list[list[Message] | BaseException | None] = []
        reads = []
        for claim, (pending, key) in claims.items():  # in listing order: FIFO
            if claim not in done:
                continue
            if claim.exception() is not None:
                results.append(claim.exception())
            elif (lease := claim.result()) is None:
                results.append(None)
            else:
                reads.append(self._read(topic, pending, key, lease))
        results += await asyncio.gather(*reads, return_exceptions=True)
        return results

    async def _claim_lease(self, topic: str, pending: layout.PendingKey, key: str) -> Lease | None:
        """The lease on a message, batch or group message; None if someone else has it."""
        lease_id = pending.lease_id()
        if not self._leases.worth_claiming(topic, lease_id, key):
            return None  # settled or claimed in this process since the listing
        async with self._io_slots:
            return await self._leases.claim(
                topic,
                pending.object_id,
                key,
                self._consumer_id,
                self._visibility,
                lease_id=lease_id,
            )

    async def _read_late(
        self, claim: asyncio.Task[Lease | None], topic: str, pending: layout.PendingKey, key: str
    ) -> None:
        try:
            lease = await claim
            if lease is not None:
                self.buffer.extend(await self._read(topic, pending, key, lease) or [])
        except StoreError as exc:
            logger.warning("claim failed topic=%s error=%s", topic, exc)

    def _maybe_sweep(self, topic: str) -> None:
        """Now and then, delete orphan leases of ``topic`` in the background."""
        now = time.monotonic()
        due = self._sweep_after.setdefault(topic, now + _SWEEP_SECONDS)
        if now < due:
            return
        self._sweep_after[topic] = now + _SWEEP_SECONDS
        sweep = asyncio.create_task(self._sweep(topic))
        self.background.add(sweep)
        sweep.add_done_callback(self.background.discard)

    async def _sweep(self, topic: str) -> None:
        try:
            await self._leases.sweep_orphans(topic, self._consumer_id, self._visibility)
        except StoreError as exc:
            logger.warning("orphan lease sweep failed topic=%s error=%s", topic, exc)

    def _contended(self, topic: str) -> bool:
        """Whether other consumers competed for this topic's messages lately."""
        return time.monotonic() < self._contended_until.get(topic, 0.0)

    async def _recently_leased(self, topic: str) -> set[str]:
        """Lease keys written within one visibility timeout, listed only under contention.

        One LIST of the lease prefix costs less than the create-only PUTs (and the GETs after
        them) that competing consumers would otherwise waste on each other's messages.
        """
        if not self._contended(topic):
            return set()
        fresh_after = now_utc() - timedelta(seconds=self._visibility)
        leases = await self._store.list(layout.leases_prefix(topic))
        return {m.key for m in leases if m.last_modified > fresh_after}

    async def _read(
        self, topic: str, pending: layout.PendingKey, key: str, lease: Lease
    ) -> list[Message] | None:
        """Read a claimed object into messages; None if another consumer just settled it."""
        is_batch = pending.kind == "batch"
        object_id = pending.object_id
        obj = await self._leases.read_claimed(lease, lambda: self._store.get(key))
        if obj is None:
            return None  # acked by another consumer while we claimed
        try:
            envelopes = decode_pending(obj.data, topic, object_id, batch=is_batch)
        except CorruptObject as exc:
            await self._quarantine(topic, object_id, key, obj.data, str(exc), lease)
            return []
        settings = await self._topic_settings.settings(topic)
        if settings.max_receive_count and lease.body.receive_count > settings.max_receive_count:
            # Received too often: dead-letter whatever is left of it instead of delivering.
            error = (
                f"received {lease.body.receive_count} times; "
                f"the topic allows {settings.max_receive_count}"
            )
            await self._dead_letter_all(key, lease, envelopes, "max_receive_count", error)
            return []
        if settings.retention_seconds and _expired(key, settings.retention_seconds):
            error = f"not consumed within the topic's retention of {settings.retention_seconds}s"
            if settings.retention_action == "dead_letter":
                await self._dead_letter_all(key, lease, envelopes, "retention", error)
            else:
                await self._store.delete(key)
                await self._leases.release(lease, message_gone=True)
                logger.info("expired message key=%s %s", key, error)
            return []
        claimed = ClaimedObject(
            key, lease, len(envelopes), self._store, self._leases, self._signals, self._forget
        )
        self._hold(lease)
        return [
            Message(envelope, claimed, index)
            for index, envelope in enumerate(envelopes)
            if index not in lease.settled
        ]

    async def _dead_letter_all(
        self, key: str, lease: Lease, envelopes: list[Envelope], reason: str, error: str
    ) -> None:
        claimed = ClaimedObject(
            key, lease, len(envelopes), self._store, self._leases, self._signals, self._forget
        )
        for index, envelope in enumerate(envelopes):
            if index not in lease.settled:
                await Message(envelope, claimed, index).dead_letter(reason, error)
        logger.warning("dead-lettered key=%s reason=%s %s", key, reason, error)

    async def _quarantine(
        self, topic: str, object_id: str, key: str, data: bytes, error: str, lease: Lease
    ) -> None:
        """Move an unreadable object to dead letter instead of blocking the topic."""
        await self._store.put(
            layout.dead_letter_key(topic, object_id),
            encode_unreadable(
                object_id, topic, data, DeadLetterInfo("corrupt", error, now_utc().isoformat(), key)
            ),
        )
        await self._store.delete(key)
        await self._leases.release(lease, message_gone=True)
        logger.warning("quarantined corrupt object key=%s error=%s", key, error)
