"""Task side of every read: fetch a partition's objects and turn them into record batches.

A partition names message objects (one message each) and batch objects (many); it is
planned on the driver and read in an executor, where the objects are fetched concurrently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from pawn_queue import layout
from pawn_queue._aio import gather_limited
from pawn_queue.envelope import (
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
from pawn_queue.spark.rows import RowBuffer
from pawn_queue.store.base import Store

logger = logging.getLogger(__name__)

_FETCH_CONCURRENCY = 64
Kind = Literal["stream", "pending", "dead_letter"]


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
    """Consecutive groups of about ``target_bytes`` and at most ``max_objects`` objects.

    A batch object is never split: objects are the natural unit of a partition.
    """
    groups: list[list[ObjectRef]] = []
    current: list[ObjectRef] = []
    size = 0
    for ref in refs:
        if current and (size + ref.size > target_bytes or len(current) >= max_objects):
            groups.append(current)
            current, size = [], 0
        current.append(ref)
        size += ref.size
    if current:
        groups.append(current)
    return groups


def read_partition(
    options: SourceOptions, partition: ObjectsPartition, schema: StructType, kind: Kind
) -> Iterator[pa.RecordBatch]:
    """The rows of the partition's objects, in order, as record batches."""
    fetched = runtime.run(_fetch_all(options, partition.refs, kind))
    buffer = RowBuffer(schema)
    for ref, (data, lease) in zip(partition.refs, fetched, strict=True):
        if data is None:
            if kind == "stream" and options.fail_on_data_loss:
                raise DataLossError(
                    f"object {ref.key} of micro-batch {partition.batch} is gone: it was acked "
                    "or deleted by someone else while the query did not hold its lease (the "
                    "query was down longer than leaseTimeoutSeconds, or the topic was deleted). "
                    "Set option failOnDataLoss=false to skip such messages"
                )
            if kind == "stream":
                logger.warning("skipping missing object key=%s batch=%s", ref.key, partition.batch)
            continue
        try:
            _add_object(buffer, ref, data, lease, kind)
        except CorruptObject as exc:
            if kind == "stream":
                runtime.run(_dead_letter_corrupt(options, ref.key, data, str(exc)))
            logger.warning("skipping unreadable object key=%s error=%s", ref.key, exc)
        yield from buffer.batches()
    yield from buffer.batches(full=True)


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
    envelopes = decode_batch(data) if is_batch else [Envelope.decode(data)]
    skip = set(ref.skip)
    receives = ref.receives
    if lease is not None and lease.message_key in ("", ref.key):
        skip.update(lease.settled)
        receives = lease.receive_count
    if skip:
        envelopes = [e for index, e in enumerate(envelopes) if index not in skip]
    buffer.add(envelopes, ref.key, receives)


async def _fetch_all(
    options: SourceOptions, refs: Sequence[ObjectRef], kind: Kind
) -> list[tuple[bytes | None, LeaseBody | None]]:
    store = await runtime.shared_store(options)
    results = await gather_limited(_FETCH_CONCURRENCY, (_fetch(store, ref) for ref in refs))
    out: list[tuple[bytes | None, LeaseBody | None]] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out


async def _fetch(store: Store, ref: ObjectRef) -> tuple[bytes | None, LeaseBody | None]:
    try:
        data = (await store.get(ref.key)).data
    except NotFound:
        return None, None
    lease = None
    if ref.leased:
        pending = layout.parse_pending_key(ref.key)
        if pending is not None:
            topic = layout.topic_of(ref.key)
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
    topic = layout.topic_of(key)
    info = DeadLetterInfo("corrupt", error, now_utc().isoformat(), key)
    store = await runtime.shared_store(options)
    await store.put(
        layout.dead_letter_key(topic, pending.object_id),
        encode_unreadable(pending.object_id, topic, data, info),
    )
