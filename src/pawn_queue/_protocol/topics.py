"""Topics: markers that say a topic exists and hold its settings; what a topic holds (its
stats, and peeking at its oldest messages), from one classification of its listing."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal, final

from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import (
    CorruptObject,
    Envelope,
    decode_batch,
    encode_json,
    now_utc,
)
from pawn_queue.exceptions import (
    AlreadyExists,
    ConfigError,
    NotFound,
    PreconditionFailed,
    StoreError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    TopicSettingsConflictError,
)
from pawn_queue.store.base import IfMatch, ObjectMeta, Store

logger = logging.getLogger(__name__)

_CACHE_SECONDS = 30.0
_MARKER_ATTEMPTS = 5


@final
class NotGiven:
    """The default of a setting the caller left out. It is told apart from every value the
    caller could pass (None included), and shows as the documented default it stands for."""

    __slots__ = ("default",)

    def __init__(self, default: object) -> None:
        self.default = default

    def __repr__(self) -> str:
        return repr(self.default)


# The defaults of create_topic / update_topic: "not given", shown as TopicSettings' defaults.
NO_LIMIT = NotGiven(None)
DEFAULT_DEDUP_WINDOW = NotGiven(300.0)
DEFAULT_RETENTION_ACTION = NotGiven("delete")
DEFAULT_REPLAY_WINDOW = NotGiven(0.0)
DEFAULT_CLAIMS = NotGiven("second")
# The claims of a topic whose marker does not say: written by 0.2.0 or 0.1, whose consumers
# do not read .run names (or unreadable). A new topic claims by the second.
_UNSAID_CLAIMS = "message"


def given_settings(**values: object) -> dict[str, Any]:
    """The settings among ``values`` that the caller passed (not :class:`NotGiven`)."""
    return {name: value for name, value in values.items() if not isinstance(value, NotGiven)}


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """Per-topic settings, stored in the topic marker."""

    max_receive_count: int | None = None
    retention_seconds: float | None = None
    max_pending: int | None = None
    dedup_window_seconds: float = 300.0
    retention_action: str = "delete"  # or "dead_letter": what happens past retention
    replay_window_seconds: float = 0.0  # keep every message this long after publish, for seek
    # "second": one claim covers a run of messages (docs/protocol.md "Runs").
    # A marker that does not say (written before the setting) means "message".
    claims: str = "second"

    def __post_init__(self) -> None:
        if self.retention_action not in ("delete", "dead_letter"):
            raise ConfigError(
                f"retention_action: got {self.retention_action!r}, allowed: 'delete', 'dead_letter'"
            )
        if self.claims not in ("message", "second"):
            raise ConfigError(f"claims: got {self.claims!r}, allowed: 'message', 'second'")
        for name in ("max_receive_count", "max_pending"):
            value = getattr(self, name)
            if value is not None and not (_is_number(value, whole=True) and value > 0):
                raise ConfigError(f"{name}: got {value!r}, must be a whole number > 0 or None")
        retention = self.retention_seconds
        if retention is not None and not (_is_number(retention) and retention > 0):
            raise ConfigError(
                f"retention_seconds: got {retention!r}, must be a finite number of seconds > 0 "
                "or None"
            )
        if not (_is_number(self.replay_window_seconds) and self.replay_window_seconds >= 0):
            raise ConfigError(
                f"replay_window_seconds: got {self.replay_window_seconds!r}, must be a finite "
                "number of seconds >= 0"
            )
        if not (_is_number(self.dedup_window_seconds) and self.dedup_window_seconds >= 0):
            raise ConfigError(
                f"dedup_window_seconds: got {self.dedup_window_seconds!r}, must be a finite "
                "number of seconds >= 0"
            )

    @classmethod
    def from_marker(cls, data: bytes) -> TopicSettings:
        """Settings from a marker; markers of pawn-queue 0.1.x (no settings) give the defaults,
        claims "message" (as a marker of 0.2.0 that does not say)."""
        settings = _read_marker(data)[1]
        if settings is None:
            logger.warning("topic marker has unreadable settings; using defaults")
            return cls(claims=_UNSAID_CLAIMS)
        return settings


def _is_number(value: object, *, whole: bool = False) -> bool:
    """A finite int or float (a bool is neither); with ``whole``, one with no fraction."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if whole:
        return isinstance(value, int) or value.is_integer()
    return math.isfinite(value)


