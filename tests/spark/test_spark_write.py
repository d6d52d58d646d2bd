"""Writes, batch and streaming: rows become messages, and no retry adds a copy."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from pyspark import TaskContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession, functions
from pyspark.sql.types import LongType

from pawn_queue._protocol.envelope import decode_batch
from tests.helpers.spark_helpers import SparkQueue

pytest_plugins = ["tests.helpers.spark_support"]

# Spark runs alone, after the others (make pytest): Spark's Python workers must connect back
# within Spark's own 10 s, which a machine saturated by pytest workers misses.
pytestmark = pytest.mark.alone


async def _create(sq: SparkQueue, *topics: str) -> None:
    async with sq.queue() as pq:
        for topic in topics:
            await pq.create_topic(topic)


async def _messages(sq: SparkQueue, topic: str) -> list[dict[str, object]]:
    """Every message in the topic, read the way consumers see them: ``{"n": ..., ...}``."""
    async with sq.queue() as pq:
        out = []
        for meta in await pq.store.list(f"{topic}/messages/"):
            data = (await pq.store.get(meta.key)).data
            members = decode_batch(data) if meta.key.endswith(".batch") else None
            if members is None:
                out.append({**json.loads(data)["payload"], "key": meta.key})
            else:
                out += [{**m.payload, "key": meta.key, "attributes": m.attributes} for m in members]
        return out


async def _consume_all(sq: SparkQueue, topic: str) -> list[object]:
    async with sq.queue() as pq:
        consumer = await pq.register_consumer("drain", topics=[topic])
        payloads = []
        while batch := await consumer.poll():
            for message in batch:
                payloads.append(message.payload)
                await message.ack()
        return payloads


def test_batch_write(spark: SparkSession, spark_queue: SparkQueue) -> None:
    asyncio.run(_create(spark_queue, "out"))
    df = spark.range(0, 250, 1, 2).select(
        functions.struct(functions.col("id").alias("n"), functions.lit("x").alias("s")).alias(
            "payload"
        ),
        functions.create_map(functions.lit("source"), functions.lit("spark")).alias("attributes"),
    )
    df.write.format("pawnqueue").options(**spark_queue.options).option("topic", "out").option(
        "messagesPerObject", "100"
    ).mode("append").save()
    messages = asyncio.run(_messages(spark_queue, "out"))
    assert sorted(m["n"] for m in messages) == list(range(250))  # type: ignore[type-var]
    assert len({m["key"] for m in messages}) == 4  # 125 rows per partition: 100 + 25
    assert all(m["s"] == "x" and m["attributes"] == {"source": "spark"} for m in messages)
    # Consumers get them as they would from publish_batch.
    payloads = asyncio.run(_consume_all(spark_queue, "out"))
    assert sorted(p["n"] for p in payloads) == list(range(250))  # type: ignore[index]


def test_write_errors(spark: SparkSession, fs_queue: SparkQueue) -> None:
    asyncio.run(_create(fs_queue, "out"))
    df = spark.range(3).select(functions.col("id").cast("string").alias("payload"))
    writer = df.write.format("pawnqueue").options(**fs_queue.options)
    with pytest.raises(Exception, match="topic 'nope' does not exist"):
        writer.option("topic", "nope").mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        writer.option("topic", "out").mode("overwrite").save()
    bad = spark.range(3).select(functions.lit("{not json").alias("payload"))
    with pytest.raises(Exception, match="'payload' is not JSON text"):
        bad.write.format("pawnqueue").options(**fs_queue.options).option("topic", "out").mode(
            "append"
        ).save()
    with pytest.raises(Exception, match="must be map<string,string>"):
        df.withColumn("attributes", functions.lit(1)).write.format("pawnqueue").options(
            **fs_queue.options
        ).option("topic", "out").mode("append").save()
    with pytest.raises(Exception, match="column 'priority' must be an integer type"):
        df.withColumn("priority", functions.lit("9")).write.format("pawnqueue").options(
            **fs_queue.options
        ).option("topic", "out").mode("append").save()
    # A bad value in any row: the write fails before it publishes a row of that batch.
    priorities = functions.when(functions.col("id") == 2, 10).otherwise(functions.col("id"))
    for column, value, error in (
        ("priority", priorities, "row 2 of a record batch: column priority: got 10"),
        ("expires_in", functions.lit(-1.0), "column expires_in: got -1.0"),
    ):
        with pytest.raises(Exception, match=error):
            spark.range(0, 3, 1, 1).select(
                functions.col("id").cast("string").alias("payload"), value.alias(column)
            ).write.format("pawnqueue").options(**fs_queue.options).option("topic", "out").option(
                "messagesPerObject", "1"
            ).mode("append").save()
    assert asyncio.run(_messages(fs_queue, "out")) == []


def test_write_sets_priority_and_expiry(spark: SparkSession, fs_queue: SparkQueue) -> None:
    """Optional columns priority (null: 0) and expires_in (null: none) set what publish's
    arguments do; consumers and the source see them, and nothing of an expired message."""
    asyncio.run(_create(fs_queue, "out"))
    rows = [("1", 9, None), ("2", None, 600.0), ("3", 5, None), ("4", 5, 1e-6), ("5", 0, None)]
    df = spark.createDataFrame(rows, "payload string, priority int, expires_in double")
    df.repartition(2).write.format("pawnqueue").options(**fs_queue.options).option(
        "topic", "out"
    ).mode("append").save()

    read = spark.read.format("pawnqueue").options(**fs_queue.options, topic="out").load()
    assert sorted((r.payload, r.priority) for r in read.collect()) == [
        ("1", 9),
        ("2", 0),
        ("3", 5),
        ("5", 0),
    ]

    async def consume() -> list[tuple[int, object, str | None]]:
        async with fs_queue.queue() as pq:
            consumer = await pq.register_consumer("drain", topics=["out"])
            got = []
            while batch := await consumer.poll():
                for message in batch:
                    got.append((message.priority, message.payload, message.expires_at))
                    await message.ack()
            return got

    got = asyncio.run(consume())
    assert [(p, payload) for p, payload, _ in got][:2] == [(9, 1), (5, 3)]  # highest first
    assert sorted((p, payload) for p, payload, _ in got[2:]) == [(0, 2), (0, 5)]
    assert [payload for _, payload, expires_at in got if expires_at is not None] == [2]


def _fail_midway(  # type: ignore[no-untyped-def]
    markers: Path, at: int, attempts: int = 1, after_objects_in: Path | None = None
):
    """A UDF that fails at row ``at`` in the first ``attempts`` task attempts, once each;
    with ``after_objects_in``, only once a batch object is there (another task wrote it)."""

    def identity(n):  # no type hints: they would make it a pandas UDF
        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        if n == at and attempt < attempts:
            try:
                os.close(os.open(markers / f"failed-{attempt}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return n
            deadline = time.monotonic() + 120
            while after_objects_in is not None and time.monotonic() < deadline:
                if next(after_objects_in.rglob("*.batch"), None) is not None:
                    break
                time.sleep(0.1)  # another process writes them: nothing here to wait on
            raise RuntimeError("injected failure after some objects were written")
        return n

    return functions.udf(identity, LongType())


def test_retried_write_task_leaves_no_duplicates(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    asyncio.run(_create(fs_queue, "out"))
    df = spark.range(0, 1000, 1, 2).select(_fail_midway(tmp_path, 400)("id").alias("n"))
    payload = functions.to_json(functions.struct("n")).alias("payload")
    df.select(payload).write.format("pawnqueue").options(**fs_queue.options).option(
        "topic", "out"
    ).option("messagesPerObject", "10").mode("append").save()
    assert (tmp_path / "failed-0").exists()  # the first attempt failed midway
    messages = asyncio.run(_messages(fs_queue, "out"))
    assert sorted(m["n"] for m in messages) == list(range(1000))  # type: ignore[type-var]
    assert len({m["key"] for m in messages}) == 100


def test_stream_write_failed_batch_and_rerun_of_committed_batch(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    """A micro-batch that failed midway is run again into the same keys; a micro-batch run
    again after its commit (the checkpoint lost its commit entry) writes nothing, even after
    consumers took its messages."""
    source, checkpoint = tmp_path / "source", tmp_path / "ck"
    spark.range(0, 300, 1, 2).selectExpr("id as n").write.json(str(source / "a"))
    asyncio.run(_create(fs_queue, "out"))

    def run(attempts_failing: int) -> None:
        df = spark.readStream.schema("n long").json(str(source / "*"))
        # The other task's objects land before the failure: on a busy machine the job's
        # abort could otherwise cancel that task before it wrote any.
        fail = _fail_midway(tmp_path, 250, attempts_failing, after_objects_in=fs_queue.tmp)
        n = fail("n").alias("n")
        query = (
            df.select(functions.to_json(functions.struct(n)).alias("payload"))
            .writeStream.format("pawnqueue")
            .options(**fs_queue.options)
            .option("topic", "out")
            .option("messagesPerObject", "10")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    with pytest.raises(StreamingQueryException, match="injected failure"):
        run(attempts_failing=2)  # both attempts of a task fail: the query stops
    assert asyncio.run(_messages(fs_queue, "out"))  # with part of the batch written
    run(attempts_failing=2)  # the restart runs the micro-batch again, into the same keys
    messages = asyncio.run(_messages(fs_queue, "out"))
    assert sorted(m["n"] for m in messages) == list(range(300))  # type: ignore[type-var]

    # Consumers take everything; then Spark runs the last micro-batch once more.
    assert len(asyncio.run(_consume_all(fs_queue, "out"))) == 300
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run(attempts_failing=0)
    assert asyncio.run(_messages(fs_queue, "out")) == []  # nothing was written twice

    spark.range(300, 310, 1, 1).selectExpr("id as n").write.json(str(source / "b"))
    run(attempts_failing=0)
    assert sorted(m["n"] for m in asyncio.run(_messages(fs_queue, "out"))) == list(range(300, 310))  # type: ignore[type-var]


def test_batch_write_with_a_write_id_is_idempotent(
    spark: SparkSession, fs_queue: SparkQueue
) -> None:
    """foreachBatch's way to exactly-once: the same (writeId, batchId) writes its rows once,
    even after consumers took them."""
    asyncio.run(_create(fs_queue, "out"))
    df = spark.range(0, 30, 1, 3).select(
        functions.to_json(functions.struct(functions.col("id").alias("n"))).alias("payload")
    )

    def write(batch_id: int) -> None:
        df.write.format("pawnqueue").options(**fs_queue.options).option("topic", "out").option(
            "writeId", "job"
        ).option("batchId", str(batch_id)).mode("append").save()

    write(7)
    assert sorted(p["n"] for p in asyncio.run(_consume_all(fs_queue, "out"))) == list(range(30))  # type: ignore[index]
    write(7)
    assert asyncio.run(_messages(fs_queue, "out")) == []
    write(8)
    assert len(asyncio.run(_messages(fs_queue, "out"))) == 30
