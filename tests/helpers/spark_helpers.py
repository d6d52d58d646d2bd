"""Helpers of the Spark tests: a store reachable from Spark and from the test, publishing,
and reading a query's Parquet output back."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pawn_queue import PawnQueue
from pawn_queue.config import S3Config, load_config
from pawn_queue.spark import register
from pawn_queue.spark.rows import message_schema


def local_spark(master: str = "local[2]", config: Mapping[str, str] | None = None) -> SparkSession:
    """A quiet local SparkSession with the ``pawnqueue`` format registered. Its Python
    workers run this interpreter (pyarrow, pawn_queue), not python3 from PATH."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


@dataclass
class SparkQueue:
    """A store for one test: how Spark reaches it (options) and how the test does (config)."""

    options: dict[str, str]
    config: dict[str, Any]
    tmp: Path

    def read_options(self, **extra: str) -> dict[str, str]:
        return {**self.options, **extra}

    def queue(self) -> PawnQueue:
        return PawnQueue(load_config(self.config, environ={}))


def filesystem_queue(tmp_path: Path) -> SparkQueue:
    root = tmp_path / "queue"
    config: dict[str, Any] = {"backend": "filesystem", "filesystem": {"path": str(root)}}
    return SparkQueue({"url": f"file://{root}"}, config, tmp_path)


def s3_queue(s3_config: S3Config, tmp_path: Path) -> SparkQueue:
    """S3 through a YAML file (credentials in it), the way a cluster would ship a config."""
    config: dict[str, Any] = {
        "backend": "s3",
        "s3": {
            "endpoint_url": s3_config.endpoint_url,
            "bucket_name": s3_config.bucket_name,
            "aws_access_key_id": "test-access-key",
            "aws_secret_access_key": "test-secret-key",
            "use_ssl": False,
        },
    }
    path = tmp_path / "pawnqueue.yaml"
    path.write_text(yaml.safe_dump(config))
    return SparkQueue({"config": str(path)}, config, tmp_path)


# -- publishing and reading back -------------------------------------------------------------


async def publish(
    sq: SparkQueue, topic: str, singles: int, batches: Sequence[int] = (), start: int = 0
) -> list[str]:
    """Publish ``singles`` one-message objects and batch objects of the given sizes; the
    payloads are ``{"n": start, ...}`` counting up. Returns the message ids."""
    # Group commit off: the singles, published concurrently, stay one-message objects.
    config = load_config({**sq.config, "producer": {"group_commit": False}}, environ={})
    async with PawnQueue(config) as pq:
        await pq.create_topic(topic)
        producer = await pq.register_producer("spark-tests")
        ids = list(
            await asyncio.gather(
                *(producer.publish(topic, {"n": start + i}) for i in range(singles))
            )
        )
        n = start + singles
        for size in batches:
            ids += await producer.publish_batch(topic, [{"n": n + i} for i in range(size)])
            n += size
    return ids


async def remaining(sq: SparkQueue, prefix: str) -> list[str]:
    async with sq.queue() as pq:
        return [meta.key for meta in await pq.store.list(prefix)]


def stream(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    return spark.readStream.format("pawnqueue").options(**options).load()


def to_parquet(
    df: DataFrame, out: Path, checkpoint: Path, *, available_now: bool = True
) -> StreamingQuery:
    writer = df.writeStream.format("parquet").option("path", str(out))
    writer = writer.option("checkpointLocation", str(checkpoint))
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="200 milliseconds").start()


def parquet_ids(spark: SparkSession, out: Path) -> list[str]:
    if not (out / "_spark_metadata").exists():
        return []
    rows = spark.read.schema(message_schema()).parquet(str(out)).select("id").collect()
    return [row.id for row in rows]


def wait_for_rows(
    spark: SparkSession, query: StreamingQuery, out: Path, count: int, timeout: float = 120
) -> list[str]:
    """Block until the query has written ``count`` rows (or fail on its error or timeout)."""
    waited = 0.0
    while True:
        ids = parquet_ids(spark, out)
        if len(ids) >= count:
            return ids
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        if waited > timeout:
            raise AssertionError(f"{len(ids)} of {count} rows after {timeout} s")
        query.awaitTermination(0.5)
        waited += 0.5
