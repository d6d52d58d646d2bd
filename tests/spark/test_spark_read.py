"""Batch reads: snapshots of pending messages and of dead letters, claiming nothing."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import DataFrame, SparkSession

from pawn_queue import PawnQueue
from pawn_queue.config import load_config
from tests.helpers.spark_helpers import SparkQueue, publish, remaining

pytest_plugins = ["tests.helpers.spark_support"]

# Spark runs alone, after the others (make pytest): Spark's Python workers must connect back
# within Spark's own 10 s, which a machine saturated by pytest workers misses.
pytestmark = pytest.mark.alone


async def _take(sq: SparkQueue, topic: str, ack: int, nack: int) -> list[str]:
    """A consumer polls 10 messages, acks and nacks some and keeps the rest leased (it
    releases them on teardown, which the snapshot taken before does not care about)."""
    async with sq.queue() as pq:
        consumer = await pq.register_consumer("reader", topics=[topic])
        messages = await consumer.poll()
        for message in messages[:ack]:
            await message.ack()
        for message in messages[ack : ack + nack]:
            await message.nack()
        return [m.id for m in messages[:ack]]


def test_snapshots(spark: SparkSession, spark_queue: SparkQueue) -> None:
    ids = asyncio.run(publish(spark_queue, "jobs", 30, batches=[25]))
    acked = asyncio.run(_take(spark_queue, "jobs", ack=2, nack=3))

    def reader(**options: str) -> DataFrame:
        return spark.read.format("pawnqueue").options(**spark_queue.options, **options).load()

    rows = reader(topic="jobs").collect()
    assert len(rows) == len(ids) - 5
    assert {r.id for r in rows} <= set(ids) - set(acked)
    assert all(r.topic == "jobs" and r.attributes == {} for r in rows)
    assert sorted(json.loads(r.payload)["n"] for r in rows if r.key.endswith(".batch")) == list(
        range(30, 55)
    )

    dead = reader(topic="jobs", state="dead_letter").collect()
    assert len(dead) == 3 and {r.reason for r in dead} == {"nack"}
    assert all(r.dead_lettered_at is not None and r.receive_count == 1 for r in dead)

    # Reading claimed nothing: every pending message is still there and free.
    assert len(asyncio.run(remaining(spark_queue, "jobs/messages/"))) == 30 - 5 + 1
    assert asyncio.run(remaining(spark_queue, "jobs/leases/")) == []


def test_snapshot_of_several_topics_and_empty_ones(
    spark: SparkSession, fs_queue: SparkQueue
) -> None:
    asyncio.run(publish(fs_queue, "a", 3))
    asyncio.run(publish(fs_queue, "b", 0, batches=[4]))
    asyncio.run(publish(fs_queue, "c", 0))

    def reader(**options: str) -> DataFrame:
        return spark.read.format("pawnqueue").options(**fs_queue.options, **options).load()

    counts = reader(topics="a, b,c").groupBy("topic").count().collect()
    assert {row.topic: row["count"] for row in counts} == {"a": 3, "b": 4}
    assert reader(topic="c").count() == 0
    with pytest.raises(Exception, match="topic 'd' does not exist"):
        reader(topics="a,d")


def test_a_snapshot_leaves_out_messages_past_their_own_expiry(
    spark: SparkSession, fs_queue: SparkQueue
) -> None:
    async def main() -> list[str]:
        config = load_config(fs_queue.config, environ={})
        a_minute_ago = datetime.now(UTC) - timedelta(seconds=60)
        async with (
            PawnQueue(config, clock=lambda: a_minute_ago) as earlier,
            fs_queue.queue() as now,
        ):
            await now.create_topic("t")
            old = await earlier.register_producer("old")
            await old.publish("t", 1, expires_in=10)
            await old.publish_batch("t", [2, 3], expires_in=10)
            producer = await now.register_producer("new")
            return [
                await producer.publish("t", 4, expires_in=600),
                await producer.publish("t", 5),
                *await producer.publish_batch("t", [6], expires_in=600),
            ]

    live = asyncio.run(main())
    rows = spark.read.format("pawnqueue").options(**fs_queue.options, topic="t").load().collect()
    assert sorted(row.id for row in rows) == sorted(live)


_COLUMNS = [
    "id",
    "topic",
    "key",
    "producer_id",
    "created_at",
    "payload",
    "attributes",
    "receive_count",
]


def test_rows_say_their_priority(spark: SparkSession, fs_queue: SparkQueue) -> None:
    """Each row has the priority its message was published with (a group's too, whose key
    has no band; a dead letter's), in the last column; ordered by key, a topic's rows come
    as a consumer lists them: highest priority first."""

    async def main() -> dict[str, int]:
        async with fs_queue.queue() as pq:
            for topic in ("t", "dl"):
                await pq.create_topic(topic)
            producer = await pq.register_producer("p")
            published = {await producer.publish("t", "low"): 0}
            published[await producer.publish("t", "urgent", priority=9)] = 9
            for message_id in await producer.publish_batch("t", [1, 2], priority=5):
                published[message_id] = 5
            published[await producer.publish("t", "grouped", group="g", priority=3)] = 3
            await producer.publish("dl", "failed", priority=7)
            consumer = await pq.register_consumer("c", topics=["dl"])
            (message,) = await consumer.poll()
            await message.nack()
            return published

    published = asyncio.run(main())

    def reader(**options: str) -> DataFrame:
        return spark.read.format("pawnqueue").options(**fs_queue.options, **options).load()

    pending = reader(topic="t")
    assert pending.columns == [*_COLUMNS, "priority"]  # earlier columns keep their place
    rows = pending.orderBy("key").collect()
    assert {row.id: row.priority for row in rows} == published
    grouped = [row.id for row in rows if row.payload == '"grouped"']
    assert [row.priority for row in rows if row.id not in grouped] == [9, 5, 5, 0]

    dead = reader(topic="dl", state="dead_letter")
    assert dead.columns == [*_COLUMNS, "reason", "error", "dead_lettered_at", "priority"]
    assert [(row.reason, row.priority) for row in dead.collect()] == [("nack", 7)]
