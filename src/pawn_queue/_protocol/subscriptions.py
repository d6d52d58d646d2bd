"""Subscriptions: each receives every message published to its topic after it was created.

A subscription is a queue of its own under its topic (``{topic}/subscriptions/{name}/``:
its marker, messages, leases and dead letters, exactly as a topic's), so everything a topic
does per message a subscription does on its own. Producers copy each message into every
subscription whose filter it matches: they learn the subscriptions from the topic's index
object ``{topic}/.subscriptions``, which they read again at most every
:data:`INDEX_CACHE_SECONDS`. A topic without subscriptions is a plain work queue, as in
pawn-queue 0.1. docs/protocol.md, "Subscriptions": the objects, the requests and the rules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import encode_json, now_utc
from pawn_queue._protocol.filters import EVERYTHING, Filter, parse_filter
from pawn_queue._protocol.topics import Topics, TopicSettings, not_found
from pawn_queue.exceptions import (
    AlreadyExists,
    ArgumentError,
    NotFound,
    PreconditionFailed,
    StoreError,
    SubscriptionConflictError,
    SubscriptionNotFoundError,
    TopicSettingsConflictError,
)
from pawn_queue.store.base import IfMatch, PutMode, Store

logger = logging.getLogger(__name__)

INDEX_CACHE_SECONDS = 2.0
"""How long a producer trusts the index it read. Creating, changing or deleting a
subscription waits this long (and a little more) before it returns, so that every publish
that starts afterwards sees the change (docs/protocol.md, rule 15)."""
_CHANGE_MARGIN_SECONDS = 0.1  # a timer firing early, on top of the producers' cache time
_RECENT_SECONDS = 60.0  # created longer ago than this (by its creator's clock): known to all
MAX_LINGER_SECONDS = 1.0
"""The longest a subscription's copies may wait to be written together (a publish waits as
long for its copy)."""
_INDEX_ATTEMPTS = 20  # concurrent changes to one topic's index, each retried on a 412


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription of a topic: its filter, its settings (those of a topic), and how long
    producers hold its copies back to write more together (``linger_seconds``)."""

    topic: str
    name: str
    filter: dict[str, Any] | None
    created_at: str
    settings: TopicSettings
    linger_seconds: float = 0.0

    @property
    def queue(self) -> str:
        """Where its messages wait: ``{topic}/subscriptions/{name}``."""
        return layout.subscription_queue(self.topic, self.name)


@dataclass(frozen=True, slots=True)
class Destination:
    """A subscription as a producer sees it: where to copy, and which messages."""

    queue: str
    filter: Filter
    linger_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class _Entry:
    filter: Filter
    created_at: str
    linger_seconds: float = 0.0

    def subscription(self, topic: str, name: str, settings: TopicSettings) -> Subscription:
        return Subscription(
            topic, name, self.filter.to_json(), self.created_at, settings, self.linger_seconds
        )


def _decode_index(data: bytes, topic: str) -> dict[str, _Entry]:
    """The subscriptions an index holds. An unreadable index is an error, never "none":
    publishing as if there were no subscriptions would lose their messages."""
    try:
        body = codec.loads(data)
        entries = body["subscriptions"]
        return {
            layout.validate_name(name, "subscription name"): _Entry(
                parse_filter(entry.get("filter")),
                str(entry["created_at"]),
                linger_seconds(entry.get("linger_seconds", 0.0)),
            )
            for name, entry in entries.items()
        }
    except Exception as exc:  # any shape: the error says where
        raise StoreError(f"the subscription index of topic {topic!r} is unreadable: {exc}") from exc


def _encode_index(entries: Mapping[str, _Entry]) -> bytes:
    return encode_json(
        {
            "subscriptions": {
                name: {"filter": entry.filter.to_json(), "created_at": entry.created_at}
                | ({"linger_seconds": entry.linger_seconds} if entry.linger_seconds else {})
                for name, entry in sorted(entries.items())
            }
        }
    )