def _read_marker(data: bytes) -> tuple[str | None, TopicSettings | None]:
    """The creation time and the settings a marker holds; None for what is unreadable.
    A marker without settings (pawn-queue 0.1.x) holds the defaults."""
    try:
        body = codec.loads(data)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(body, dict):
        return None, None
    created_at = body.get("created_at")
    created = created_at if isinstance(created_at, str) else None
    try:
        raw = body.get("settings") or {}
        known = {k: v for k, v in raw.items() if k in TopicSettings.__dataclass_fields__}
        known.setdefault("claims", _UNSAID_CLAIMS)
        return created, TopicSettings(**known)
    except (TypeError, AttributeError, ConfigError):
        return created, None


class Topics:
    """Create, find, update, list, purge and delete topics. Caches markers for a short time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cache: dict[str, tuple[float, TopicSettings]] = {}
        self.on_delete: list[Callable[[str], None]] = []
        """Called with the name of each topic (or queue) this instance deletes, once its
        marker is gone: what caches what the topic held forgets it."""

    async def create(self, name: str, given: Mapping[str, Any]) -> TopicSettings:
        """Create the topic with the defaults and the ``given`` settings; return the stored
        settings. If it exists, only the given settings are compared with the stored ones:
        any difference raises TopicSettingsConflictError and nothing is written. ``name``
        may be a subscription's queue (:mod:`pawn_queue.subscriptions` creates those)."""
        layout.validate_queue(name)
        settings = replace(TopicSettings(), **given)  # invalid settings fail before any I/O
        key = layout.topic_marker_key(name)
        for _ in range(_MARKER_ATTEMPTS):
            # Read first: a store without conditional writes takes a create-only write over
            # an existing marker as an overwrite, which would reset the settings not given.
            try:
                current = await self._store.get(key)
            except NotFound:
                try:
                    await self._store.put(key, _marker(name, None, settings), "create")
                    logger.info("topic created topic=%s", name)
                    return self._remember(name, settings)
                except AlreadyExists:
                    continue  # created meanwhile: compare with it
            created_at, stored = _read_marker(current.data)
            if created_at is None or stored is None:
                # An unreadable marker is repaired (if-match: one repair wins). Its messages
                # may be read by older consumers: claims stays "message" unless given.
                repaired = replace(TopicSettings(claims=_UNSAID_CLAIMS), **given)
                body = _marker(name, created_at, repaired)
                try:
                    await self._store.put(key, body, IfMatch(current.meta.etag))
                except PreconditionFailed:
                    continue
                logger.warning("topic marker was unreadable; rewritten topic=%s", name)
                return self._remember(name, repaired)
            differences = {
                setting: (getattr(stored, setting), getattr(settings, setting))
                for setting in given
                if getattr(stored, setting) != getattr(settings, setting)
            }
            if differences:
                raise TopicSettingsConflictError(name, differences)
            return self._remember(name, stored)
        raise StoreError(f"the marker of topic {name!r} kept changing while it was created")

    async def update(self, name: str, given: Mapping[str, Any]) -> TopicSettings:
        """Change the ``given`` settings of an existing topic (None clears a limit), keep the
        others; return the new settings. An if-match write: a concurrent change is read
        again and the update applied on top of it."""
        layout.validate_queue(name)
        replace(TopicSettings(), **given)  # invalid settings fail before any I/O
        key = layout.topic_marker_key(name)
        for _ in range(_MARKER_ATTEMPTS):
            try:
                current = await self._store.get(key)
            except NotFound:
                self._cache.pop(name, None)
                raise not_found(name) from None
            created_at, stored = _read_marker(current.data)
            settings = replace(stored or TopicSettings(claims=_UNSAID_CLAIMS), **given)
            if settings == stored and created_at is not None:
                return self._remember(name, settings)
            body = _marker(name, created_at, settings)
            try:
                await self._store.put(key, body, IfMatch(current.meta.etag))
            except PreconditionFailed:
                continue  # changed (or deleted) meanwhile: read it again
            logger.info("topic settings updated topic=%s settings=%s", name, sorted(given))
            return self._remember(name, settings)
        raise StoreError(f"the marker of topic {name!r} kept changing while it was updated")

    def _remember(self, name: str, settings: TopicSettings) -> TopicSettings:
        self._cache[name] = (time.monotonic() + _CACHE_SECONDS, settings)
        return settings

    async def settings(self, name: str, *, fresh: bool = False) -> TopicSettings:
        """The topic's settings (``fresh``: read now, not from the cache); raise
        TopicNotFoundError if it does not exist."""
        layout.validate_queue(name)  # first: a name may not even be hashable
        cached = self._cache.get(name)
        if cached and cached[0] > time.monotonic() and not fresh:
            return cached[1]
        try:
            marker = await self._store.get(layout.topic_marker_key(name))
        except NotFound:
            self._cache.pop(name, None)
            raise not_found(name) from None
        return self._remember(name, TopicSettings.from_marker(marker.data))

    async def peek(self, name: str, limit: int, visibility_seconds: float) -> list[PeekedMessage]:
        """The topic's oldest messages (at most ``limit``, from its oldest ``limit`` objects),
        each with its state, read without claiming them. A lease written within
        ``visibility_seconds`` makes a message in flight. Costs one LIST of the leases, one of
        the messages and a GET per object returned; raises TopicNotFoundError."""
        await self.settings(name)
        if limit <= 0:
            return []
        now = now_utc()
        leases = await self._store.list(layout.leases_prefix(name))
        listing = await self._store.list(layout.messages_prefix(name), limit=limit)
        peeked: list[PeekedMessage] = []
        for listed in classify(name, listing, leases, now, visibility_seconds):
            try:
                data = (await self._store.get(listed.meta.key)).data
            except NotFound:
                continue  # acked meanwhile
            peeked += _peeked(name, listed, data)
            if len(peeked) >= limit:
                return peeked[:limit]
        return peeked

    async def list(self) -> list[str]:
        """All topics, sorted. Costs two requests per top-level name in the bucket."""
        topics: list[str] = []
        cursor: str | None = None
        while True:
            first = await self._store.list("", start_after=cursor, limit=1)
            if not first:
                return topics
            segment = layout.topic_of(first[0].key)
            cursor = layout.after_subtree(segment)
            if segment.startswith(layout.RESERVED_PREFIXES) or "/" not in first[0].key:
                continue
            try:
                await self._store.head(layout.topic_marker_key(segment))
            except NotFound:
                continue
            topics.append(segment)

    async def purge(self, name: str) -> int:
        """Delete every object under the topic's ``messages/`` (pending, in flight, delayed)
        and the leases of those messages (a run's included); return how many objects under
        ``messages/`` were deleted. Group leases stay: later messages of the group share
        them, so their holders release them (or they expire) as usual."""
        await self.settings(name, fresh=True)
        prefix = layout.messages_prefix(name)
        deleted = 0
        cursor: str | None = None
        # Paged from a cursor, so every object is listed once even while others publish.
        while page := await self._store.list(prefix, start_after=cursor, limit=layout.LIST_PAGE):
            keys = [m.key for m in page]
            await self._store.delete_many(keys)
            leases = {
                layout.lease_key(name, pending.lease_id())  # a run's once, for its second
                for key in keys
                if (pending := layout.parse_pending_key(key)) and pending.kind != "group"
            }
            if leases:
                await self._store.delete_many(sorted(leases))
            deleted += len(keys)
            cursor = keys[-1]
        logger.info("topic purged topic=%s objects=%d", name, deleted)
        return deleted

    async def delete(self, name: str) -> int:
        """Delete the topic (or a subscription's queue) and everything in it; returns the
        number of objects deleted."""
        layout.validate_queue(name)
        marker = layout.topic_marker_key(name)
        try:
            await self._store.head(marker)
        except NotFound:
            raise not_found(name) from None
        # Marker first: publishers stop seeing the topic before its messages go.
        await self._store.delete(marker)
        self._cache.pop(name, None)
        for forget in self.on_delete:
            forget(name)
        deleted = 1
        prefix = layout.topic_prefix(name)
        while page := await self._store.list(prefix, limit=layout.LIST_PAGE):
            await self._store.delete_many([m.key for m in page])
            deleted += len(page)
        logger.info("topic deleted topic=%s objects=%d", name, deleted)
        return deleted


