"""Task side of every read: fetch a partition's objects and turn them into record batches.

A partition names message objects (one message each) and batch objects (many); it is
planned on the driver and read in an executor, where the objects are fetched concurrently.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import (
    CorruptObject,
    DeadLetterInfo,
    Envelope,
    LeaseBody,
    decode_batch,
    decode_dead_letter,
    encode_unreadable,
    now_utc,
)
from pawn_queue.exceptions import DataLossError as DataLossError  # also importable from here
from pawn_queue.exceptions import NotFound
from pawn_queue.spark import runtime
from pawn_queue.spark.options import SourceOptions
from pawn_queue.spark.rows import RowBuffer, plain_batch

logger = logging.getLogger(__name__)

_FETCH_CONCURRENCY = 64
_FETCH_AHEAD_BYTES = 16 << 20
Kind = Literal["stream", "pending", "dead_letter"]
Fetched = tuple[bytes | None, LeaseBody | None]


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One object of a partition.

    ``skip``: batch members settled before (by a consumer whose lease the query took over).
    ``receives``: deliveries of the object so far, this one included (its lease's count).
    ``leased``: (snapshots) a lease exists; read it for settled members and receive counts.
    """

    key: str
    size: int = 0
    skip: tuple[int, ...] = ()
    receives: int = 1
    leased: bool = False


class ObjectsPartition(InputPartition):
    """Objects read by one task; ``batch`` is the micro-batch (None for a batch read)."""

    def __init__(self, index: int, refs: Sequence[ObjectRef], batch: int | None = None) -> None:
        super().__init__(index)
        self.refs = tuple(refs)
        self.batch = batch


def pack(refs: Sequence[ObjectRef], target_bytes: int, max_objects: int) -> list[list[ObjectRef]]:
    """Consecutive groups of about ``target_bytes`` and at most ``max_objects`` objects, of
    about equal size (a small last group would be a task running alone).

    A batch object is never split: objects are the natural unit of a partition.
    """
    if not refs:
        return []
    total = sum(ref.size for ref in refs)
    by_bytes = max(int(total / max(target_bytes, 1) + 0.5), 1)  # nearest: not a bound
    by_objects = -(-len(refs) // max_objects)
    per_bytes, per_objects = total / by_bytes, -(-len(refs) // by_objects)
    groups: list[list[ObjectRef]] = []
    current: list[ObjectRef] = []
    size = 0
    for ref in refs:
        current.append(ref)
        size += ref.size
        if size >= per_bytes or len(current) >= per_objects:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def read_partition(
    options: SourceOptions, partition: ObjectsPartition, schema: StructType, kind: Kind
) -> Iterator[pa.RecordBatch]:
    """The rows of the partition's objects, in order, as record batches."""
    buffer = RowBuffer(schema)
    fetched = _fetched(options, partition.refs)
    try:
        for ref, (data, lease) in zip(partition.refs, fetched, strict=True):
            if data is None:
                if kind == "stream" and options.fail_on_data_loss:
                    raise DataLossError(
                        f"object {ref.key} of micro-batch {partition.batch} is gone: it was "
                        "acked or deleted by someone else while the query did not hold its lease "
                        "(the query was down longer than leaseTimeoutSeconds, or the topic was "
                        "deleted). Set option failOnDataLoss=false to skip such messages"
                    )
                if kind == "stream":
                    logger.warning(
                        "skipping missing object key=%s batch=%s", ref.key, partition.batch
                    )
                continue
            try:
                _add_object(buffer, ref, data, lease, kind)
            except CorruptObject as exc:
                if kind == "stream":
                    runtime.run(_dead_letter_corrupt(options, ref.key, data, str(exc)))
                logger.warning("skipping unreadable object key=%s error=%s", ref.key, exc)
            yield from buffer.batches()
        yield from buffer.batches(full=True)
    finally:
        fetched.close()


def _add_object(
    buffer: RowBuffer, ref: ObjectRef, data: bytes, lease: LeaseBody | None, kind: Kind
) -> None:
    if kind == "dead_letter":
        envelope, info = decode_dead_letter(data)
        receives = info.receive_count if info and info.receive_count else 0
        buffer.add([envelope], ref.key, receives, info)
        return
    pending = layout.parse_pending_key(ref.key)
    is_batch = pending is not None and pending.kind == "batch"
    skip = set(ref.skip)
    receives = ref.receives
    if lease is not None and lease.message_key in ("", ref.key):
        skip.update(lease.settled)
        receives = lease.receive_count
    plain = plain_batch(data, skip) if is_batch else None
    if plain is not None:
        buffer.add_plain(plain, ref.key, receives)
        return
    envelopes = decode_batch(data) if is_batch else [Envelope.decode(data)]
    if skip:
        envelopes = [e for index, e in enumerate(envelopes) if index not in skip]
    if any(e.expires_at is not None for e in envelopes):
        # Past its own deadline a message is never delivered (publish expires_in): a stream's
        # commit removes it with its object, a snapshot leaves it out.
        now = datetime.now(UTC)
        envelopes = [e for e in envelopes if not e.expired(now)]
    buffer.add(envelopes, ref.key, receives)


def _fetched(options: SourceOptions, refs: Sequence[ObjectRef]) -> Generator[Fetched, None, None]:
    """Each ref's object (None when gone) and lease, in order. Fetches run ahead of the
    caller, up to _FETCH_CONCURRENCY objects and _FETCH_AHEAD_BYTES, so objects are decoded
    while the next ones are on their way and a partition is never held in memory whole."""
    pending: deque[tuple[ObjectRef, concurrent.futures.Future[Fetched]]] = deque()
    ahead = 0
    try:
        for ref in refs:
            while pending and (
                len(pending) >= _FETCH_CONCURRENCY or ahead + ref.size > _FETCH_AHEAD_BYTES
            ):
                done, future = pending.popleft()
                ahead -= done.size
                yield future.result()
            pending.append((ref, runtime.submit(_fetch(options, ref))))
            ahead += ref.size
        while pending:
            yield pending.popleft()[1].result()
    finally:
        for _, future in pending:  # the task stopped early (an error, a cancelled task)
            future.cancel()


async def _fetch(options: SourceOptions, ref: ObjectRef) -> Fetched:
    store = await runtime.shared_store(options)
    try:
        data = (await store.get(ref.key)).data
    except NotFound:
        return None, None
    lease = None
    if ref.leased:
        pending = layout.parse_pending_key(ref.key)
        if pending is not None:
            topic = layout.queue_of(ref.key)
            try:
                lease = LeaseBody.decode(
                    (await store.get(layout.lease_key(topic, pending.lease_id()))).data
                )
            except (NotFound, CorruptObject):
                lease = None
    return data, lease


async def _dead_letter_corrupt(options: SourceOptions, key: str, data: bytes, error: str) -> None:
    """Keep an unreadable object's bytes in dead letter; the query's commit then deletes the
    object under its lease (its copy is durable first, rule 2)."""
    pending = layout.parse_pending_key(key)
    if pending is None:
        return
    topic = layout.queue_of(key)
    info = DeadLetterInfo("corrupt", error, now_utc().isoformat(), key)
    store = await runtime.shared_store(options)
    await store.put(
        layout.dead_letter_key(topic, pending.object_id),
        encode_unreadable(pending.object_id, topic, data, info),
    )
