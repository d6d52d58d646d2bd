"""Streaming reads into Parquet are exactly-once: N messages in, N rows out, whatever happens
to the query (a clean run, a restart, kill -9 of its driver, failing tasks), and a consumer
competing for the same topic never gets what the query committed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession, functions
from pyspark.sql.types import StringType

from pawn_queue import PawnQueue
from pawn_queue.config import load_config
from tests.helpers.spark_helpers import (
    SparkQueue,
    parquet_ids,
    publish,
    remaining,
    stream,
    to_parquet,
    wait_for_rows,
)

pytest_plugins = ["tests.helpers.spark_support"]

# Spark runs alone, after the others (make pytest): Spark's Python workers must connect back
# within Spark's own 10 s, which a machine saturated by pytest workers misses.
pytestmark = pytest.mark.alone


REPO = Path(__file__).resolve().parents[2]
TOPIC = "orders"


def assert_drained(sq: SparkQueue) -> None:
    """No message, lease or manifest is left behind."""
    assert asyncio.run(remaining(sq, f"{TOPIC}/messages/")) == []
    assert asyncio.run(remaining(sq, f"{TOPIC}/leases/")) == []
    assert [k for k in asyncio.run(remaining(sq, "_spark/")) if "/batches/" in k] == []


async def _publish_expired_and_urgent(sq: SparkQueue) -> str:
    """Three messages past their own expiry (a one-message object, a batch object), and one
    of priority 9; returns its id."""
    a_minute_ago = datetime.now(UTC) - timedelta(seconds=60)
    async with PawnQueue(load_config(sq.config, environ={}), clock=lambda: a_minute_ago) as pq:
        old = await pq.register_producer("old")
        await old.publish(TOPIC, "expired", expires_in=10)
        await old.publish_batch(TOPIC, ["expired"] * 2, expires_in=10)
    async with sq.queue() as pq:
        return await (await pq.register_producer("p")).publish(TOPIC, {"n": -1}, priority=9)


def test_clean_run(spark: SparkSession, spark_queue: SparkQueue, tmp_path: Path) -> None:
    ids = asyncio.run(publish(spark_queue, TOPIC, 150, batches=[100, 60]))
    urgent = asyncio.run(_publish_expired_and_urgent(spark_queue))
    query = to_parquet(
        stream(spark, spark_queue.read_options(topic=TOPIC)), tmp_path / "out", tmp_path / "ck"
    )
    query.awaitTermination()
    assert sorted(parquet_ids(spark, tmp_path / "out")) == sorted([*ids, urgent])  # no expired
    assert_drained(spark_queue)  # the commit removed the expired messages with their objects
    out = spark.read.parquet(str(tmp_path / "out"))
    row = out.where("key like '%.batch'").first()
    assert row is not None and row.topic == TOPIC and row.receive_count == 1
    assert json.loads(row.payload)["n"] >= 150 and row.created_at.year >= 2024
    assert {(r.id, r.priority) for r in out.where("priority > 0").collect()} == {(urgent, 9)}


def test_restart_with_new_messages(
    spark: SparkSession, spark_queue: SparkQueue, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    options = spark_queue.read_options(topic=TOPIC, maxMessagesPerTrigger="40")
    first = asyncio.run(publish(spark_queue, TOPIC, 100))
    query = to_parquet(stream(spark, options), out, checkpoint, available_now=False)
    wait_for_rows(spark, query, out, len(first))
    assert all(p["numInputRows"] <= 40 for p in query.recentProgress)
    query.stop()

    second = asyncio.run(publish(spark_queue, TOPIC, 50, batches=[70], start=100))
    query = to_parquet(stream(spark, options), out, checkpoint)
    query.awaitTermination()
    assert sorted(parquet_ids(spark, out)) == sorted(first + second)
    # At most 40 per micro-batch, except a batch object, which is never split.
    assert sorted(p["numInputRows"] for p in query.recentProgress if p["numInputRows"])[-1] == 70
    assert_drained(spark_queue)


def _read_line(path: Path, timeout: float) -> str:
    """The first line written to the FIFO at ``path`` (raises on timeout)."""
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.append(path.open().readline()), daemon=True, name="fifo"
    )
    reader.start()
    reader.join(timeout)
    if not lines:
        raise AssertionError(f"nothing on {path} after {timeout} s")
    return lines[0]


@pytest.mark.timeout(400)
def test_driver_killed_mid_batch(
    spark: SparkSession, spark_queue: SparkQueue, tmp_path: Path
) -> None:
    out, checkpoint, fifo = tmp_path / "out", tmp_path / "ck", tmp_path / "fifo"
    os.mkfifo(fifo)
    first = asyncio.run(publish(spark_queue, TOPIC, 80, batches=[40]))
    args = {
        "options": spark_queue.read_options(topic=TOPIC),
        "out": str(out),
        "checkpoint": str(checkpoint),
        "fifo": str(fifo),
    }
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.spark_query_proc", json.dumps(args)],
        cwd=REPO,
        env=env,
        start_new_session=True,  # its JVM and Python workers share the process group
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _read_line(fifo, 240) == "started\n"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert len(asyncio.run(remaining(spark_queue, "_spark/"))) >= 1  # its manifest

    second = asyncio.run(publish(spark_queue, TOPIC, 30, start=1000))
    query = to_parquet(stream(spark, spark_queue.read_options(topic=TOPIC)), out, checkpoint)
    query.awaitTermination()
    assert sorted(parquet_ids(spark, out)) == sorted(first + second)
    assert_drained(spark_queue)


def _failing_udf(markers: Path, attempts: int):  # type: ignore[no-untyped-def]
    """A UDF that fails in partition 0 for the first ``attempts`` task attempts, once."""

    def fail_first(payload):  # no type hints: they would make it a pandas UDF
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        attempt = context.attemptNumber()
        if context.partitionId() == 0 and attempt < attempts:
            try:
                os.close(os.open(markers / f"fail-{attempt}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return payload
            raise RuntimeError(f"injected failure, attempt {attempt}")
        return payload

    return functions.udf(fail_first, StringType())


@pytest.mark.parametrize("failed_attempts", [1, 2], ids=["task-retried", "batch-failed"])
def test_task_failure(
    spark: SparkSession,
    spark_queue: SparkQueue,
    tmp_path: Path,
    failed_attempts: int,
) -> None:
    if failed_attempts == 1 and "config" in spark_queue.options:
        pytest.skip("the retried task is store-independent; covered on the filesystem")
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    ids = asyncio.run(publish(spark_queue, TOPIC, 120, batches=[50]))
    udf = _failing_udf(tmp_path, failed_attempts)
    df = stream(spark, spark_queue.read_options(topic=TOPIC))
    query = to_parquet(df.withColumn("payload", udf("payload")), out, checkpoint)
    if failed_attempts == 2:
        # Both attempts of a task failed: the micro-batch and the query fail. A restart
        # replays the same manifest.
        with pytest.raises(StreamingQueryException, match="injected failure"):
            query.awaitTermination()
        assert parquet_ids(spark, out) == []
        query = to_parquet(df.withColumn("payload", udf("payload")), out, checkpoint)
    query.awaitTermination()
    assert sorted(parquet_ids(spark, out)) == sorted(ids)
    assert_drained(spark_queue)


def test_competing_consumer_never_gets_committed_messages(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    ids = asyncio.run(publish(fs_queue, TOPIC, 400))
    options = fs_queue.read_options(topic=TOPIC, maxMessagesPerTrigger="25")
    query = to_parquet(stream(spark, options), out, checkpoint, available_now=False)
    wait_for_rows(spark, query, out, 1)  # the query runs; now a consumer joins

    consumed: list[str] = []
    stop = threading.Event()

    async def consume() -> None:
        async with fs_queue.queue() as pq:
            consumer = await pq.register_consumer("rival", topics=[TOPIC])
            while not stop.is_set():
                for message in await consumer.poll(wait=0.2):
                    consumed.append(message.id)
                    await message.ack()

    rival = threading.Thread(target=lambda: asyncio.run(consume()), name="rival")
    rival.start()
    try:
        while len(set(parquet_ids(spark, out)) | set(consumed)) < len(ids):
            assert query.exception() is None
            query.awaitTermination(0.3)
    finally:
        stop.set()
        rival.join()
    query.stop()
    by_query = parquet_ids(spark, out)
    assert consumed and by_query  # both got a share
    assert len(by_query) == len(set(by_query)) and len(consumed) == len(set(consumed))
    assert not set(by_query) & set(consumed)
    assert sorted(by_query + consumed) == sorted(ids)


def test_idle_query_picks_up_new_messages(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    """A running query notices new messages by the change signal, long before the backfill
    poll (notify.backfill_interval_seconds, 60 s by default) would."""
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    asyncio.run(publish(fs_queue, TOPIC, 1))
    query = to_parquet(
        stream(spark, fs_queue.read_options(topic=TOPIC)), out, checkpoint, available_now=False
    )
    wait_for_rows(spark, query, out, 1)
    ids = asyncio.run(publish(fs_queue, TOPIC, 5, start=1))
    wait_for_rows(spark, query, out, 6, timeout=30)
    query.stop()
    assert set(ids) <= set(parquet_ids(spark, out))


def test_query_start_errors(spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"store root .+ does not exist"):  # nothing written yet
        stream(spark, fs_queue.read_options(topic=TOPIC))
    asyncio.run(publish(fs_queue, TOPIC, 0))
    with pytest.raises(Exception, match="topic 'missing' does not exist"):
        stream(spark, fs_queue.read_options(topic="missing"))
    with pytest.raises(Exception, match="needs option 'topic'"):
        stream(spark, fs_queue.read_options())
    with pytest.raises(Exception, match="unknown option 'maxmessagespertriger'"):
        stream(spark, fs_queue.read_options(topic=TOPIC, maxMessagesPerTriger="5"))
    closed = "s3://bucket?endpoint_url=http://127.0.0.1:9&max_retries=0&retry_timeout_seconds=1"
    with pytest.raises(Exception, match=r"pawn_queue\.exceptions\.\w+: S3 list failed"):
        stream(spark, {"url": closed, "topic": TOPIC})
    asyncio.run(_create_topic(fs_queue, TOPIC))
    df = (
        spark.readStream.format("pawnqueue")
        .schema("x int")
        .options(**fs_queue.read_options(topic=TOPIC))
        .load()
    )
    with pytest.raises(Exception, match="fixed schema"):
        to_parquet(df, tmp_path / "out", tmp_path / "ck").awaitTermination()


async def _create_topic(sq: SparkQueue, topic: str) -> None:
    async with sq.queue() as pq:
        await pq.create_topic(topic)
