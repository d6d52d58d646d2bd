"""Writes, batch and streaming: rows become messages, packed into batch objects.

Keys are deterministic: message and object ids are UUIDv5 of (write, micro-batch, partition,
row position), and the FIFO timestamp in the key is recorded once per write (the batch
writer's creation time; for a stream, the first task of a micro-batch records it in
``_spark/{query}/sink/{batch}.json``). A retried task, or a micro-batch run again after a
restart, overwrites its own objects instead of adding copies. Once a micro-batch's commit
marked it committed, running it again writes nothing. A task packs the rows of each
priority into their own objects (one object, one priority band).

A topic with subscriptions gets nothing in its own queue: as a producer does, each task
copies every object into each subscription whose filter a member's attributes match (only
those members), under the same key rebased into the subscription's queue, so keys stay
deterministic per queue. A task reads the topic's subscription index when it writes its
first object, and again whenever the copy it read is as old as a producer's may be
(:data:`pawn_queue.subscriptions.INDEX_CACHE_SECONDS`).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import chain

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from pawn_queue._internal.aio import Background
from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import Envelope, encode_batch, encode_json, now_utc, parse_time
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue._protocol.retained import SWEEP_MIN_SECONDS, RetainedSweeper
from pawn_queue._protocol.subscriptions import Destination, Subscriptions
from pawn_queue._protocol.topics import Topics
from pawn_queue.exceptions import AlreadyExists, PawnQueueError
from pawn_queue.spark import runtime
from pawn_queue.spark.options import SourceOptions
from pawn_queue.spark.shape import RowShape

logger = logging.getLogger(__name__)

_NAMESPACE = uuid.UUID("5d0f6a3e-8c1b-4f7a-a2e9-3b6c1d4e8f20")
_PUTS_IN_FLIGHT = 16


@dataclass
class WriteResult(WriterCommitMessage):
    """What one task wrote."""

    topic: str
    write: str
    at: str
    messages: int
    objects: int  # objects made of the rows (each written into one queue or more)
    skipped: bool = False
    queues: tuple[str, ...] = ()  # where it wrote: the topic's own queue, or subscriptions'


class _Publisher:
    """Packs one task's messages into objects and writes them, a few at a time."""

    def __init__(
        self, options: SourceOptions, shape: RowShape, ident: str, write: str, at: datetime
    ) -> None:
        self._options = options
        self._shape = shape
        self._topic = options.topic
        self._ident = ident
        self._at = at
        self._created = at.isoformat()
        self._producer = str(uuid.uuid5(_NAMESPACE, f"spark-writer/{write}"))
        self._routes = _Routes(options)
        self._pending: dict[int, list[Envelope]] = {}  # by priority: one object, one band
        self._in_flight: deque[Future[str]] = deque()
        self.messages = 0
        self.objects = 0
        self.queues: set[str] = set()

    def publish(self, batches: Iterator[pa.RecordBatch]) -> None:
        per_object = self._options.messages_per_object
        for batch in batches:
            for payload, attributes, priority, expires_in in self._shape.messages(batch):
                envelope = Envelope(
                    self._id(f"m{self.messages}"),
                    self._topic,
                    self._producer,
                    self._created,
                    payload,
                    attributes,
                    expires_at=None if expires_in is None else self._deadline(expires_in),
                    priority=priority,
                )
                pending = self._pending.setdefault(priority, [])
                pending.append(envelope)
                self.messages += 1
                if len(pending) >= per_object:
                    self._flush(priority)
        for priority in list(self._pending):
            self._flush(priority)
        while self._in_flight:
            self._in_flight.popleft().result()

    def _deadline(self, expires_in: float) -> str:
        """A message's ``expires_at``: ``expires_in`` after the write's recorded time, so
        a retry writes the same body."""
        return (self._at + timedelta(seconds=expires_in)).isoformat()

    def _flush(self, priority: int) -> None:
        members = self._pending.pop(priority, [])
        if not members:
            return
        at = self._at + timedelta(microseconds=self.objects)  # FIFO within the partition
        single = len(members) == 1 and self._options.messages_per_object == 1
        object_id = members[0].id if single else self._id(f"o{self.objects}")
        key = layout.message_key(self._topic, object_id, at, batch=not single, priority=priority)
        self.objects += 1
        whole: bytes | None = None  # the body of all the members, made once
        for queue, chosen in _route(runtime.run(self._routes.destinations()), members):
            if len(chosen) < len(members):
                body = encode_batch(object_id, chosen)
            else:
                whole = body = whole or (
                    members[0].encode() if single else encode_batch(object_id, members)
                )
            if len(self._in_flight) >= _PUTS_IN_FLIGHT:
                self._in_flight.popleft().result()
            target = layout.in_queue(key, queue)
            self._in_flight.append(runtime.submit(_put(self._options, target, body)))
            self.queues.add(layout.queue_of(target))

    def result(self, write: str) -> WriteResult:
        """What the task wrote, for the commit on the driver."""
        queues = tuple(sorted(self.queues))
        at = self._created
        return WriteResult(self._topic, write, at, self.messages, self.objects, queues=queues)

    def _id(self, position: str) -> str:
        return str(uuid.uuid5(_NAMESPACE, f"{self._ident}/{position}"))


