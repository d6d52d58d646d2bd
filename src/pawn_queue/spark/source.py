"""The ``pawnqueue`` data source: schema, batch read, and the entry points Spark calls."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.exceptions import ConfigError
from pawn_queue.spark import runtime
from pawn_queue.spark.options import SourceOptions
from pawn_queue.spark.reading import ObjectRef, ObjectsPartition, pack, read_partition
from pawn_queue.spark.rows import dead_letter_schema, message_schema

_PARTITION_BYTES = 8 << 20
_PARTITION_OBJECTS = 1000


class PawnQueueDataSource(DataSource):
    """Topics of a pawn-queue store as a Spark source and sink. Short name ``pawnqueue``."""

    @classmethod
    def name(cls) -> str:
        return "pawnqueue"

    def _options(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    def schema(self) -> StructType:
        options = self._options()
        # Called by load(): bad options, an unreachable store or an unknown topic fail here.
        runtime.run(_check(options))
        return dead_letter_schema() if options.state == "dead_letter" else message_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        _check_schema(schema, options)
        return PawnQueueBatchReader(options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pawn_queue.spark.stream import PawnQueueStreamReader

        options = self._options()
        if options.state != "pending":
            raise ConfigError("pawnqueue: a stream reads pending messages; state must be 'pending'")
        _check_schema(schema, options)
        return PawnQueueStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pawn_queue.spark.shape import RowShape
        from pawn_queue.spark.writer import PawnQueueWriter

        if overwrite:
            raise ConfigError("pawnqueue: a topic is append-only; write with mode('append')")
        options = self._options()
        runtime.run(_check(options, options.topic))
        return PawnQueueWriter(options, RowShape.of(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pawn_queue.spark.shape import RowShape
        from pawn_queue.spark.writer import PawnQueueStreamWriter

        options = self._options()
        runtime.run(_check(options, options.topic))
        return PawnQueueStreamWriter(options, RowShape.of(schema))


class PawnQueueBatchReader(DataSourceReader):
    """A snapshot of pending messages or dead letters, without claiming anything."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        refs = runtime.run(_snapshot(self._options))
        groups = pack(refs, _PARTITION_BYTES, _PARTITION_OBJECTS)
        return [ObjectsPartition(index, group) for index, group in enumerate(groups)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ObjectsPartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return read_partition(self._options, partition, self._schema, self._options.state)


async def _check(options: SourceOptions, *topics: str) -> None:
    """Check the store and the ``topics`` a write goes to, or (none given) what a read
    reads: its topics, and the subscription of each it names."""
    store = await runtime.shared_store(options)
    if topics:
        await runtime.check_store(store, topics)
    else:
        await runtime.check_store(store, options.topics, options.subscription)


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    expected = dead_letter_schema() if options.state == "dead_letter" else message_schema()
    if schema != expected:
        raise ConfigError(
            f"pawnqueue has a fixed schema ({expected.simpleString()}); do not set .schema()"
        )


async def _snapshot(options: SourceOptions) -> list[ObjectRef]:
    """Every pending message object (or dead letter) of the queues read (the topics', or
    their subscription's), in key order."""
    store = await runtime.shared_store(options)
    await runtime.check_store(store, options.topics, options.subscription)
    refs: list[ObjectRef] = []
    now = now_utc()
    for topic in options.queues:
        if options.state == "dead_letter":
            metas = await store.list(layout.dead_letter_prefix(topic))
            refs += [ObjectRef(meta.key, meta.size) for meta in metas]
            continue
        leases = {meta.key for meta in await store.list(layout.leases_prefix(topic))}
        for meta in await store.list(layout.messages_prefix(topic)):
            pending = layout.parse_pending_key(meta.key)
            due = layout.due_from_key(meta.key)
            if pending is None or (due is not None and due > now):
                continue
            leased = layout.lease_key(topic, pending.lease_id()) in leases
            refs.append(ObjectRef(meta.key, meta.size, receives=0, leased=leased))
    return refs
