"""The ``pawnqueue`` stream reader with timers around Spark's calls, for bench/spark_cluster.py.

Registered as ``pawnqueue_traced``: the same reader, whose driver-side calls (latestOffset,
partitions, commit; claims and acks inside them) and task reads (with the waits for the
store apart) append one JSON
line each to ``$PQ_BENCH_TRACE/{pid}.jsonl`` in whichever process runs them. A module
of its own, so executors import only this (and pawn_queue) to unpickle it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from pawn_queue.spark import reading as spark_reading
from pawn_queue.spark.source import PawnQueueDataSource
from pawn_queue.spark.stream import PawnQueueStreamReader

TRACE_ENV = "PQ_BENCH_TRACE"


def _trace(event: dict[str, Any]) -> None:
    directory = os.environ.get(TRACE_ENV)
    if directory:
        with open(Path(directory) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), **event}) + "\n")


_fetch_waits: list[float] = []


def _timed_fetches() -> None:
    """Time how long a task's read waits for its objects from the store (once per Python
    worker): reading.py fetches ahead while it decodes, so this is the wait, not the fetch."""
    original = getattr(spark_reading, "_fetched", None)
    if original is None or getattr(original, "timed", False):
        return

    def fetched(*args: Any) -> Iterator[Any]:
        results = original(*args)
        try:
            while True:
                started = time.perf_counter()
                result = next(results, _END)
                _fetch_waits.append(time.perf_counter() - started)
                if result is _END:
                    return
                yield result
        finally:
            results.close()

    fetched.timed = True  # type: ignore[attr-defined]
    setattr(spark_reading, "_fetched", fetched)  # noqa: B010 (typed as a plain attribute)


_END = object()


def _timed_driver(driver: Any) -> None:
    """Time the driver state's claims (a scan of the topics) and acks, inside latestOffset."""
    for call, name in (("claim", "_scan"), ("ack", "ack_through")):
        method = getattr(driver, name)

        async def timed(*args: Any, call: str = call, method: Any = method) -> Any:
            at, started = time.time(), time.perf_counter()
            try:
                return await method(*args)
            finally:
                seconds = time.perf_counter() - started
                _trace({"side": "driver", "call": call, "at": at, "seconds": seconds})

        setattr(driver, name, timed)


class TracedStreamReader(PawnQueueStreamReader):
    def _timed(self, call: str, method: Any, *args: Any) -> Any:
        at, started = time.time(), time.perf_counter()
        result = method(*args)
        seconds = time.perf_counter() - started
        _trace({"side": "driver", "call": call, "at": at, "seconds": seconds})
        return result

    def _open(self, offset: dict[str, Any]) -> Any:
        if self._driver is not None:
            return super()._open(offset)
        # Opening the driver state: checks of the store and topics, the lease strategy.
        driver = self._timed("open", super()._open, offset)
        _timed_driver(driver)
        return driver

    def initialOffset(self) -> dict[str, Any]:
        offset: dict[str, Any] = self._timed("initialOffset", super().initialOffset)
        return offset

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        end: dict[str, Any] = self._timed("latestOffset", super().latestOffset, start, limit)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Any:
        return self._timed("partitions", super().partitions, start, end)

    def commit(self, end: dict[str, Any]) -> None:
        self._timed("commit", super().commit, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The reader's own time (fetch, then decoding into Arrow) apart from the time Spark
        takes between batches (sending each to the JVM)."""
        began = time.time()
        _timed_fetches()
        _fetch_waits.clear()
        started, producing, rows = time.perf_counter(), 0.0, 0
        batches = iter(super().read(partition))
        while True:
            step = time.perf_counter()
            batch = next(batches, None)
            producing += time.perf_counter() - step
            if batch is None:
                break
            rows += batch.num_rows
            yield batch
        refs = getattr(partition, "refs", ())
        _trace(
            {
                "side": "task",
                "partition": partition.value,
                "began": began,
                "seconds": time.perf_counter() - started,
                "reader_seconds": producing,
                "fetch_wait_seconds": sum(_fetch_waits),
                "objects": len(refs),
                "rows": rows,
            }
        )


class TracedSource(PawnQueueDataSource):
    @classmethod
    def name(cls) -> str:
        return "pawnqueue_traced"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader = super().streamReader(schema)
        assert isinstance(reader, PawnQueueStreamReader)
        return TracedStreamReader(reader._options, reader._schema)
