"""Dead letters: list and inspect them, redrive them to their topic, purge them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from pawn_queue import layout
from pawn_queue.envelope import CorruptObject, decode_dead_letter, now_utc
from pawn_queue.exceptions import ConfigError, NotFound
from pawn_queue.message import write_message
from pawn_queue.notify import ChangeSignals
from pawn_queue.store.base import Store
from pawn_queue.topics import Topics

logger = logging.getLogger(__name__)

_PAGE = 1000


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

    @property
    def redrivable(self) -> bool:
        """False for an object that was quarantined because it was not a valid message."""
        return self.reason != "corrupt"


class DeadLetters:
    """Dead-letter operations on one store."""

    def __init__(self, store: Store, topics: Topics, signals: ChangeSignals) -> None:
        self._store = store
        self._topics = topics
        self._signals = signals

    async def list(self, topic: str, *, limit: int | None = None) -> list[DeadLetter]:
        """The topic's dead letters, oldest key first. Costs a LIST per 1,000 and a GET each."""
        await self._topics.settings(topic)
        metas = await self._store.list(layout.dead_letter_prefix(topic), limit=limit)
        letters = await asyncio.gather(*(self._read(m.key) for m in metas))
        return [letter for letter in letters if letter is not None]

    async def _read(self, key: str) -> DeadLetter | None:
        try:
            data = (await self._store.get(key)).data
        except NotFound:
            return None  # redriven or purged meanwhile
        message_id = key.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            envelope, info = decode_dead_letter(data)
        except CorruptObject as exc:
            return DeadLetter(message_id, "", "", "", None, {}, "corrupt", str(exc), "", 0, key)
        return DeadLetter(
            id=envelope.id,
            topic=envelope.topic,
            producer_id=envelope.producer_id,
            created_at=envelope.created_at,
            payload=envelope.payload,
            attributes=dict(envelope.attributes),
            reason=info.reason if info else "nack",
            error=info.error if info else None,
            dead_lettered_at=info.dead_lettered_at if info else "",
            receive_count=info.receive_count if info else 0,
            key=key,
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
        deleted, so a crash in between leaves a duplicate, never a loss."""
        if per_second is not None and per_second <= 0:
            raise ConfigError(f"per_second: got {per_second!r}, must be > 0")
        wanted = set(ids) if ids is not None else None
        moved = 0
        for letter in await self.list(topic):
            if limit is not None and moved >= limit:
                break
            if (wanted is not None and letter.id not in wanted) or not letter.redrivable:
                continue
            data = (await self._store.get(letter.key)).data
            envelope, _ = decode_dead_letter(data)
            await write_message(
                self._store, replace(envelope, topic=topic), now_utc(), self._signals
            )
            await self._store.delete(letter.key)
            moved += 1
            if per_second is not None:
                await asyncio.sleep(1 / per_second)
        logger.info("redrove topic=%s messages=%d", topic, moved)
        return moved

    async def purge(self, topic: str) -> int:
        """Delete every dead letter of the topic; return how many."""
        await self._topics.settings(topic)
        purged = 0
        while page := await self._store.list(layout.dead_letter_prefix(topic), limit=_PAGE):
            await self._store.delete_many([m.key for m in page])
            purged += len(page)
        logger.info("purged dead letters topic=%s count=%d", topic, purged)
        return purged
