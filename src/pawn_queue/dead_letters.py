"""Dead letters: list and inspect them, redrive them to their topic, purge them."""

from __future__ import annotations

import asyncio
import logging
import reprlib
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import (
    CorruptObject,
    DeadLetterInfo,
    decode_dead_letter,
    encode_dead_letter,
)
from pawn_queue._protocol.landing import write_message
from pawn_queue._protocol.runtime import Runtime
from pawn_queue.exceptions import ArgumentError, NotFound, PreconditionFailed, StoreError
from pawn_queue.store.base import IfMatch

logger = logging.getLogger(__name__)

_MARK_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered message: the message as published, and why it ended here."""

    id: str
    topic: str
    producer_id: str
    created_at: str
    payload: Any
    attributes: dict[str, str]
    reason: str
    error: str | None
    dead_lettered_at: str
    receive_count: int
    key: str
    subscription: str | None = None
    """The subscription whose consumers dead-lettered it; None for the topic's own."""
    priority: int = 0
    """Its priority as published (0 to 9); a redrive publishes it back with it."""

    @property
    def redrivable(self) -> bool:
        """False for an object that was quarantined because it was not a valid message."""
        return self.reason != "corrupt"


class DeadLetters:
    """Dead-letter operations on one store."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._store = runtime.store
        self._topics = runtime.topics
        self._signals = runtime.signals
        self._clock = runtime.clock

    async def list(self, topic: str, *, limit: int | None = None) -> list[DeadLetter]:
        """The topic's dead letters, oldest first (``limit``: the oldest ``limit``).

        Costs a LIST per 1,000 dead letters and a GET for each one returned. Age is the time
        the store wrote the dead letter; letters written within the same second (S3 keeps
        times to the second) are ordered by ``dead_lettered_at``.
        """
        await self._topics.settings(topic)
        metas = await self._store.list(layout.dead_letter_prefix(topic))
        metas.sort(key=lambda m: (m.last_modified, m.key))
        if limit is not None:
            if limit <= 0:
                return []
            if limit < len(metas):
                # Keep the ties of the last one: their order is decided after reading them.
                last = metas[limit - 1].last_modified
                metas = [m for m in metas if m.last_modified <= last]
        written = {m.key: m.last_modified for m in metas}
        read = await asyncio.gather(*(self._read(m.key) for m in metas))
        letters = [letter for letter in read if letter is not None]
        letters.sort(key=lambda d: (written[d.key], d.dead_lettered_at, d.id))
        return letters if limit is None else letters[:limit]

    async def get(self, topic: str, message_id: str) -> DeadLetter | None:
        """The dead letter of message ``message_id`` (one GET); None if there is none."""
        await self._topics.settings(topic)
        if not isinstance(message_id, str) or not layout.is_uuid(message_id):
            return None  # every dead letter is named by a message's UUID
        return await self._read(layout.dead_letter_key(topic, message_id))

    async def _read(self, key: str) -> DeadLetter | None:
        try:
            data = (await self._store.get(key)).data
        except NotFound:
            return None  # redriven or purged meanwhile
        message_id = key.rsplit("/", 1)[-1].removesuffix(".json")
        topic, subscription = layout.split_queue(layout.queue_of(key))
        try:
            envelope, info = decode_dead_letter(data)
            if not layout.is_uuid(envelope.id):
                # A redrive writes the message under this id: it must make a message key.
                raise CorruptObject(f"dead letter id {envelope.id[:40]!r} is not a UUID")
        except CorruptObject as exc:
            return DeadLetter(
                message_id, topic, "", "", None, {}, "corrupt", str(exc), "", 0, key, subscription
            )
        return DeadLetter(
            id=envelope.id,
            topic=topic,
            producer_id=envelope.producer_id,
            created_at=envelope.created_at,
            payload=envelope.payload,
            attributes=dict(envelope.attributes),
            reason=info.reason if info else "nack",
            error=info.error if info else None,
            dead_lettered_at=info.dead_lettered_at if info else "",
            receive_count=info.receive_count if info else 0,
            key=key,
            subscription=subscription,
            priority=envelope.priority,
        )

    async def redrive(
        self,
        topic: str,
        *,
        ids: Collection[str] | None = None,
        limit: int | None = None,
        per_second: float | None = None,
    ) -> int:
        """Publish dead letters back to their topic (same id, payload and attributes) and
        delete them; return how many. ``ids`` selects some, ``limit`` caps the number,
        ``per_second`` paces the writes. Each message is written before its dead letter is
        deleted, so a crash in between leaves both, never neither; running the redrive again
        then rewrites the same message object and deletes the dead letter."""
        if per_second is not None and per_second <= 0:
            raise ArgumentError(f"per_second: got {per_second!r}, must be > 0")
        wanted = None if ids is None else _id_set(ids)
        moved = 0
        for letter in await self.list(topic):
            if limit is not None and moved >= limit:
                break
            if (wanted is not None and letter.id not in wanted) or not letter.redrivable:
                continue
            moved += await self._move(topic, letter.key)
            if per_second is not None:
                await asyncio.sleep(1 / per_second)
        logger.info("redrove topic=%s messages=%d", topic, moved)
        return moved

    async def _move(self, topic: str, key: str) -> int:
        """Write the dead letter at ``key`` back as a pending message, then delete it; return
        1, or 0 if it is gone.

        The message's new key is first written into the dead letter (if-match), so a redrive
        re-run after a crash between the two steps rewrites that same object instead of adding
        a second copy of the message.
        """
        for _ in range(_MARK_ATTEMPTS):
            try:
                stored = await self._store.get(key)
            except NotFound:
                return 0  # redriven or purged meanwhile
            envelope, info = decode_dead_letter(stored.data)
            target = info.redrive_key if info is not None else ""
            pending = layout.parse_pending_key(target)
            if (
                pending is None
                or pending.kind != "message"
                or pending.object_id != envelope.id
                or not target.startswith(layout.messages_prefix(topic))
            ):
                target = layout.message_key(
                    topic, envelope.id, self._clock(), priority=envelope.priority
                )
                marked = replace(info or DeadLetterInfo("nack", None, "", ""), redrive_key=target)
                body = encode_dead_letter(envelope, marked)
                try:
                    await self._store.put(key, body, IfMatch(stored.meta.etag))
                except PreconditionFailed:
                    continue  # rewritten meanwhile, or our own retried write landed: read again
            message = replace(envelope, topic=topic)
            await write_message(self._runtime, message, target)
            await self._store.delete(key)
            return 1
        raise StoreError(f"dead letter {key} kept changing while it was being redriven")

    async def purge(self, topic: str) -> int:
        """Delete every dead letter of the topic; return how many."""
        await self._topics.settings(topic)
        purged = 0
        prefix = layout.dead_letter_prefix(topic)
        while page := await self._store.list(prefix, limit=layout.LIST_PAGE):
            await self._store.delete_many([m.key for m in page])
            purged += len(page)
        logger.info("purged dead letters topic=%s count=%d", topic, purged)
        return purged


def _id_set(ids: Collection[str]) -> set[str]:
    """``ids`` as a set, or ArgumentError (a lone string would otherwise be read as its letters)."""
    try:
        if isinstance(ids, str | bytes):
            raise TypeError
        wanted = set(ids)
        if not all(isinstance(i, str) for i in wanted):
            raise TypeError
    except TypeError:
        raise ArgumentError(
            f"ids: got {reprlib.repr(ids)}, must be a collection of message id strings"
        ) from None
    return wanted