class Subscriptions:
    """Create, list, change and delete subscriptions; tell producers where a topic's
    messages go (:meth:`destinations`, cached :data:`INDEX_CACHE_SECONDS`)."""

    def __init__(self, store: Store, topics: Topics) -> None:
        self._store = store
        self._topics = topics
        # topic -> (monotonic time the read started, its destinations)
        self._cache: dict[str, tuple[float, tuple[Destination, ...]]] = {}
        # topic -> (monotonic time it started, the calls waiting for the read in flight)
        self._reading: dict[str, tuple[float, list[asyncio.Future[tuple[Destination, ...]]]]] = {}
        # A topic deleted here and created again has no subscriptions: not those cached.
        topics.on_delete.append(self.forget)

    def forget(self, topic: str) -> None:
        """Drop what is cached of ``topic``'s index: the next publish reads it again."""
        self._cache.pop(topic, None)
        self._reading.pop(topic, None)  # a read in flight may predate the change

    async def destinations(self, topic: str) -> tuple[Destination, ...]:
        """The subscriptions a message published to ``topic`` now is copied to; empty when
        the topic has none (its messages stay in the topic's own queue)."""
        while True:
            started = time.monotonic()
            cached = self._cache.get(topic)
            if cached is not None and started - cached[0] < INDEX_CACHE_SECONDS:
                return cached[1]
            # Publishes that start while a read is in flight share it (one GET per refresh,
            # not one each), on the cache's terms: what it returns is as recent as a copy
            # read when it started. Each waits on a future of its own, set as the read
            # returns: they go on in the same turn of the loop as the reader (group commit
            # gathers them), and one that is cancelled leaves the others waiting. Not the
            # first read of a topic: those calls go on as their own reads return, the first
            # one's write alone (group commit).
            reading = self._reading.get(topic)
            if cached is None or reading is None or started - reading[0] >= INDEX_CACHE_SECONDS:
                break
            waiter: asyncio.Future[tuple[Destination, ...]]
            waiter = asyncio.get_running_loop().create_future()
            reading[1].append(waiter)
            try:
                return await waiter
            except _Abandoned:
                continue  # its reader was cancelled: look again
        waiters: list[asyncio.Future[tuple[Destination, ...]]] = []
        self._reading[topic] = (started, waiters)
        try:
            entries = (await self._read(topic))[0]
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else _Abandoned()
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(failure)
            raise
        finally:
            current = self._reading.get(topic, (0.0, None))[1] is waiters
            if current:
                del self._reading[topic]
        found = tuple(
            Destination(layout.subscription_queue(topic, name), entry.filter, entry.linger_seconds)
            for name, entry in sorted(entries.items())
        )
        if current:  # not forgotten meanwhile
            # Counted from before the read: what it returns was current at some time after.
            self._cache[topic] = (started, found)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(found)
        return found

    async def routes(self, topic: str, settings: TopicSettings) -> tuple[Destination, ...]:
        """Where a message published to ``topic`` now is written, each queue with the filter
        deciding whether it takes the message: each subscription, or the topic's own queue
        while it has none; and the topic's replay log while ``settings`` keep one
        (``replay_window_seconds``), which takes everything."""
        found = await self.destinations(topic) or (Destination(topic, EVERYTHING),)
        if settings.replay_window_seconds:
            found = (*found, Destination(layout.retained_log(topic), EVERYTHING))
        return found

    async def create(
        self,
        topic: str,
        name: str,
        given_filter: object,
        given: dict[str, Any],
        linger: object = None,
    ) -> tuple[Subscription, bool]:
        """Create the subscription, or make sure it exists with this filter and the given
        settings and ``linger`` (None: not given; SubscriptionConflictError, nothing
        written, if not); return it, and True if this call created it. Returns once every
        publish that starts afterwards copies to it."""
        layout.validate_name(topic, "topic name")
        layout.validate_name(name, "subscription name")
        wanted = parse_filter(given_filter)
        wanted_linger = None if linger is None else linger_seconds(linger)
        replace(TopicSettings(), **given)  # invalid settings fail before any I/O
        await self._topics.settings(topic, fresh=True)  # TopicNotFoundError
        # The queue first: a producer that sees the index entry writes into a queue that
        # exists, and a consumer that finds the marker finds it in the index too.
        settings = await self._queue_settings(topic, name, given)
        created_at = now_utc().isoformat()

        def add(entries: dict[str, _Entry]) -> bool:
            current = entries.get(name)
            if current is None:
                entries[name] = _Entry(wanted, created_at, wanted_linger or 0.0)
                return True
            differences: dict[str, tuple[Any, Any]] = {}
            if current.filter != wanted:
                differences["filter"] = (current.filter.to_json(), wanted.to_json())
            if wanted_linger is not None and current.linger_seconds != wanted_linger:
                differences["linger_seconds"] = (current.linger_seconds, wanted_linger)
            if differences:
                raise SubscriptionConflictError(topic, name, differences)
            return False

        entries, changed = await self._change(topic, add)
        entry = entries[name]
        if changed or _recent(entry.created_at):
            # Maybe created by another call just now, whose wait is not over either.
            await _wait_for_producers()
        logger.info("subscription ready topic=%s subscription=%s", topic, name)
        return entry.subscription(topic, name, settings), changed

    async def _queue_settings(self, topic: str, name: str, given: dict[str, Any]) -> TopicSettings:
        """Create the subscription's queue with the ``given`` settings, or compare them with
        those of the queue that exists (SubscriptionConflictError, nothing written). Read
        first: a store without conditional writes takes a create-only write of an existing
        marker as an overwrite, which would reset the settings not given."""
        queue = layout.subscription_queue(topic, name)
        asked = replace(TopicSettings(), **given)  # invalid settings fail before any I/O
        try:
            stored = await self._topics.settings(queue, fresh=True)
        except SubscriptionNotFoundError:
            try:
                return await self._topics.create(queue, given)
            except TopicSettingsConflictError as exc:  # created meanwhile
                raise SubscriptionConflictError(topic, name, exc.differences) from None
        differences = {
            setting: (getattr(stored, setting), getattr(asked, setting))
            for setting in given
            if getattr(stored, setting) != getattr(asked, setting)
        }
        if differences:
            raise SubscriptionConflictError(topic, name, differences)
        return stored

    async def get(self, topic: str, name: str) -> Subscription:
        """The subscription (read now); SubscriptionNotFoundError if there is none."""
        layout.validate_name(topic, "topic name")
        layout.validate_name(name, "subscription name")
        entry = (await self._read(topic))[0].get(name)
        if entry is None:
            raise not_found(layout.subscription_queue(topic, name))
        settings = await self._topics.settings(layout.subscription_queue(topic, name), fresh=True)
        return entry.subscription(topic, name, settings)

    async def list(self, topic: str) -> list[Subscription]:
        """The topic's subscriptions, by name. One GET for the index, one per subscription."""
        await self._topics.settings(topic, fresh=True)
        entries = (await self._read(topic))[0]

        async def one(name: str, entry: _Entry) -> Subscription | None:
            queue = layout.subscription_queue(topic, name)
            try:
                settings = await self._topics.settings(queue, fresh=True)
            except SubscriptionNotFoundError:
                return None  # being deleted
            return entry.subscription(topic, name, settings)

        found = await asyncio.gather(*(one(n, e) for n, e in sorted(entries.items())))
        return [s for s in found if s is not None]

    async def update(
        self,
        topic: str,
        name: str,
        given_filter: object,
        given: dict[str, Any],
        linger: object = None,
    ) -> Subscription:
        """Change the filter (unless ``given_filter`` is ``...``), ``linger`` (unless None)
        and the given settings."""
        layout.validate_name(topic, "topic name")
        layout.validate_name(name, "subscription name")
        wanted = None if given_filter is ... else parse_filter(given_filter)
        wanted_linger = None if linger is None else linger_seconds(linger)
        replace(TopicSettings(), **given)  # invalid settings fail before any I/O
        queue = layout.subscription_queue(topic, name)
        await self.get(topic, name)  # SubscriptionNotFoundError
        settings = await self._topics.update(queue, given) if given else None

        def change(entries: dict[str, _Entry]) -> bool:
            current = entries.get(name)
            if current is None:
                raise not_found(queue)
            new = replace(
                current,
                filter=current.filter if wanted is None else wanted,
                linger_seconds=current.linger_seconds if wanted_linger is None else wanted_linger,
            )
            entries[name] = new
            seen.append(current.filter)
            return new != current

        seen: list[Filter] = []  # the filter each attempt found (a retried write: ours)
        entries = (await self._change(topic, change))[0]
        if entries[name].filter != seen[0]:
            await _wait_for_producers()  # not for a linger: it takes effect as it comes
        if settings is None:
            settings = await self._topics.settings(queue, fresh=True)
        return entries[name].subscription(topic, name, settings)

    async def delete(self, topic: str, name: str) -> int:
        """Delete the subscription and every message waiting in it; return how many
        objects were deleted. Producers stop copying to it first."""
        layout.validate_name(topic, "topic name")
        layout.validate_name(name, "subscription name")
        queue = layout.subscription_queue(topic, name)

        def remove(entries: dict[str, _Entry]) -> bool:
            return entries.pop(name, None) is not None

        removed = (await self._change(topic, remove))[1]
        if not removed:
            await self._topics.settings(queue, fresh=True)  # SubscriptionNotFoundError
        # Also when another call removed it: no producer may still copy into the queue once
        # its objects are deleted (a delete that stopped half-way is finished here too).
        await _wait_for_producers()
        try:
            deleted = await self._topics.delete(queue)
        except SubscriptionNotFoundError:
            raise not_found(queue) from None
        logger.info(
            "subscription deleted topic=%s subscription=%s objects=%d", topic, name, deleted
        )
        return deleted

    async def _read(self, topic: str) -> tuple[dict[str, _Entry], str | None]:
        """The index and its ETag (None: there is no index)."""
        try:
            stored = await self._store.get(layout.subscription_index_key(topic))
        except NotFound:
            return {}, None
        return _decode_index(stored.data, topic), stored.meta.etag

    async def _change(
        self, topic: str, change: Callable[[dict[str, _Entry]], bool]
    ) -> tuple[dict[str, _Entry], bool]:
        """Apply ``change(entries) -> changed`` to the index with a conditional write (a
        concurrent change, or our own write retried, is read again and ``change`` applied
        on top of it); return the entries and whether this call wrote them."""
        key = layout.subscription_index_key(topic)
        for _ in range(_INDEX_ATTEMPTS):
            entries, etag = await self._read(topic)
            if not change(entries):
                return entries, False
            mode: PutMode = "create" if etag is None else IfMatch(etag)
            try:
                await self._store.put(key, _encode_index(entries), mode)
            except (AlreadyExists, PreconditionFailed):
                continue
            self.forget(topic)
            return entries, True
        raise StoreError(f"the subscription index of topic {topic!r} kept changing")


