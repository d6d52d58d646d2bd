"""Message: one delivered message and how it is settled (ack, nack).

A message lives in a message object or in a batch object; either way one lease covers the
whole object (:class:`ClaimedObject`). The object is deleted once all its messages are
settled. For a batch, a member's settlement is in the stored lease before its ``ack()`` or
``nack()`` returns (rule 13), so a consumer that takes the batch over after a crash skips it.
"""

from __future__ import annotations

import asyncio
import logging
import reprlib
from collections.abc import Awaitable
from dataclasses import replace
from datetime import timedelta
from types import TracebackType
from typing import Any

from pawn_queue._internal.durations import flag_argument, seconds_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import DeadLetterInfo, Envelope, encode_dead_letter
from pawn_queue._protocol.handout import Handout
from pawn_queue._protocol.landing import write_message
from pawn_queue._protocol.lease_keeper import LeaseKeeper
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.observers import Outcome
from pawn_queue._protocol.runtime import Runtime
from pawn_queue.exceptions import (
    ArgumentError,
    LeaseLostError,
    StoreError,
)

logger = logging.getLogger(__name__)


class ClaimedObject:
    """A message or batch object held under one lease by one consumer."""

    def __init__(
        self,
        key: str,
        lease: Lease,
        size: int,
        runtime: Runtime,
        keeper: LeaseKeeper,
        handout: Handout,
    ) -> None:
        self.key = key
        self.lease = lease
        self.size = size
        # Not a group's lease, which the group's next message waits for.
        self._own_lease = lease.key == layout.lease_key(lease.topic, lease.message_id)
        self._runtime = runtime
        self._store = runtime.store
        self._leases = runtime.leases
        self._signals = runtime.signals
        self._clock = runtime.clock
        self.observers = runtime.observers
        # A run's lease covers other messages too: refreshed until the run is over.
        self._run = lease.members is not None
        self._on_done = keeper.forget  # the lease needs no more refreshes
        self._abandoned: set[int] = set()
        # Member settlements made durable in the lease: one write carries all those made
        # while the write before it was in flight (group commit on the lease).
        self._settlements = 0  # member settlements so far
        # Settlements waiting for a lease write that lists them: (number, its waiter).
        self._unrecorded: list[tuple[int, asyncio.Future[None]]] = []
        self._recording: asyncio.Task[None] | None = None  # the writes, while some wait
        self._finishing: asyncio.Future[None] | None = None  # the object's delete
        self._handout = handout
        self._awaiting: set[int] = set()  # members whose settlement waits for a write
        self._deleting: set[int] = set()  # a message whose ack waits for its own delete

    def _members_pending(self) -> bool:
        """Whether members are neither settled nor left unsettled by their handler: the
        listener still hands them out or handles them, and their acks may share a write."""
        return len(self._abandoned | self.lease.settled) < self.size

    def awaiting_write(self, index: int) -> bool:
        """Whether member ``index`` is settled and waits only for the write saying so."""
        return index in self._awaiting

    def awaiting_delete(self, index: int) -> bool:
        """Whether message ``index`` is settled and waits only for its object's delete."""
        return index in self._deleting

    async def ensure_held(self) -> None:
        """Raise LeaseLostError unless the lease stays ours for a while (refresh if needed)."""
        await self._leases.ensure_held(self.lease)

    async def write_dead_letter(self, envelope: Envelope, reason: str, error: str | None) -> None:
        info = DeadLetterInfo(
            reason, error, self._clock().isoformat(), self.key, self.receive_count(envelope)
        )
        await self._store.put(
            layout.dead_letter_key(envelope.topic, envelope.id),
            encode_dead_letter(envelope, info),
            "overwrite",
        )

    def abandon(self, index: int) -> None:
        """Message ``index`` was left unsettled: once nothing else is pending here, stop
        refreshing the lease so the object is redelivered after the visibility timeout."""
        self._abandoned.add(index)
        if self._run:
            self._leases.member_done(self.lease, self.key, unsettled=True)
        elif not self._members_pending():
            self._on_done(self.lease)
            self._leases.let_expire(self.lease)

    async def extend(self, seconds: float) -> None:
        """Keep the lease ``seconds`` from now, and refresh it by that much from now on."""
        await self._leases.refresh(self.lease, seconds)

    async def requeue(
        self, index: int, envelope: Envelope, delay: float, *, counted: bool = True
    ) -> None:
        """Make message ``index`` visible again after ``delay`` seconds; ``counted=False``
        takes this delivery off its receive count."""
        if self.size == 1 and not self._run:
            # The lease itself holds the message back, and keeps its receive count.
            self._on_done(self.lease)
            await self._leases.release(self.lease, requeue_delay=delay, counted=counted)
            return
        # One member of a batch or a run cannot be shown again alone: it moves to its own
        # object (durable first), then counts as settled here. Never a .run: its second's
        # run may be held here still, which would keep it from every other consumer.
        receives = self.receive_count(envelope) - (0 if counted else 1)
        # Retention counts from when it was first due, not from its new key's time.
        first_due = envelope.first_due
        if first_due is None and (due := layout.due_from_key(self.key)) is not None:
            first_due = due.isoformat()
        moved = replace(envelope, prior_receives=receives, first_due=first_due)
        due = self._clock() + timedelta(seconds=delay)
        key = layout.message_key(
            envelope.topic,
            envelope.id,
            due,
            delayed=delay > 0,
            priority=envelope.priority,
        )
        await write_message(self._runtime, moved, key)
        await self.settle(index)

    def receive_count(self, envelope: Envelope) -> int:
        return envelope.prior_receives + self.lease.body.receive_count

    async def settle(self, index: int, *, acked: bool = False) -> None:
        """Message ``index`` is ``acked`` (or its dead letter is durable); delete the object
        when it was the last one."""
        if self.size > 1:
            self.lease.settled.add(index)
            if len(self.lease.settled) < self.size:
                await self._awaiting_write(index, self._record_settled())
                return
            if self._own_lease:
                # The last one deletes the object: its settlement, and those of the members
                # still waiting for a lease write, are durable once that delete landed.
                self._on_done(self.lease)
                self._finishing = asyncio.ensure_future(self._finish_batch())
                await self._awaiting_write(index, asyncio.shield(self._finishing))
                return
        # A group's next message waits for its lease: that release is not left for later,
        # and the next poll waits for it (else it finds the lease still held here).
        settling = self._leases.settle(
            self.lease, self.key, lease_later=self._own_lease, acked=acked
        )
        if self._own_lease or self._run:
            # The delete may wait for its key's second on a store that limits writes per
            # key (key_writes.py): meanwhile it holds no next poll back (consumer.py).
            await self._awaiting_write(index, settling, self._deleting)
        else:
            await settling
        if not self._run:
            self._on_done(self.lease)

    async def settle_acked(self, indices: list[int]) -> None:
        """Members ``indices`` (distinct, unsettled) are acked together: one lease write
        lists them all, or the object's delete when they are its last ones."""
        if self.size == 1:
            await self.settle(indices[0], acked=True)
            return
        self.lease.settled.update(indices)
        if len(self.lease.settled) < self.size:
            await self._awaiting_write(indices, self._record_settled())
        elif self._own_lease:
            self._on_done(self.lease)
            self._finishing = asyncio.ensure_future(self._finish_batch())
            await self._awaiting_write(indices, asyncio.shield(self._finishing))
        else:
            await self._leases.settle(self.lease, self.key, lease_later=False, acked=True)
            self._on_done(self.lease)

    async def _awaiting_write(
        self, index: int | list[int], write: Awaitable[None], waiting: set[int] | None = None
    ) -> None:
        """Wait for ``write``, known meanwhile as member(s) that wait only for it (in
        ``waiting``: those of a shared lease write by default)."""
        indices = [index] if isinstance(index, int) else index
        waiting = self._awaiting if waiting is None else waiting
        waiting.update(indices)
        self._handout.progressed()
        try:
            await write
        finally:
            waiting.difference_update(indices)

    def _record_settled(self) -> asyncio.Future[None]:
        """A future done once the lease in the store lists every member settled so far
        (rule 5): a settlement made while a write is in flight waits for it, then goes out
        with the others that waited, in one write. A failed write fails those waiting."""
        self._settlements += 1
        recorded = asyncio.get_running_loop().create_future()
        self._unrecorded.append((self._settlements, recorded))
        if self._recording is None:
            self._recording = asyncio.ensure_future(self._write_settled())
        return recorded

    async def _write_settled(self) -> None:
        try:
            while self._unrecorded:
                # Members the listener still hands out or handles: their acks may share this.
                await self._handout.hold(self._members_pending)
                # Read as the write begins (a loop turn after it was asked for, at least):
                # settlements made together, as the acks of one poll gathered, share it.
                settlements = self._settlements
                if self._finishing is not None:
                    await asyncio.shield(self._finishing)  # all settled: the delete says so
                else:
                    await self._leases.refresh(self.lease)
                waiting, self._unrecorded = self._unrecorded, []
                for number, recorded in waiting:
                    if number > settlements:
                        self._unrecorded.append((number, recorded))
                    elif not recorded.done():  # its ack may have been cancelled
                        recorded.set_result(None)
        except BaseException as exc:
            waiting, self._unrecorded = self._unrecorded, []
            for _, recorded in waiting:
                if recorded.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    recorded.cancel()
                else:
                    recorded.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._recording = None

    async def _finish_batch(self) -> None:
        """Delete a batch object whose members are all settled, then (in the background, as
        after an ack) its lease. If the delete fails, the lease records every member as
        settled and is left to expire: the consumer that takes the object over deletes it.
        Raises only if neither landed."""
        try:
            # Acked: its id is the batch's, which no redrive brings back.
            await self._leases.settle(self.lease, self.key, lease_later=True, acked=True)
        except StoreError as exc:
            logger.warning("batch object delete failed key=%s error=%s", self.key, exc)
            await self._leases.refresh(self.lease)


