"""Message: one delivered message and how it is settled (ack, nack).

A message lives in a message object or in a batch object; either way one lease covers the
whole object (:class:`ClaimedObject`). The object is deleted once all its messages are
settled. For a batch, the members settled so far are written into the lease with its next
refresh, so a consumer that takes the batch over after a crash skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from pawn_queue import layout
from pawn_queue.envelope import DeadLetterInfo, Envelope, encode_dead_letter, now_utc
from pawn_queue.exceptions import NotFound, StoreError
from pawn_queue.leases import Lease, LeaseManager
from pawn_queue.store.base import Store

logger = logging.getLogger(__name__)


class ClaimedObject:
    """A message or batch object held under one lease by one consumer."""

    def __init__(
        self,
        key: str,
        lease: Lease,
        size: int,
        store: Store,
        leases: LeaseManager,
        on_done: Callable[[Lease], None],
    ) -> None:
        self.key = key
        self.lease = lease
        self.size = size
        self._store = store
        self._leases = leases
        self._on_done = on_done
        self._abandoned: set[int] = set()

    async def ensure_held(self) -> None:
        """Raise LeaseLostError unless the lease stays ours for a while (refresh if needed)."""
        await self._leases.ensure_held(self.lease)

    async def write_dead_letter(self, envelope: Envelope, reason: str, error: str | None) -> None:
        info = DeadLetterInfo(reason, error, now_utc().isoformat(), self.key)
        await self._store.put(
            layout.dead_letter_key(envelope.topic, envelope.id),
            encode_dead_letter(envelope, info),
            "overwrite",
        )

    def abandon(self, index: int) -> None:
        """Message ``index`` was left unsettled: once nothing else is pending here, stop
        refreshing the lease so the object is redelivered after the visibility timeout."""
        self._abandoned.add(index)
        if len(self._abandoned | self.lease.settled) >= self.size:
            self._on_done(self.lease)

    async def settle(self, index: int) -> None:
        """Message ``index`` is acked (or its dead letter is durable); delete the object when
        it was the last one."""
        if self.size > 1:
            self.lease.settled.add(index)
            if len(self.lease.settled) < self.size:
                return
        with contextlib.suppress(NotFound):
            await self._leases.deleter.delete(self.key)
        self._on_done(self.lease)
        try:
            await self._leases.release(self.lease, message_gone=True)
        except StoreError as exc:
            # The object is gone; a leftover lease blocks nothing.
            logger.warning("lease release failed key=%s error=%s", self.lease.key, exc)


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
        self._lock = asyncio.Lock()

    @property
    def id(self) -> str:
        """The message's UUIDv4."""
        return self._envelope.id

    @property
    def topic(self) -> str:
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
        """The JSON payload as published."""
        return self._envelope.payload

    @property
    def attributes(self) -> dict[str, str]:
        return dict(self._envelope.attributes)

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

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, topic={self.topic!r}, created_at={self.created_at!r})"

    async def ack(self) -> None:
        """Remove the message from the queue: it will not be delivered again."""
        async with self._lock:
            if self._settled:
                return
            await self._claimed.ensure_held()
            await self._claimed.settle(self._index)
            self._settled = True

    async def nack(self) -> None:
        """Move the message to dead letter: the copy is durable before the message is removed."""
        await self.dead_letter("nack")

    async def dead_letter(self, reason: str, error: str | None = None) -> None:
        """Dead-letter with a reason (and the error text of a failed handler)."""
        async with self._lock:
            if self._settled:
                return
            await self._claimed.ensure_held()
            await self._claimed.write_dead_letter(self._envelope, reason, error)
            await self._claimed.settle(self._index)
            self._settled = True
