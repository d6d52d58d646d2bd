"""Producer: publishes messages to topics."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import reprlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import dedup, layout
from pawn_queue._protocol.envelope import (
    Envelope,
    check_attributes,
    encode_batch,
    priority_argument,
)
from pawn_queue._protocol.group_commit import Copy, GroupCommit
from pawn_queue._protocol.landing import publish_failed, write_message, write_new
from pawn_queue._protocol.registry import RegistryEntry
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.subscriptions import Destination
from pawn_queue._protocol.topics import TopicSettings
from pawn_queue.exceptions import (
    ArgumentError,
    QueueFullError,
    StoreError,
)
from pawn_queue.observe import Publication

logger = logging.getLogger(__name__)

_ROOM_CHECK_SECONDS = 1.0


class Producer:
    """Publishes messages. Obtain one with ``PawnQueue.register_producer()``."""

    def __init__(self, entry: RegistryEntry, runtime: Runtime) -> None:
        self._entry = entry
        self._runtime = runtime
        self._signals = runtime.signals
        self._room: dict[str, tuple[float, int]] = {}  # topic -> (checked at, pending count)
        self._runs = layout.RunNumbers()
        self._store = runtime.store
        self._topics = runtime.topics
        self._subscriptions = runtime.subscriptions
        self._clock = runtime.clock
        self._observers = runtime.observers
        config = runtime.config.producer
        self._group_commit = GroupCommit(runtime, config) if config.group_commit else None
        self._batch_bytes = config.max_batch_bytes

    @property
    def id(self) -> str:
        """Stable UUIDv4 assigned at registration."""
        return self._entry.entity_id

    @property
    def name(self) -> str:
        return self._entry.name

    def __repr__(self) -> str:
        return f"Producer(name={self.name!r}, id={self.id!r})"

    async def publish(
        self,
        topic: str,
        payload: Any,
        *,
        delay: float | None = None,
        attributes: Mapping[str, str] | None = None,
        group: str | None = None,
        dedup_id: str | None = None,
        wait_for_room: float = 30.0,
        expires_in: float | None = None,
        priority: int = 0,
    ) -> str:
        """Publish ``payload`` (any JSON value, or ``bytes``) to ``topic``; return its id.

        Returns only after the store acknowledged the write: a returned id is durable.
        Large payloads (100 MiB and more) are encoded once: expect about two payload-sized
        buffers while publishing and while receiving.

        - ``delay`` (seconds, any length) keeps the message invisible until then; waiting
          costs no requests, since its key sorts by the time it becomes due.
        - ``group``: messages of one group are delivered in order, one at a time; groups
          are processed in parallel.
        - ``dedup_id``: a repeat within the topic's ``dedup_window_seconds`` returns the
          first message's id and writes nothing (across producers too).
        - On a topic with ``max_pending``, waits up to ``wait_for_room`` seconds for room,
          then raises QueueFullError.
        - ``expires_in`` (seconds > 0): never delivered after that; a consumer that meets it
          later removes it, or dead-letters it (reason ``expired``) on a topic whose
          ``retention_action`` is ``"dead_letter"``. A ``delay`` as long is refused.
        - ``priority``: 0 (the default, the lowest) to 9 (the highest). Consumers take the
          ready messages of a higher priority first, FIFO within a priority; at no cost in
          requests (the key sorts by priority, then time). In a ``group``, the group's order
          wins. docs/concepts/priorities.md says what "first" guarantees.

        Raises TopicNotFoundError for an unknown topic, PayloadError for a payload that
        cannot be encoded and ArgumentError for a bad option (all before anything is
        written), PublishError if the write fails.
        """
        check_timing(delay, expires_in)
        priority = priority_argument(priority)
        seconds_argument("wait_for_room", wait_for_room, zero=True)
        settings = await self._topics.settings(topic)
        if group is not None and (not isinstance(group, str) or not group):
            raise ArgumentError(f"group: got {group!r}, must be a non-empty string")
        if dedup_id is not None and (not isinstance(dedup_id, str) or not dedup_id):
            raise ArgumentError(f"dedup_id: got {dedup_id!r}, must be a non-empty string")
        checked = check_attributes(attributes)

        async def write(attributes: dict[str, str]) -> list[str]:
            return [
                await self._publish(
                    topic,
                    settings,
                    payload,
                    delay,
                    attributes,
                    group,
                    dedup_id,
                    wait_for_room,
                    expires_in,
                    priority,
                )
            ]

        [message_id] = await self._observed(topic, checked, 1, write)
        return message_id

    async def _observed(
        self,
        topic: str,
        attributes: dict[str, str],
        count: int,
        write: Callable[[dict[str, str]], Awaitable[list[str]]],
    ) -> list[str]:
        """``write(attributes)``, told to the observers before and after (with none: only
        the write)."""
        if not self._observers:
            return await write(attributes)
        publication = Publication(topic, attributes, count)
        self._observers.before_publish(publication)
        try:
            ids = await write(publication.attributes)
        except BaseException as exc:
            self._observers.publish_failed(publication, exc)
            raise
        publication.message_ids.extend(ids)
        self._observers.published(publication)
        return ids

    async def _publish(
        self,
        topic: str,
        settings: TopicSettings,
        payload: Any,
        delay: float | None,
        attributes: dict[str, str],
        group: str | None,
        dedup_id: str | None,
        wait_for_room: float,
        expires_in: float | None,
        priority: int,
    ) -> str:
        now = self._clock()
        envelope = Envelope(
            id=str(uuid.uuid4()),
            topic=topic,
            producer_id=self.id,
            created_at=now.isoformat(),
            payload=payload,
            attributes=attributes,
            group=group,
            expires_at=_expires_at(now, expires_in),
            priority=priority,
        )
        # A payload that cannot be encoded fails here, before anything is written.
        body = envelope.encode()
        due = _due(now, delay)
        delayed = due > now  # never delivered before it is due, whatever the skew margin
        if group is None:
            run = None
            if settings.claims == "second":
                run = self._runs.next(topic, due, now, delayed=delayed, priority=priority)
            key = layout.message_key(
                topic, envelope.id, due, delayed=delayed, priority=priority, run=run
            )
        else:
            key = layout.group_message_key(topic, envelope.id, due, group, delayed=delayed)
        routes = await self._routes(topic, settings, attributes)
        queues = [route.queue for route in routes]
        if settings.max_pending and topic in queues:
            await self._wait_for_room(topic, settings.max_pending, wait_for_room)
        if dedup_id is not None:
            marker = dedup.Marker(dedup_id, envelope.id, key, now.isoformat())
            return await self._publish_once(
                envelope, body, marker, settings.dedup_window_seconds, queues
            )
        if (
            self._group_commit is not None
            and group is None
            and not delayed
            and not isinstance(payload, bytes)  # batch objects hold JSON payloads only
            and len(body) <= self._batch_bytes
        ):
            copies = [Copy(layout.in_queue(key, r.queue), r.linger_seconds) for r in routes]
            await self._group_commit.publish(envelope, body, copies)
        else:
            await self._write_copies(envelope, key, body, queues)
        return envelope.id

    async def _routes(
        self, topic: str, settings: TopicSettings, attributes: Mapping[str, str]
    ) -> list[Destination]:
        """Where a message to ``topic`` goes (:meth:`Subscriptions.routes
        <pawn_queue.subscriptions.Subscriptions.routes>`): the queues whose filter its
        ``attributes`` match (maybe none: then it is written nowhere, as in every fan-out
        system)."""
        try:
            routes = await self._subscriptions.routes(topic, settings)
        except StoreError as exc:
            raise publish_failed(topic, exc) from exc
        if settings.replay_window_seconds:
            self._runtime.retained_sweeper.published(topic, settings.replay_window_seconds)
        return [route for route in routes if route.filter.matches(attributes)]

    async def _write_copies(
        self, envelope: Envelope, key: str, body: bytes, queues: list[str]
    ) -> None:
        """Write the message at ``key`` into each of ``queues``, concurrently."""
        runtime = self._runtime
        await _each(write_message(runtime, envelope, layout.in_queue(key, q), body) for q in queues)

    async def _publish_once(
        self,
        envelope: Envelope,
        body: bytes,
        proposal: dedup.Marker,
        window: float,
        queues: list[str],
    ) -> str:
        """Publish unless the marker's dedup id was published within ``window`` seconds."""
        marker_key = layout.dedup_key(envelope.topic, proposal.dedup_id)
        try:
            decision = await dedup.decide(self._store, marker_key, proposal, window)
            marker = decision.marker
            if not decision.write:
                logger.debug(
                    "duplicate dedup_id topic=%s message=%s", envelope.topic, marker.message_id
                )
                return marker.message_id
            if marker.message_id != envelope.id:  # an earlier attempt's id: encode it anew
                envelope = replace(envelope, id=marker.message_id)
                body = envelope.encode()
            await self._write_copies(envelope, marker.message_key, body, queues)
            await dedup.mark_written(self._store, marker_key, decision)
        except StoreError as exc:
            raise publish_failed(envelope.topic, exc) from exc
        finally:
            self._runtime.dedup_sweeper.published(envelope.topic, window)
        return envelope.id

    async def _wait_for_room(self, topic: str, max_pending: int, within: float) -> None:
        """Block while the topic holds ``max_pending`` objects (checked at most once a second:
        a LIST per 1,000 pending objects), at most ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            checked, count = self._room.get(topic, (-_ROOM_CHECK_SECONDS, 0))
            if time.monotonic() - checked >= _ROOM_CHECK_SECONDS:
                metas = await self._store.list(layout.messages_prefix(topic), limit=max_pending)
                checked, count = time.monotonic(), len(metas)
            if count < max_pending:
                self._room[topic] = (checked, count + 1)
                return
            self._room[topic] = (checked, count)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QueueFullError(
                    f"topic {topic!r} holds {count} pending messages (max_pending "
                    f"{max_pending}) and had no room within {within:g}s"
                )
            await asyncio.sleep(min(_ROOM_CHECK_SECONDS, remaining))

    async def publish_batch(
        self,
        topic: str,
        payloads: Iterable[Any],
        *,
        attributes: Mapping[str, str] | None = None,
        expires_in: float | None = None,
        priority: int = 0,
    ) -> list[str]:
        """Publish many messages in one batch object (one write); return their ids in order.

        Consumers claim the object with one lease and settle its messages one by one. The
        object is deleted once all of them are acked or dead-lettered. ``expires_in`` and
        ``priority`` as in :meth:`publish`, for each message (one object: one priority).
        Same errors as :meth:`publish`; nothing is written if any payload cannot be encoded.
        """
        payloads = payloads_argument(payloads)
        check_timing(None, expires_in)
        priority = priority_argument(priority)
        settings = await self._topics.settings(topic)
        checked = check_attributes(attributes)
        if not payloads:
            return []
        return await self._observed(
            topic,
            checked,
            len(payloads),
            lambda attributes: self._publish_batch(
                topic, settings, payloads, attributes, expires_in, priority
            ),
        )

    async def _publish_batch(
        self,
        topic: str,
        settings: TopicSettings,
        payloads: list[Any],
        checked: dict[str, str],
        expires_in: float | None,
        priority: int,
    ) -> list[str]:
        now = self._clock()
        created_at = now.isoformat()
        expires_at = _expires_at(now, expires_in)
        batch_id, *ids = _uuid4s(1 + len(payloads))
        members = [
            Envelope(
                message_id,
                topic,
                self.id,
                created_at,
                payload,
                checked,
                expires_at=expires_at,
                priority=priority,
            )
            for message_id, payload in zip(ids, payloads, strict=True)
        ]
        body = encode_batch(batch_id, members)
        key = layout.message_key(topic, batch_id, now, batch=True, priority=priority)

        async def write(queue: str) -> None:
            written = layout.in_queue(key, queue)
            await write_new(self._runtime, written, body)
            self._signals.published(queue, written)

        try:
            await _each(write(r.queue) for r in await self._routes(topic, settings, checked))
        except StoreError as exc:
            raise publish_failed(topic, exc, "a batch ") from exc
        logger.debug("published batch=%s topic=%s messages=%d", batch_id, topic, len(members))
        return [m.id for m in members]


async def _each(calls: Iterable[Awaitable[object]]) -> None:
    """Run ``calls`` concurrently to their end; then raise the first error, if any (a write
    still in flight when its caller gives up would land unbeknown to it)."""
    pending = list(calls)
    if len(pending) == 1:
        await pending[0]
        return
    for outcome in await asyncio.gather(*pending, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


def _uuid4s(count: int) -> list[str]:
    """``count`` random UUIDv4 strings from one read of the OS's random source (what
    ``uuid.uuid4()`` reads once per id)."""
    raw = bytearray(os.urandom(16 * count))
    ids = []
    for i in range(0, 16 * count, 16):
        raw[i + 6] = raw[i + 6] & 0x0F | 0x40  # version 4
        raw[i + 8] = raw[i + 8] & 0x3F | 0x80  # RFC 4122 variant
        h = raw[i : i + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids


def payloads_argument(payloads: object) -> list[Any]:
    """``publish_batch``'s ``payloads`` as a list; ArgumentError for what is not a collection
    of payloads (a string or a mapping would be taken apart)."""
    if isinstance(payloads, str | bytes | bytearray | Mapping) or not isinstance(
        payloads, Iterable
    ):
        raise ArgumentError(
            f"payloads: got {reprlib.repr(payloads)}, must be a list (or iterable) of payloads"
        )
    return list(payloads)


def _check_delay(seconds: object) -> None:
    """Refuse a ``delay`` that is not None or a number of seconds >= 0."""
    if seconds is not None and (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds < math.inf
    ):
        raise _delay_error(seconds)


def check_timing(delay: object, expires_in: object) -> None:
    """Refuse a publish's ``delay`` and ``expires_in`` as :meth:`Producer.publish` does (for
    callers that must refuse them before they write anything)."""
    _check_delay(delay)
    _check_expiry(expires_in, delay)


def _check_expiry(expires_in: object, delay: object) -> None:
    """Refuse an ``expires_in`` that is not None or seconds > 0, or not past ``delay``."""
    if expires_in is None:
        return
    seconds = seconds_argument("expires_in", expires_in)
    if isinstance(delay, int | float) and delay >= seconds:
        raise ArgumentError(
            f"delay: got {delay!r}, must be shorter than expires_in ({expires_in!r}): the "
            "message would expire before it is due"
        )


def _expires_at(now: datetime, seconds: float | None) -> str | None:
    """A message's deadline, ISO 8601 UTC (``expires_in`` checked)."""
    return None if seconds is None else (now + timedelta(seconds=seconds)).isoformat()


def _due(now: datetime, seconds: float | None) -> datetime:
    """When a message published ``now`` with ``delay=seconds`` (checked) becomes visible."""
    if seconds is None:
        return now
    try:
        return now + timedelta(seconds=seconds)
    except OverflowError:
        raise _delay_error(seconds) from None


def _delay_error(seconds: object) -> ArgumentError:
    return ArgumentError(f"delay: got {seconds!r}, must be a number of seconds >= 0 (< 9999 years)")