class Message:
    """A message claimed by a consumer. Settle it with :meth:`ack` or :meth:`nack`.

    ``ack()`` and ``nack()`` are idempotent: once one of them succeeded, later calls do nothing.
    If the lease was lost (it expired and another consumer took the message over), they raise
    :class:`~pawn_queue.exceptions.LeaseLostError` and delete nothing.
    """

    __slots__ = ("_claimed", "_envelope", "_index", "_lock", "_settled")

    def __init__(self, envelope: Envelope, claimed: ClaimedObject, index: int = 0) -> None:
        self._envelope = envelope
        self._claimed = claimed
        self._index = index
        self._settled = False
        # One settlement at a time; made when first needed, since most messages are settled
        # once, by ack_together, which locks a whole batch with one lock.
        self._lock: asyncio.Lock | None = None

    def _settling_lock(self) -> asyncio.Lock:
        lock = self._lock
        if lock is None:
            lock = self._lock = asyncio.Lock()
        return lock

    @property
    def id(self) -> str:
        """The message's UUIDv4."""
        return self._envelope.id

    @property
    def topic(self) -> str:
        """The topic it was published to."""
        return layout.split_queue(self._envelope.topic)[0]

    @property
    def subscription(self) -> str | None:
        """The subscription it was delivered through; None when read from the topic itself."""
        return layout.split_queue(self._envelope.topic)[1]

    @property
    def queue(self) -> str:
        """Where it waited: the topic's name, or ``{topic}/subscriptions/{name}``."""
        return self._envelope.topic

    @property
    def producer_id(self) -> str:
        """The id of the producer that published the message."""
        return self._envelope.producer_id

    @property
    def created_at(self) -> str:
        """ISO-8601 UTC time of publication."""
        return self._envelope.created_at

    @property
    def payload(self) -> Any:
        """The payload as published: a JSON value, or ``bytes``."""
        return self._envelope.payload

    @property
    def group(self) -> str | None:
        """The message group it was published in, if any."""
        return self._envelope.group

    @property
    def attributes(self) -> dict[str, str]:
        return dict(self._envelope.attributes)

    @property
    def priority(self) -> int:
        """Its priority, 0 (the default, the lowest) to 9: ``publish(priority=...)``."""
        return self._envelope.priority

    @property
    def expires_at(self) -> str | None:
        """When the message stops being delivered (``publish(expires_in=...)``), ISO 8601
        UTC; None if only the topic's retention ends it."""
        return self._envelope.expires_at

    @property
    def settled(self) -> bool:
        """True once ack() or nack() succeeded."""
        return self._settled

    @property
    def lease_held(self) -> bool:
        """False once the lease is known to be lost or released."""
        lease = self._claimed.lease
        return not (lease.lost or lease.released)

    def abandon(self) -> None:
        """Stop keeping this message: it is redelivered after the visibility timeout."""
        if not self._settled:
            self._claimed.abandon(self._index)

    def _waits_for_write(self) -> bool:
        """Settled, and waiting only for the lease write that makes it durable, which it
        shares with other members of its object: it holds no concurrency slot."""
        return self._claimed.awaiting_write(self._index)

    def _waits_for_durable(self) -> bool:
        """Settled, and waiting only for the write that makes it durable, a shared one or
        its own delete: it holds no next poll back."""
        return self._waits_for_write() or self._claimed.awaiting_delete(self._index)

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, topic={self.topic!r}, created_at={self.created_at!r})"

    async def ack(self) -> None:
        """Remove the message from the queue: it will not be delivered again."""
        async with _Settling(self):
            if self._settled:
                return
            await self._claimed.ensure_held()
            await self._claimed.settle(self._index, acked=True)
            self._settled = True
            self._observed("ack")

    def _observed(self, outcome: Outcome, reason: str | None = None) -> None:
        if self._claimed.observers:
            self._claimed.observers.settled(self, outcome, reason)

    @property
    def receive_count(self) -> int:
        """How many times the message was delivered, this time included."""
        return self._claimed.receive_count(self._envelope)

    async def extend(self, seconds: float) -> None:
        """Keep the message for ``seconds`` from now (SQS's ChangeMessageVisibility); the
        background refresh then keeps renewing it by that much."""
        seconds = seconds_argument("extend", seconds)
        async with self._settling_lock():
            if not self._settled:
                await self._claimed.extend(seconds)

    async def nack(self, requeue: bool = False, delay: float = 0) -> None:
        """Dead-letter the message (the copy is durable before the message is removed), or
        with ``requeue=True`` make it visible again after ``delay`` seconds."""
        flag_argument("requeue", requeue)
        delay = seconds_argument("delay", delay, zero=True)
        if not requeue:
            await self.dead_letter("nack")
            return
        await self._put_back(delay, counted=True)

    async def _put_back(self, delay: float, *, counted: bool = False) -> None:
        """Make it visible again after ``delay`` seconds; unless ``counted``, as if this
        delivery had not been (a subscriber paused by ``RateLimited``, not a failure)."""
        async with _Settling(self):
            if self._settled:
                return
            await self._claimed.ensure_held()
            await self._claimed.requeue(self._index, self._envelope, delay, counted=counted)
            self._settled = True
            self._observed("nack_requeue")

    async def _drop_expired(self) -> None:
        """Remove the message undelivered: it is past its own deadline (a topic whose
        ``retention_action`` is ``"dead_letter"`` dead-letters it instead)."""
        async with _Settling(self):
            if self._settled:
                return
            await self._claimed.ensure_held()
            await self._claimed.settle(self._index)
            self._settled = True
            self._observed("expired")

    async def dead_letter(self, reason: str, error: str | None = None) -> None:
        """Dead-letter with a reason (and the error text of a failed handler)."""
        if not isinstance(reason, str) or not reason:
            raise ArgumentError(f"reason: got {reprlib.repr(reason)}, must be a non-empty string")
        if error is not None and not isinstance(error, str):
            raise ArgumentError(f"error: got {reprlib.repr(error)}, must be a string or None")
        async with _Settling(self):
            if self._settled:
                return
            await self._claimed.ensure_held()
            await self._claimed.write_dead_letter(self._envelope, reason, error)
            await self._claimed.settle(self._index)
            self._settled = True
            self._observed("dead_letter", reason)


class _Settling:
    """One settlement of a message at a time. If it fails, the lease is no longer refreshed
    in the background: the message comes back after the visibility timeout at the latest,
    not held for as long as the consumer runs by a caller who could not settle it (rule 10).
    Settling again may still succeed while the lease lasts.

    A class rather than an async generator: it is on every ack's path, and an async
    generator's machinery costs several times as much per call."""

    __slots__ = ("_message",)

    def __init__(self, message: Message) -> None:
        self._message = message

    async def __aenter__(self) -> None:
        await self._message._settling_lock().acquire()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        message = self._message
        try:
            if exc is not None:
                if not message._settled:
                    message._claimed.abandon(message._index)
                if isinstance(exc, LeaseLostError) and message._claimed.observers:
                    message._claimed.observers.lease_lost(message)
        finally:
            message._settling_lock().release()