class _Routes:
    """Where one task's objects go, as a producer's would: the topic's routes (its own
    queue or its subscriptions, and its replay log), the subscription index read on first
    use and again once as old as a producer's copy may be (a GET per task, and one more
    per 2 s it writes; the topic's settings, one GET). An unreadable index fails the task:
    writing as if there were no subscriptions would lose their messages. The replay log is
    swept on the driver, at the commit (:func:`_sweep_retained`)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._subscriptions: Subscriptions | None = None
        self._topics: Topics

    async def destinations(self) -> tuple[Destination, ...]:
        if self._subscriptions is None:
            store = await runtime.shared_store(self._options)
            self._topics = Topics(store)
            self._subscriptions = Subscriptions(store, self._topics)
        topic = self._options.topic
        settings = await self._topics.settings(topic)
        return await self._subscriptions.routes(topic, settings)


def _route(
    destinations: tuple[Destination, ...], members: list[Envelope]
) -> Iterator[tuple[str, list[Envelope]]]:
    """The queues an object of ``members`` is written to, each with the members it takes:
    each route (:meth:`~pawn_queue.subscriptions.Subscriptions.routes`) whose filter some
    members' attributes match, with those."""
    for destination in destinations:
        matches = destination.filter.matches
        chosen = [m for m in members if matches(m.attributes)]
        if chosen:
            yield destination.queue, chosen


async def _put(options: SourceOptions, key: str, body: bytes) -> str:
    store = await runtime.shared_store(options)
    return await store.put(key, body, "overwrite")


def _task() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise PawnQueueError("pawnqueue: write() must run in a Spark task")
    return context


class PawnQueueWriter(DataSourceArrowWriter):
    """Batch write (``df.write.format("pawnqueue").mode("append")``).

    With option ``writeId`` (and ``batchId``), the write is idempotent across jobs: the same
    pair writes its rows once, like a micro-batch of a streaming write (for ``foreachBatch``).
    """

    def __init__(self, options: SourceOptions, shape: RowShape) -> None:
        self._options = options
        self._shape = shape
        # Made once on the driver and pickled into every task: retries reuse them.
        self._write = options.write_id or uuid.uuid4().hex
        self._at = now_utc().isoformat()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        partition = _task().partitionId()
        options, batch = self._options, self._options.batch_id
        if options.write_id is None:
            at = parse_time(self._at)
        else:
            first = next((b for b in iterator if b.num_rows), None)
            if first is None:
                return WriteResult(options.topic, self._write, "", 0, 0)
            at, committed = runtime.run(_batch_time(options, self._write, batch))
            if committed:
                return _skip(iterator, options.topic, self._write, at)
            iterator = chain([first], iterator)
        publisher = _Publisher(
            options, self._shape, f"{self._write}/{batch}/{partition}", self._write, at
        )
        publisher.publish(iterator)
        return publisher.result(self._write)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written = [m for m in messages if isinstance(m, WriteResult) and m.messages]
        if written and self._options.write_id is not None:
            runtime.run(
                _mark_committed(self._options, self._write, self._options.batch_id, written[0].at)
            )
        if written:
            runtime.run(_signal(self._options, written))
            runtime.run(_sweep_retained(self._options, written))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.warning("pawnqueue write %s aborted; a retry overwrites its objects", self._write)


