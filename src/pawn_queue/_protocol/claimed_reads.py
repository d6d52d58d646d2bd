"""Reading a claimed object into messages: what claiming does once a lease is won.

An object may turn out to be settled already, unreadable (quarantined as a dead letter),
received too often, or past its topic's retention; those are finished here and yield no
message.
"""

from __future__ import annotations

import logging

from pawn_queue._protocol import layout
from pawn_queue._protocol.delivery import ClaimedObject, Message
from pawn_queue._protocol.envelope import (
    CorruptObject,
    DeadLetterInfo,
    Envelope,
    decode_pending,
    encode_unreadable,
)
from pawn_queue._protocol.expiry import past_retention, settle_expired
from pawn_queue._protocol.handout import Handout
from pawn_queue._protocol.lease_keeper import LeaseKeeper
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.runtime import Runtime

logger = logging.getLogger(__name__)


class ClaimedReader:
    """Reads the objects one consumer claimed, holding their leases in ``keeper``."""

    def __init__(self, runtime: Runtime, keeper: LeaseKeeper, handout: Handout) -> None:
        self._runtime = runtime
        self._store = runtime.store
        self._leases = runtime.leases
        self._topic_settings = runtime.topics
        self._clock = runtime.clock
        self._keeper = keeper
        self._handout = handout

    async def read(
        self, topic: str, pending: layout.PendingKey, key: str, lease: Lease
    ) -> list[Message] | None:
        """Read a claimed object into messages; None if another consumer just settled it."""
        is_batch = pending.kind == "batch"
        object_id = pending.object_id
        obj = await self._leases.read_claimed(lease, lambda: self._store.get(key), key)
        if obj is None:
            return None  # acked by another consumer while we claimed
        try:
            envelopes = decode_pending(obj.data, topic, object_id, batch=is_batch)
        except CorruptObject as exc:
            await self._quarantine(topic, object_id, key, obj.data, str(exc), lease)
            return []
        if lease.settled.issuperset(range(len(envelopes))):
            # Its holder settled every member but did not get to delete it (a crash, a
            # failed delete): finish that.
            await self._remove(key, lease)
            return []
        settings = await self._topic_settings.settings(topic)
        # A batch member requeued alone brings its receives with it (prior_receives).
        received = lease.body.receive_count + max(
            (e.prior_receives for i, e in enumerate(envelopes) if i not in lease.settled),
            default=0,
        )
        if settings.max_receive_count and received > settings.max_receive_count:
            # Received too often: dead-letter whatever is left of it instead of delivering.
            error = f"received {received} times; the topic allows {settings.max_receive_count}"
            await self._dead_letter_all(key, lease, envelopes, "max_receive_count", error)
            return []
        retention = settings.retention_seconds
        left = [e for i, e in enumerate(envelopes) if i not in lease.settled]
        if retention and past_retention(key, left, retention, self._clock()):
            error = f"not consumed within the topic's retention of {settings.retention_seconds}s"
            if settings.retention_action == "dead_letter":
                await self._dead_letter_all(key, lease, envelopes, "retention", error)
            else:
                await self._remove(key, lease)
                logger.info("expired message key=%s %s", key, error)
            return []
        claimed = ClaimedObject(
            key, lease, len(envelopes), self._runtime, self._keeper, self._handout
        )
        now = self._clock()
        messages = []
        for index, envelope in enumerate(envelopes):
            if index in lease.settled:
                continue
            message = Message(envelope, claimed, index)
            if envelope.expires_at is not None and envelope.expired(now):
                await settle_expired(message, settings.retention_action)
            else:
                messages.append(message)
        if messages:
            self._keeper.hold(lease)
        return messages

    async def _remove(self, key: str, lease: Lease) -> None:
        """Delete a claimed object, then its lease (rule 4). If the object's delete fails,
        it stays claimed until its lease expires, and is looked at again."""
        await self._leases.settle(lease, key)

    async def _dead_letter_all(
        self, key: str, lease: Lease, envelopes: list[Envelope], reason: str, error: str
    ) -> None:
        claimed = ClaimedObject(
            key, lease, len(envelopes), self._runtime, self._keeper, self._handout
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
                object_id,
                topic,
                data,
                DeadLetterInfo("corrupt", error, self._clock().isoformat(), key),
            ),
        )
        await self._remove(key, lease)
        logger.warning("quarantined corrupt object key=%s error=%s", key, error)
        if self._runtime.observers:
            self._runtime.observers.quarantined(topic, key, error)
