"""Streaming read: Spark's stream-reader interface over :class:`StreamDriver`.

An offset is ``{"query": id, "batch": n}``: micro-batch ``n`` is manifest ``n`` of query
``id``. The id is made once, when the query starts on an empty checkpoint, so a checkpoint
always finds its own manifests and two queries never share them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pawn_queue._protocol.envelope import now_utc
from pawn_queue.exceptions import PawnQueueError
from pawn_queue.spark import runtime
from pawn_queue.spark.driver import StreamDriver, new_query_id
from pawn_queue.spark.manifests import Limit
from pawn_queue.spark.options import SourceOptions
from pawn_queue.spark.reading import ObjectsPartition, pack, read_partition

_PARTITION_BYTES = (256 << 10, 8 << 20)  # a task reads between these, about a quarter each
_PARTITION_OBJECTS = (64, 1000)
_SPREAD = 4


def _limit(limit: ReadLimit) -> Limit:
    if isinstance(limit, ReadMaxRows):
        return Limit(max_rows=limit.max_rows)
    if isinstance(limit, ReadMaxFiles):
        return Limit(max_objects=limit.max_files)
    if isinstance(limit, ReadMaxBytes):
        return Limit(max_bytes=limit.max_bytes)
    return Limit()  # ReadAllAvailable, and minimums (never asked for by this source)


def _batch(offset: dict[str, Any]) -> int:
    batch = offset.get("batch")
    if not isinstance(batch, int):
        raise PawnQueueError(f"not a pawnqueue offset: {offset!r}")
    return batch


class PawnQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads topics as a stream; exactly-once into an idempotent sink (see module docs)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._schema = schema
        self._query: str | None = None
        self._driver: StreamDriver | None = None
        self._available_now: datetime | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tasks get the options only: the driver state stays in the driver-side process.
        return {"options": self._options, "schema": self._schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._options, self._schema = state["options"], state["schema"]
        self._query, self._driver, self._available_now = None, None, None

    def _open(self, offset: dict[str, Any]) -> StreamDriver:
        """The driver state of the query ``offset`` belongs to, opened on first use."""
        query = offset.get("query")
        if not isinstance(query, str):
            raise PawnQueueError(f"not a pawnqueue offset: {offset!r}")
        if self._driver is None:
            self._driver = runtime.run(StreamDriver.open(self._options, query))
            if self._available_now is not None:
                self._driver.prepare_available_now(self._available_now)
        elif self._driver.query != query:
            raise PawnQueueError(
                f"offset of query {query!r} given to the reader of query {self._driver.query!r}"
            )
        return self._driver

    # -- offsets ----------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks for it on every start, and uses it only when the checkpoint is empty.
        if self._query is None:
            self._query = new_query_id(self._options.name)
        return {"query": self._query, "batch": -1}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_messages is not None:
            return ReadMaxRows(self._options.max_messages)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        driver = self._open(start)
        batch = runtime.run(driver.latest(_batch(start), _limit(limit)))
        return {"query": driver.query, "batch": batch}

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = now_utc()
        if self._driver is not None:
            self._driver.prepare_available_now(self._available_now)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        driver = self._open(end)
        manifests = runtime.run(driver.plan(_batch(start), _batch(end)))
        partitions: list[InputPartition] = []
        for manifest in manifests:
            total = sum(ref.size for ref in manifest.refs)
            target = min(max(total // _SPREAD, _PARTITION_BYTES[0]), _PARTITION_BYTES[1])
            count = min(
                max(len(manifest.refs) // _SPREAD, _PARTITION_OBJECTS[0]), _PARTITION_OBJECTS[1]
            )
            for group in pack(manifest.refs, target, count):
                partitions.append(ObjectsPartition(len(partitions), group, manifest.batch))
        return partitions

    def commit(self, end: dict[str, Any]) -> None:
        driver = self._open(end)
        runtime.run(driver.ack_through(_batch(end)))

    def stop(self) -> None:
        if self._driver is not None:
            runtime.run(self._driver.stop())

    # -- tasks ------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ObjectsPartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return read_partition(self._options, partition, self._schema, "stream")
