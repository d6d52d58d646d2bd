"""Group commit: concurrent ``publish()`` calls to one topic share objects.

A publish alone is written at once, as a one-message object: no added latency. Publishes to
the same topic that arrive while that write is in flight wait for it, then go out together
in the next write, as one batch object (at most ``producer.max_batch_messages`` messages and
``producer.max_batch_bytes`` of payload; more make several objects, one after the other).
Each call returns its id only once the object holding it is durable; if that write fails,
every call in it raises :class:`~pawn_queue.exceptions.PublishError`. ``linger_seconds``
(the producer's, or a subscription's for its queue) holds each write back that long first,
so that more calls join it, unless an object's worth already waits.

Only plain messages join: a publish with a delay, a group or a dedup id, or a ``bytes``
payload, is written alone as before (docs/protocol.md, "Publish": why). An object holds
messages of one priority (its key's band): a call of another priority starts the next one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import Envelope, encode_batch
from pawn_queue._protocol.landing import publish_failed, write_message, write_new
from pawn_queue._protocol.runtime import Runtime
from pawn_queue.config import ProducerConfig
from pawn_queue.exceptions import PublishError, StoreError

logger = logging.getLogger(__name__)

_RETURN_TURNS = 16  # turns of the loop a write waits at most for the callers it released
_QUIET_TURNS = 4  # ... and no more once this many passed without a call (a fan-out's caller
# comes back within a few: its copies' futures, the wait on them, then its next publish)


@dataclass(frozen=True, slots=True)
class Copy:
    """Where one copy of a publish goes: its key (in its queue), and the queue's linger (a
    subscription's ``linger_seconds``; the producer's own applies too)."""

    key: str
    linger: float = 0.0


@dataclass(slots=True)
class _Waiting:
    envelope: Envelope
    key: str  # its key written alone (a batch of one)
    body: bytes  # encoded, as it is written alone
    written: asyncio.Future[None] = field(default_factory=asyncio.Future)


class GroupCommit:
    """The writes of one producer: one writer per topic, and the calls waiting for it."""

    def __init__(self, runtime: Runtime, config: ProducerConfig) -> None:
        self._runtime = runtime
        self._config = config
        self._waiting: dict[str, list[_Waiting]] = {}
        # The topics with a write in flight: a task writing what waits, or None while a
        # lone call writes its own message.
        self._writers: dict[str, asyncio.Task[None] | None] = {}
        # topic -> the writes in flight into its queues (its own, its subscriptions', its
        # replay log), each a future done when its write is over.
        self._flights: dict[str, set[asyncio.Future[None]]] = {}

    async def publish(self, envelope: Envelope, body: bytes, copies: Sequence[Copy]) -> None:
        """Write ``envelope`` (encoded as ``body``) into each of ``copies``' queues (alone, or
        with others in a batch object); return once every copy is durable. Each copy's queue
        is its key's (a topic's own or a subscription's). If a write fails, the first error
        is raised once every copy's write is over. A fan-out's copies each wait in their
        queue's line, with no task per copy."""
        lingers = [max(c.linger, self._config.linger_seconds) for c in copies]
        if (
            len(copies) == 1
            and not lingers[0]
            and layout.queue_of(copies[0].key) not in self._writers
            and await self._write_alone(envelope, copies[0].key, body)
        ):
            return
        waiting = [
            self._enqueue(envelope, body, c.key, linger)
            for c, linger in zip(copies, lingers, strict=True)
        ]
        if not waiting:
            return
        try:
            await asyncio.wait([w.written for w in waiting])
        except asyncio.CancelledError:
            for each in waiting:
                self._abandon(each)
            raise
        errors = [w.written.exception() for w in waiting]
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error

    def _enqueue(self, envelope: Envelope, body: bytes, key: str, linger: float) -> _Waiting:
        """Put a copy in its queue's line; start that queue's writer if none runs."""
        queue = layout.queue_of(key)
        waiting = _Waiting(envelope, key, body)
        self._waiting.setdefault(queue, []).append(waiting)
        if queue not in self._writers:
            self._writers[queue] = asyncio.create_task(self._write_all(queue, linger))
        return waiting

    def _abandon(self, waiting: _Waiting) -> None:
        """Its caller was cancelled: not written if not taken yet; else nobody will read how
        its write ends."""
        line = self._waiting.get(layout.queue_of(waiting.key), [])
        if waiting in line:
            line.remove(waiting)
        else:
            waiting.written.add_done_callback(_retrieve)

    async def _write_alone(self, envelope: Envelope, key: str, body: bytes) -> bool:
        """With no write in flight for the topic, a call writes its own message at once: no
        task, no hand-over, so a lone publish costs what it costs without group commit.
        Unless other calls arrived in the same turn of the loop: then it writes nothing and
        returns False, to go out with them. Calls arriving while it writes wait for it."""
        topic = layout.queue_of(key)
        self._writers[topic] = None
        alone = False
        try:
            await asyncio.sleep(0)  # the calls made in this turn of the loop arrive
            alone = not self._waiting.get(topic)
            if alone:
                await write_message(self._runtime, envelope, key, body)
            return alone
        finally:
            del self._writers[topic]
            if self._waiting.get(topic):
                self._writers[topic] = asyncio.create_task(self._write_all(topic, 0.0))

    async def _write_all(self, topic: str, linger: float) -> None:
        """Write what waits for ``topic``, one object at a time, until nothing does; each
        write held back ``linger`` seconds first, unless a full object already waits."""
        try:
            first = True
            while self._waiting.get(topic):
                if not first:
                    await self._siblings_written(topic)
                    await _let_callers_return(self._waiting[topic])
                first = False
                if linger and not self._full(self._waiting[topic]):
                    await asyncio.sleep(linger)
                taken = self._take(self._waiting[topic])
                try:
                    await self._flying(topic, self._write(topic, taken))
                except BaseException as exc:
                    for waiting in taken:
                        if not waiting.written.done():
                            waiting.written.set_exception(_failure(topic, exc))
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for waiting in taken:
                        if not waiting.written.done():
                            waiting.written.set_result(None)
        finally:
            del self._writers[topic]
            if not self._waiting.get(topic):
                self._waiting.pop(topic, None)

    async def _siblings_written(self, queue: str) -> None:
        """Wait for the writes in flight into the other queues of ``queue``'s topic. A
        publish to a topic with subscriptions returns once each of its copies is written:
        its callers come back once the last of those writes is over, and the writers of
        the topic's queues then take them together (each writer on its own would take
        what arrived in its own time, and the callers would split into groups)."""
        flights = self._flights.get(layout.topic_of(queue))
        if flights:
            await asyncio.wait(list(flights))

    async def _flying(self, queue: str, write: Coroutine[Any, Any, None]) -> None:
        """Run ``write`` into ``queue``, known as in flight meanwhile."""
        topic = layout.topic_of(queue)
        flight: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flights.setdefault(topic, set()).add(flight)
        try:
            await write
        finally:
            flight.set_result(None)
            flights = self._flights[topic]
            flights.discard(flight)
            if not flights:
                del self._flights[topic]

    def _full(self, queue: list[_Waiting]) -> bool:
        """Whether ``queue`` holds an object's worth: waiting longer adds nothing to it."""
        taken = self._take(queue[:])
        return len(taken) < len(queue) or len(taken) >= self._config.max_batch_messages

    def _take(self, queue: list[_Waiting]) -> list[_Waiting]:
        """The calls the next object holds: the oldest, and those after it within bounds
        and of its priority (an object's key has one priority band)."""
        count, size = 0, 0
        for waiting in queue:
            if count and (
                count >= self._config.max_batch_messages
                or size + len(waiting.body) > self._config.max_batch_bytes
                or waiting.envelope.priority != queue[0].envelope.priority
            ):
                break
            count += 1
            size += len(waiting.body)
        taken = queue[:count]
        del queue[:count]
        return taken

    async def _write(self, topic: str, taken: list[_Waiting]) -> None:
        if len(taken) == 1:
            await write_message(self._runtime, taken[0].envelope, taken[0].key, taken[0].body)
            return
        batch_id = str(uuid.uuid4())
        members = [waiting.envelope for waiting in taken]
        clock = self._runtime.clock()
        key = layout.message_key(topic, batch_id, clock, batch=True, priority=members[0].priority)
        try:
            await write_new(self._runtime, key, encode_batch(batch_id, members))
        except StoreError as exc:
            raise publish_failed(topic, exc) from exc
        self._runtime.signals.published(topic, key)
        logger.debug("published batch=%s topic=%s messages=%d", batch_id, topic, len(members))


async def _let_callers_return(queue: list[_Waiting]) -> None:
    """Before the next write, give the callers the last one released a few turns of the
    loop to call again (no timer): until no new call arrived for :data:`_QUIET_TURNS`
    turns, at most :data:`_RETURN_TURNS`. Taken at once, what waits is only what arrived during that
    write, and callers publishing in a loop split into two groups that take turns, each
    with objects half as big (twice the requests)."""
    quiet, count = 0, len(queue)
    for _ in range(_RETURN_TURNS):
        await asyncio.sleep(0)
        quiet = quiet + 1 if len(queue) == count else 0
        if quiet == _QUIET_TURNS:
            return
        count = len(queue)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _failure(topic: str, exc: BaseException) -> BaseException:
    """What one caller of a failed write raises (each its own exception)."""
    if isinstance(exc, PublishError):
        error = PublishError(str(exc))
    elif isinstance(exc, asyncio.CancelledError):
        error = PublishError(f"could not publish to topic {topic!r}: the write was cancelled")
    else:
        return exc  # a bug, not a store's failure: as it is
    error.__cause__ = exc.__cause__ or exc
    return error