def _skip(iterator: Iterator[pa.RecordBatch], topic: str, write: str, at: datetime) -> WriteResult:
    """A committed batch runs again: read its input, write nothing."""
    for _ in iterator:
        pass
    return WriteResult(topic, write, at.isoformat(), 0, 0, skipped=True)


class PawnQueueStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: every micro-batch's rows, exactly once per micro-batch."""

    def __init__(self, options: SourceOptions, shape: RowShape) -> None:
        self._options = options
        self._shape = shape

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        context = _task()
        query = context.getLocalProperty("sql.streaming.queryId") or ""
        batch = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        topic = self._options.topic
        first = next((b for b in iterator if b.num_rows), None)
        if first is None:
            return WriteResult(topic, query, "", 0, 0)
        at, committed = runtime.run(_batch_time(self._options, query, batch))
        if committed:
            return _skip(iterator, topic, query, at)
        ident = f"{query}/{batch}/{context.partitionId()}"
        publisher = _Publisher(self._options, self._shape, ident, query, at)
        publisher.publish(chain([first], iterator))
        return publisher.result(query)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        written = [m for m in messages if isinstance(m, WriteResult) and m.messages]
        if written:
            runtime.run(_mark_committed(self._options, written[0].write, batchId, written[0].at))
            runtime.run(_signal(self._options, written))
            runtime.run(_sweep_retained(self._options, written))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning("pawnqueue micro-batch %d aborted; a retry overwrites its objects", batchId)


async def _batch_time(options: SourceOptions, query: str, batch: int) -> tuple[datetime, bool]:
    """The message time of a micro-batch (recorded by its first task), and whether the
    micro-batch was committed already."""
    store = await runtime.shared_store(options)
    key = layout.spark_sink_key(layout.validate_name(query, "streaming query id"), batch)
    now = now_utc()
    try:
        await store.put(key, encode_json({"at": now.isoformat(), "committed": False}), "create")
        return now, False
    except AlreadyExists:
        stored = codec.loads((await store.get(key)).data)
        return parse_time(stored["at"]), bool(stored.get("committed"))


async def _mark_committed(options: SourceOptions, query: str, batch: int, at: str) -> None:
    """Mark the micro-batch committed; the previous one's marker is not needed any more."""
    store = await runtime.shared_store(options)
    body = encode_json({"at": at, "committed": True})
    await store.put(layout.spark_sink_key(query, batch), body)
    if batch > 0:
        await store.delete(layout.spark_sink_key(query, batch - 1))


_swept_at: dict[str, datetime] = {}  # store and topic -> this process's last sweep of its log


async def _sweep_retained(options: SourceOptions, written: list[WriteResult]) -> None:
    """Sweep the topic's replay log as its producers do (:mod:`pawn_queue._protocol.retained`),
    since Spark may be all that writes to it: at this process's first commit, then at most
    once per ``max(window / 10, 60 s)``. A LIST (and deletes) when it runs."""
    if not any(layout.is_retained_log(q) for result in written for q in result.queues):
        return
    key = f"{options.url}|{options.config_path}|{options.topic}"
    last, now = _swept_at.get(key), now_utc()
    if last is not None and now - last < timedelta(seconds=SWEEP_MIN_SECONDS):
        return
    store = await runtime.shared_store(options)
    window = (await Topics(store).settings(options.topic)).replay_window_seconds
    if not window or (last is not None and now - last < timedelta(seconds=window / 10)):
        return
    _swept_at[key] = now
    margin = timedelta(seconds=options.config().concurrency.clock_skew_margin_seconds)
    await RetainedSweeper(store, Background(), now_utc, margin).sweep(options.topic, window)


async def _signal(options: SourceOptions, written: list[WriteResult]) -> None:
    """Wake idle consumers of the queues written (the change signal a producer gives): the
    topic's own, or the subscriptions' it copied into."""
    config = options.config()
    signals = ChangeSignals(await runtime.shared_store(options), config.notify)
    for queue in sorted({queue for result in written for queue in result.queues}):
        signals.published(queue)
    await signals.close()