def not_found(queue: str) -> TopicNotFoundError:
    """The error for a missing topic, or a missing subscription when ``queue`` is one's."""
    topic, subscription = layout.split_queue(queue)
    if subscription is None:
        return TopicNotFoundError(f"topic {topic!r} does not exist")
    return SubscriptionNotFoundError(
        f"subscription {subscription!r} of topic {topic!r} does not exist"
    )


def _marker(name: str, created_at: str | None, settings: TopicSettings) -> bytes:
    created = created_at or now_utc().isoformat()
    return encode_json({"topic": name, "created_at": created, "settings": asdict(settings)})


MessageState = Literal["pending", "in_flight", "delayed"]


@dataclass(frozen=True, slots=True)
class Listed:
    """A message object of a listing, and its state at the time of :func:`classify`."""

    meta: ObjectMeta
    pending: layout.PendingKey
    due: datetime  # the time in its key (due time if delayed), else when it was written
    state: MessageState


def classify(
    name: str,
    messages: Iterable[ObjectMeta],
    leases: Iterable[ObjectMeta],
    now: datetime,
    visibility_seconds: float,
) -> Iterator[Listed]:
    """The message objects of a listing of topic ``name``'s messages (in key order, from
    its start), each with its state: delayed while not due, in flight while a lease among
    ``leases`` written within ``visibility_seconds`` covers it, else pending. A group's lease
    covers only the group's oldest message: the rest of the group is pending behind it.
    Keys that are not messages are left out."""
    fresh_after = now - timedelta(seconds=visibility_seconds)
    leased = {m.key for m in leases if m.last_modified > fresh_after}
    groups_seen: set[str] = set()
    for meta in messages:
        pending = layout.parse_pending_key(meta.key)
        if pending is None:
            continue
        due = layout.due_from_key(meta.key) or meta.last_modified
        head = pending.kind != "group" or pending.shared_id not in groups_seen
        groups_seen.add(pending.shared_id)
        state: MessageState
        if due > now:
            state = "delayed"
        elif head and layout.lease_key(name, pending.lease_id()) in leased:
            state = "in_flight"
        else:
            state = "pending"
        yield Listed(meta, pending, due, state)


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A message as :meth:`PawnQueue.peek` shows it: read, not claimed (nothing to ack)."""

    id: str
    topic: str
    state: MessageState  # "pending", "in_flight" or "delayed"
    key: str  # its object (a batch object holds several messages)
    due: datetime  # when it became (or becomes) due; for a key without a time, its write time
    producer_id: str
    created_at: str
    attributes: dict[str, str]
    payload: Any
    group: str | None = None
    error: str | None = None  # why the object is not a valid message (its fields are empty)
    priority: int = 0  # 0 (the default, the lowest) to 9: publish(..., priority=)


def _peeked(name: str, listed: Listed, data: bytes) -> list[PeekedMessage]:
    """The messages of one listed object; one with ``error`` set if it is not readable."""
    key, state, due = listed.meta.key, listed.state, listed.due
    try:
        if listed.pending.kind == "batch":
            envelopes = decode_batch(data)
        else:
            envelopes = [Envelope.decode(data)]
    except CorruptObject as exc:
        object_id = listed.pending.object_id
        return [PeekedMessage(object_id, name, state, key, due, "", "", {}, None, error=str(exc))]
    return [
        PeekedMessage(
            id=e.id,
            topic=e.topic,
            state=state,
            key=key,
            due=due,
            producer_id=e.producer_id,
            created_at=e.created_at,
            attributes=e.attributes,
            payload=e.payload,
            group=e.group,
            priority=e.priority,
        )
        for e in envelopes
    ]


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
    counts = dict.fromkeys(("pending", "in_flight", "delayed"), 0)
    oldest: datetime | None = None
    for listed in classify(name, messages, leases, now, visibility_seconds):
        counts[listed.state] += 1
        if listed.state == "pending":
            oldest = listed.due if oldest is None else min(oldest, listed.due)
    age = (now - oldest).total_seconds() if oldest is not None else None
    return TopicStats(counts["pending"], counts["in_flight"], counts["delayed"], len(dead), age)
