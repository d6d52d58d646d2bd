"""Message: one delivered message and how it is settled (ack, nack)."""

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


class Message:
    """A message claimed by a consumer. Settle it with :meth:`ack` or :meth:`nack`.

    ``ack()`` and ``nack()`` are idempotent: once one of them succeeded, later calls do nothing.
    If the lease was lost (it expired and another consumer took the message over), they raise
    :class:`~pawn_queue.exceptions.LeaseLostError` and delete nothing.
    """

    __slots__ = (
        "_envelope",
        "_key",
        "_lease",
        "_leases",
        "_lock",
        "_on_settled",
        "_settled",
        "_store",
    )

    def __init__(
        self,
        envelope: Envelope,
        key: str,
        lease: Lease,
        store: Store,
        leases: LeaseManager,
        on_settled: Callable[[Lease], None],
    ) -> None:
        self._envelope = envelope
        self._key = key
        self._lease = lease
        self._store = store
        self._leases = leases
        self._on_settled = on_settled
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

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, topic={self.topic!r}, created_at={self.created_at!r})"

    async def ack(self) -> None:
        """Delete the message (then its lease): it will not be delivered again."""
        async with self._lock:
            if self._settled:
                return
            await self._leases.ensure_held(self._lease)
            with contextlib.suppress(NotFound):
                await self._store.delete(self._key)
            await self._finish()

    async def nack(self) -> None:
        """Move the message to dead letter: the copy is durable before the message is deleted."""
        await self.dead_letter("nack")

    async def dead_letter(self, reason: str, error: str | None = None) -> None:
        """Dead-letter with a reason (and the error text of a failed handler)."""
        async with self._lock:
            if self._settled:
                return
            await self._leases.ensure_held(self._lease)
            info = DeadLetterInfo(reason, error, now_utc().isoformat(), self._key)
            await self._store.put(
                layout.dead_letter_key(self.topic, self.id),
                encode_dead_letter(self._envelope, info),
                "overwrite",
            )
            with contextlib.suppress(NotFound):
                await self._store.delete(self._key)
            await self._finish()

    async def _finish(self) -> None:
        self._settled = True
        self._on_settled(self._lease)
        try:
            await self._leases.release(self._lease, message_gone=True)
        except StoreError as exc:
            # The message is gone; a leftover lease is reclaimed by the janitor later.
            logger.warning("lease release failed key=%s error=%s", self._lease.key, exc)