Start = datetime | Literal["earliest", "latest"]


def linger_seconds(value: object) -> float:
    """A subscription's ``linger_seconds``: a number of seconds from 0 to
    :data:`MAX_LINGER_SECONDS`; else ArgumentError."""
    seconds = seconds_argument("linger_seconds", value, zero=True)
    if seconds > MAX_LINGER_SECONDS:
        raise ArgumentError(
            f"linger_seconds: got {value!r}, must be at most {MAX_LINGER_SECONDS:g}"
        )
    return seconds


def parse_start(value: object, what: str) -> Start:
    """``"latest"``, ``"earliest"`` or a timezone-aware datetime, else ArgumentError."""
    if value in ("latest", "earliest"):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ArgumentError(f"{what}: {value!r} has no time zone; give an aware datetime")
        return value
    raise ArgumentError(
        f"{what}: got {value!r}, must be 'latest', 'earliest' or a timezone-aware datetime"
    )


class _Abandoned(Exception):
    """The publish reading the index was cancelled: those sharing its read read again."""


def _recent(created_at: str) -> bool:
    """Whether a subscription was created so lately that producers may not know it yet
    (with room for clocks that disagree)."""
    try:
        age = (now_utc() - datetime.fromisoformat(created_at)).total_seconds()
    except (ValueError, TypeError):
        return True
    return age < _RECENT_SECONDS


async def _wait_for_producers() -> None:
    """Wait until every producer's copy of the index is younger than the change."""
    await asyncio.sleep(INDEX_CACHE_SECONDS + _CHANGE_MARGIN_SECONDS)


__all__ = ["EVERYTHING", "Destination", "Subscription", "Subscriptions"]
