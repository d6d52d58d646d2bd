"""Topics: markers that say a topic exists and hold its settings."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from pawn_queue import layout
from pawn_queue.envelope import encode_json, now_utc
from pawn_queue.exceptions import (
    AlreadyExists,
    ConfigError,
    NotFound,
    PreconditionFailed,
    TopicNotFoundError,
)
from pawn_queue.store.base import IfMatch, Store

logger = logging.getLogger(__name__)

_CACHE_SECONDS = 30.0
_DELETE_PAGE = 1000


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """Per-topic settings, stored in the topic marker."""

    max_receive_count: int | None = None
    retention_seconds: float | None = None
    max_pending: int | None = None
    dedup_window_seconds: float = 300.0
    retention_action: str = "delete"  # or "dead_letter": what happens past retention

    def __post_init__(self) -> None:
        if self.retention_action not in ("delete", "dead_letter"):
            raise ConfigError(
                f"retention_action: got {self.retention_action!r}, allowed: 'delete', 'dead_letter'"
            )
        for name in ("max_receive_count", "retention_seconds", "max_pending"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name}: got {value!r}, must be a positive number or None")
        if self.dedup_window_seconds < 0:
            raise ConfigError(
                f"dedup_window_seconds: got {self.dedup_window_seconds!r}, must be >= 0"
            )

    @classmethod
    def from_marker(cls, data: bytes) -> TopicSettings:
        """Settings from a marker; markers of pawn-queue 0.1.x (no settings) give the defaults."""
        try:
            raw = json.loads(data).get("settings") or {}
            known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
            return cls(**known)
        except (ValueError, TypeError, AttributeError, RecursionError, ConfigError):
            logger.warning("topic marker has unreadable settings; using defaults")
            return cls()


class Topics:
    """Create, find, list and delete topics. Caches markers for a short time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cache: dict[str, tuple[float, TopicSettings]] = {}

    async def create(self, name: str, settings: TopicSettings) -> None:
        layout.validate_name(name, "topic name")
        key = layout.topic_marker_key(name)
        body = {"topic": name, "created_at": now_utc().isoformat(), "settings": asdict(settings)}
        try:
            await self._store.put(key, encode_json(body), "create")
            logger.info("topic created topic=%s", name)
        except AlreadyExists:
            current = await self._store.get(key)
            created_at = _created_at(current.data)  # None: unreadable, rewritten below
            if created_at is None or TopicSettings.from_marker(current.data) != settings:
                body["created_at"] = created_at or body["created_at"]
                try:
                    await self._store.put(key, encode_json(body), IfMatch(current.meta.etag))
                    logger.info("topic settings updated topic=%s", name)
                except PreconditionFailed:
                    logger.info("topic settings changed concurrently topic=%s", name)
        self._cache[name] = (time.monotonic() + _CACHE_SECONDS, settings)

    async def settings(self, name: str) -> TopicSettings:
        """The topic's settings; raise TopicNotFoundError if it does not exist."""
        layout.validate_name(name, "topic name")  # first: a name may not even be hashable
        cached = self._cache.get(name)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        try:
            marker = await self._store.get(layout.topic_marker_key(name))
        except NotFound:
            self._cache.pop(name, None)
            raise TopicNotFoundError(f"topic {name!r} does not exist") from None
        settings = TopicSettings.from_marker(marker.data)
        self._cache[name] = (time.monotonic() + _CACHE_SECONDS, settings)
        return settings

    async def list(self) -> list[str]:
        """All topics, sorted. Costs two requests per top-level name in the bucket."""
        topics: list[str] = []
        cursor: str | None = None
        while True:
            first = await self._store.list("", start_after=cursor, limit=1)
            if not first:
                return topics
            segment = first[0].key.split("/", 1)[0]
            cursor = layout.after_subtree(segment)
            if segment.startswith(layout.RESERVED_PREFIXES) or "/" not in first[0].key:
                continue
            try:
                await self._store.head(layout.topic_marker_key(segment))
            except NotFound:
                continue
            topics.append(segment)

    async def delete(self, name: str) -> int:
        """Delete the topic and everything in it; returns the number of objects deleted."""
        layout.validate_name(name, "topic name")
        marker = layout.topic_marker_key(name)
        try:
            await self._store.head(marker)
        except NotFound:
            raise TopicNotFoundError(f"topic {name!r} does not exist") from None
        # Marker first: publishers stop seeing the topic before its messages go.
        await self._store.delete(marker)
        self._cache.pop(name, None)
        deleted = 1
        prefix = layout.topic_prefix(name)
        while page := await self._store.list(prefix, limit=_DELETE_PAGE):
            await self._store.delete_many([m.key for m in page])
            deleted += len(page)
        logger.info("topic deleted topic=%s objects=%d", name, deleted)
        return deleted


def _created_at(marker: bytes) -> str | None:
    """The creation time recorded in a marker; None if the marker is unreadable."""
    try:
        value = json.loads(marker).get("created_at")
    except (ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class TopicStats:
    """Approximate counts for a topic (objects, not messages: a batch object counts once)."""

    pending: int  # due and not leased
    in_flight: int  # with a lease written within the visibility timeout
    delayed: int  # not due yet
    dead_letter: int
    oldest_age_seconds: float | None  # age of the oldest pending object, from its due time


async def topic_stats(store: Store, name: str, visibility_seconds: float) -> TopicStats:
    """Counts from three listings: one LIST per 1,000 messages, leases and dead letters."""
    now = now_utc()
    messages, leases, dead = (
        await store.list(layout.messages_prefix(name)),
        await store.list(layout.leases_prefix(name)),
        await store.list(layout.dead_letter_prefix(name)),
    )
    fresh_after = now - timedelta(seconds=visibility_seconds)
    leased = {m.key for m in leases if m.last_modified > fresh_after}
    pending = in_flight = delayed = 0
    oldest: datetime | None = None
    group_heads: set[str] = set()
    for meta in messages:
        pending_key = layout.parse_pending_key(meta.key)
        if pending_key is None:
            continue
        due = layout.due_from_key(meta.key) or meta.last_modified
        # A group's lease covers only its oldest message; the rest of the group waits.
        head = pending_key.kind != "group" or pending_key.group_hash not in group_heads
        group_heads.add(pending_key.group_hash)
        if due > now:
            delayed += 1
        elif head and layout.lease_key(name, pending_key.lease_id()) in leased:
            in_flight += 1
        else:
            pending += 1
            oldest = due if oldest is None else min(oldest, due)
    age = (now - oldest).total_seconds() if oldest is not None else None
    return TopicStats(pending, in_flight, delayed, len(dead), age)
