"""The ``pawnqueue`` stream reader with timers around Spark's calls, for bench/spark/cluster.py.

Registered as ``pawnqueue_traced``: the same source, whose calls on the driver side (schema,
streamReader, initialOffset, latestOffset, partitions, commit; the claims and acks inside
latestOffset) and task reads (the waits for the store apart) append one JSON line each to
``$PQ_BENCH_TRACE/{pid}.jsonl`` in whichever process runs them, with when that process
started and when it imported this module. A module of its own, so the processes that
unpickle the source import only this and pawn_queue.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_IMPORT_STARTED = time.time()  # this process has started Python and PySpark's runner

import pyarrow as pa  # type: ignore[import-untyped]  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from pawn_queue.spark import reading as spark_reading  # noqa: E402
from pawn_queue.spark.source import PawnQueueDataSource  # noqa: E402
from pawn_queue.spark.stream import PawnQueueStreamReader  # noqa: E402

TRACE_ENV = "PQ_BENCH_TRACE"


def _process_started() -> float | None:
    """When this process started, as a Unix time (Linux: its start and the uptime in /proc,
    both since boot, to a clock tick)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


_PROCESS = {
    "process_started": _process_started(),
    "import_started": _IMPORT_STARTED,
    "imported": time.time(),  # ... and imported pawn_queue, to unpickle the source
    # Spark puts its pyspark.zip first on the path of the processes it starts: Python
    # compiles every module of it again in each new process (no bytecode cache in a zip).
    "pyspark_from_zip": ".zip" in (pyspark.__file__ or ""),
}


def _trace(event: dict[str, Any]) -> None:
    directory = os.environ.get(TRACE_ENV)
    if directory:
        with open(Path(directory) / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), **_PROCESS, **event}) + "\n")


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

    def schema(self) -> StructType:
        at, started = time.time(), time.perf_counter()
        schema = super().schema()  # load(): checks the options, the store and the topics
        seconds = time.perf_counter() - started
        _trace({"side": "driver", "call": "schema", "at": at, "seconds": seconds})
        return schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _trace({"side": "driver", "call": "streamReader", "at": time.time(), "seconds": 0.0})
        reader = super().streamReader(schema)
        assert isinstance(reader, PawnQueueStreamReader)
        return TracedStreamReader(reader._options, reader._schema)
