"""Subscriptions through Spark: option ``subscription`` reads one subscription of the topics
(batch and streaming, exactly once beside the consumers of other subscriptions), the sink
delivers to a topic's subscriptions as a producer does (filters included, a retried task
adds no copy), and a subscription that is not there fails the query at its start."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame, SparkSession, functions
from pyspark.sql.types import LongType

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import decode_batch, now_utc
from pawn_queue.config import load_config
from tests.helpers.spark_helpers import (
    SparkQueue,
    parquet_ids,
    publish,
    remaining,
    stream,
    to_parquet,
)

pytest_plugins = ["tests.helpers.spark_support"]

# Spark runs alone, after the others (make pytest): Spark's Python workers must connect back
# within Spark's own 10 s, which a machine saturated by pytest workers misses.
pytestmark = pytest.mark.alone

TOPIC = "orders"


async def subscribe(sq: SparkQueue, topic: str, filters: dict[str, Any]) -> None:
    """Create ``topic`` and its subscriptions (name -> filter), all at once: each creation
    returns once every later publish copies to it."""
    async with sq.queue() as pq:
        await pq.create_topic(topic)
        await asyncio.gather(
            *(pq.create_subscription(topic, name, filter=f) for name, f in filters.items())
        )


def queue_of(topic: str, subscription: str | None) -> str:
    return topic if subscription is None else layout.subscription_queue(topic, subscription)


async def stored(sq: SparkQueue, queue: str) -> list[dict[str, Any]]:
    """Every message waiting in ``queue``: its id, payload, attributes and object key."""
    async with sq.queue() as pq:
        out = []
        for meta in await pq.store.list(layout.messages_prefix(queue)):
            data = (await pq.store.get(meta.key)).data
            if meta.key.endswith(".batch"):
                members = [(m.id, m.payload, m.attributes) for m in decode_batch(data)]
            else:
                body = json.loads(data)
                members = [(body["id"], body["payload"], body.get("attributes") or {})]
            out += [
                {"id": i, "payload": p, "attributes": a, "key": meta.key} for i, p, a in members
            ]
        return out


async def consume_all(sq: SparkQueue, topic: str, subscription: str) -> list[Any]:
    """The payloads a consumer of the subscription takes (and acks) until it is empty."""
    async with sq.queue() as pq:
        consumer = await pq.register_consumer(
            f"drain-{subscription}", topics=[topic], subscription=subscription
        )
        payloads = []
        while batch := await consumer.poll(wait=1.0):
            for message in batch:
                assert (message.topic, message.subscription) == (topic, subscription)
                payloads.append(message.payload)
                await message.ack()
        return payloads


class Consumer(threading.Thread):
    """A plain consumer of one subscription, in a thread of its own while Spark runs: it
    acks every message it gets and records its id."""

    def __init__(self, sq: SparkQueue, topic: str, subscription: str) -> None:
        super().__init__(name=f"consumer-{subscription}", daemon=True)
        self._sq, self._topic, self._subscription = sq, topic, subscription
        self.ids: list[str] = []
        self.error: BaseException | None = None
        self._got = threading.Condition()
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._consume())
        except BaseException as exc:
            self.error = exc
        finally:
            with self._got:
                self._got.notify_all()

    async def _consume(self) -> None:
        async with self._sq.queue() as pq:
            consumer = await pq.register_consumer(
                "audit-service", topics=[self._topic], subscription=self._subscription
            )
            while not self._stopping.is_set():
                for message in await consumer.poll(wait=0.2):
                    await message.ack()
                    with self._got:
                        self.ids.append(message.id)
                        self._got.notify_all()

    def wait_for(self, count: int, timeout: float = 120) -> None:
        with self._got:
            got = self._got.wait_for(
                lambda: len(self.ids) >= count or self.error is not None or not self.is_alive(),
                timeout,
            )
        assert self.error is None, self.error
        assert got and len(self.ids) >= count, f"{len(self.ids)} of {count} after {timeout} s"

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)
        assert not self.is_alive() and self.error is None, self.error


def test_a_query_reads_its_subscription_beside_a_consumer_of_another(
    spark: SparkSession, spark_queue: SparkQueue, tmp_path: Path
) -> None:
    """Every message published after the subscriptions exist reaches the query once (through
    ``billing``) and the consumer once (through ``audit``); what the topic held before stays
    in its own queue, untouched by both."""
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    before = asyncio.run(publish(spark_queue, TOPIC, 4))  # the topic's own queue
    asyncio.run(subscribe(spark_queue, TOPIC, {"billing": None, "audit": None}))
    first = asyncio.run(publish(spark_queue, TOPIC, 60, batches=[40], start=100))

    # A batch read of the subscription: a snapshot, claiming nothing.
    options = spark_queue.read_options(topic=TOPIC, subscription="billing")
    rows = spark.read.format("pawnqueue").options(**options).load().collect()
    assert sorted(r.id for r in rows) == sorted(first)
    assert {r.topic for r in rows} == {TOPIC}  # the user's topic, not the subscription's queue
    assert all(layout.queue_of(r.key) == layout.subscription_queue(TOPIC, "billing") for r in rows)

    audit = Consumer(spark_queue, TOPIC, "audit")
    audit.start()
    try:
        limited = {**options, "maxMessagesPerTrigger": "30"}
        to_parquet(stream(spark, limited), out, checkpoint).awaitTermination()
        assert sorted(parquet_ids(spark, out)) == sorted(first)
        # New messages, and the query again on its checkpoint.
        second = asyncio.run(publish(spark_queue, TOPIC, 30, batches=[20], start=1000))
        query = to_parquet(stream(spark, limited), out, checkpoint)
        query.awaitTermination()
        assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 2
        audit.wait_for(len(first + second))
    finally:
        audit.stop()

    by_query = parquet_ids(spark, out)
    assert sorted(by_query) == sorted(first + second)  # each once: no copy, no loss
    assert sorted(audit.ids) == sorted(first + second)
    row = spark.read.parquet(str(out)).where("key like '%.batch'").first()
    assert row is not None and row.topic == TOPIC and row.receive_count == 1
    for subscription in ("billing", "audit"):
        queue = layout.subscription_queue(TOPIC, subscription)
        assert asyncio.run(remaining(spark_queue, layout.messages_prefix(queue))) == []
    assert [k for k in asyncio.run(remaining(spark_queue, "_spark/")) if "/batches/" in k] == []
    assert sorted(m["id"] for m in asyncio.run(stored(spark_queue, TOPIC))) == sorted(before)


def test_dead_letters_of_a_subscription(spark: SparkSession, fs_queue: SparkQueue) -> None:
    asyncio.run(subscribe(fs_queue, TOPIC, {"billing": None, "audit": None}))
    ids = asyncio.run(publish(fs_queue, TOPIC, 3))

    async def nack_one() -> str:
        async with fs_queue.queue() as pq:
            consumer = await pq.register_consumer("billing", [TOPIC], subscription="billing")
            message = (await consumer.poll(wait=5))[0]
            await message.nack()
            await consumer.release_all()
            return message.id

    nacked = asyncio.run(nack_one())

    def read(**options: str) -> DataFrame:
        return spark.read.format("pawnqueue").options(**fs_queue.read_options(**options)).load()

    [row] = read(topic=TOPIC, subscription="billing", state="dead_letter").collect()
    assert (row.id, row.topic, row.reason) == (nacked, TOPIC, "nack")
    assert read(topic=TOPIC, subscription="audit", state="dead_letter").count() == 0
    pending = read(topic=TOPIC, subscription="audit").collect()
    assert sorted(r.id for r in pending) == sorted(ids)
    assert read(topic=TOPIC).count() == 0  # the topic's own queue: nothing since


def fail_midway(markers: Path, at: int):  # type: ignore[no-untyped-def]
    """A UDF that fails at row ``at`` in the first attempt of its task, once."""

    def identity(n):  # no type hints: they would make it a pandas UDF
        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        if n == at and attempt == 0:
            try:
                os.close(os.open(markers / "failed", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return n
            raise RuntimeError("injected failure after some objects were written")
        return n

    return functions.udf(identity, LongType())


def region(n: Column) -> Column:
    """Attribute ``region``: ``eu`` for every third row, ``us`` for the others but every
    fifth, which has no attributes."""
    return (
        functions.when(
            n % 3 == 0, functions.create_map(functions.lit("region"), functions.lit("eu"))
        )
        .when(n % 5 == 0, functions.lit(None).cast("map<string,string>"))
        .otherwise(functions.create_map(functions.lit("region"), functions.lit("us")))
    )


def expected_regions(rows: range) -> tuple[list[int], list[int]]:
    """The rows every subscription takes, and the rows whose region is ``eu``."""
    return list(rows), [n for n in rows if n % 3 == 0]


def test_the_sink_delivers_to_every_subscription_its_filter_takes(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    """As a producer does: nothing in the topic's own queue, every row in ``all``, the eu
    rows in ``eu`` (the same message ids), and a task that failed midway and ran again
    leaves no copy in either."""
    asyncio.run(subscribe(fs_queue, "out", {"all": None, "eu": {"region": "eu"}}))
    df = spark.range(0, 600, 1, 2).select(fail_midway(tmp_path, 230)("id").alias("n"))
    rows = df.select(
        functions.to_json(functions.struct("n")).alias("payload"),
        region(functions.col("n")).alias("attributes"),
    )
    rows.write.format("pawnqueue").options(**fs_queue.options).option("topic", "out").option(
        "messagesPerObject", "50"
    ).mode("append").save()
    assert (tmp_path / "failed").exists()  # the first attempt failed midway, then ran again

    everything, eu = expected_regions(range(600))
    assert asyncio.run(stored(fs_queue, "out")) == []
    in_all = asyncio.run(stored(fs_queue, queue_of("out", "all")))
    in_eu = asyncio.run(stored(fs_queue, queue_of("out", "eu")))
    assert sorted(m["payload"]["n"] for m in in_all) == everything
    assert sorted(m["payload"]["n"] for m in in_eu) == eu
    assert all(m["attributes"] == {"region": "eu"} for m in in_eu)
    assert {m["attributes"].get("region") for m in in_all} == {"eu", "us", None}
    # The same messages: one id per row, in each subscription it goes to.
    ids = {m["payload"]["n"]: m["id"] for m in in_all}
    assert all(ids[m["payload"]["n"]] == m["id"] for m in in_eu)
    # 300 rows a partition, 50 an object: 12 objects, each copied under the same name into
    # every subscription that takes some of its rows (all of them take an eu row).
    keys_all = {m["key"] for m in in_all}
    keys_eu = {m["key"] for m in in_eu}
    assert len(keys_all) == 12
    assert {k.rpartition("/")[2] for k in keys_eu} == {k.rpartition("/")[2] for k in keys_all}

    # Consumers of each subscription take them as they would from a producer.
    assert sorted(p["n"] for p in asyncio.run(consume_all(fs_queue, "out", "eu"))) == eu
    assert sorted(p["n"] for p in asyncio.run(consume_all(fs_queue, "out", "all"))) == everything


def test_the_sink_sweeps_the_replay_log_of_a_topic_only_spark_writes(
    spark: SparkSession, fs_queue: SparkQueue
) -> None:
    """Spark jobs may be all that writes to a topic: the driver sweeps its replay log at
    the commit, as a producer would (an entry two hours old goes, the rows stay)."""

    async def publish_two_hours_ago() -> None:
        config = load_config(fs_queue.config, environ={})
        async with PawnQueue(config, clock=lambda: now_utc() - timedelta(hours=2)) as pq:
            await pq.create_topic("kept", replay_window_seconds=3600)
            await (await pq.register_producer("p")).publish("kept", {"n": -1})

    asyncio.run(publish_two_hours_ago())
    log = layout.retained_log("kept")
    assert [m["payload"] for m in asyncio.run(stored(fs_queue, log))] == [{"n": -1}]
    rows = spark.range(0, 10, 1, 2).select(
        functions.to_json(functions.struct(functions.col("id").alias("n"))).alias("payload")
    )
    rows.write.format("pawnqueue").options(**fs_queue.options).option("topic", "kept").mode(
        "append"
    ).save()
    kept = sorted(m["payload"]["n"] for m in asyncio.run(stored(fs_queue, log)))
    assert kept == list(range(10))


def test_a_streaming_write_delivers_to_the_subscriptions_once(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    """Each micro-batch reaches each subscription once, also when Spark runs it again after
    its commit (the checkpoint lost its commit entry): the sink's marker says it is done."""
    source, checkpoint = tmp_path / "source", tmp_path / "ck"
    spark.range(0, 90, 1, 2).selectExpr("id as n").write.json(str(source / "a"))
    asyncio.run(subscribe(fs_queue, "out", {"all": None, "eu": {"region": "eu"}}))

    def run() -> None:
        df = spark.readStream.schema("n long").json(str(source / "*"))
        payload = functions.to_json(functions.struct("n")).alias("payload")
        query = (
            df.select(payload, region(functions.col("n")).alias("attributes"))
            .writeStream.format("pawnqueue")
            .options(**fs_queue.options)
            .option("topic", "out")
            .option("messagesPerObject", "10")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    everything, eu = expected_regions(range(90))
    assert asyncio.run(stored(fs_queue, "out")) == []
    assert sorted(p["n"] for p in asyncio.run(consume_all(fs_queue, "out", "eu"))) == eu
    assert sorted(p["n"] for p in asyncio.run(consume_all(fs_queue, "out", "all"))) == everything

    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run()  # the last micro-batch once more: nothing is written again
    for subscription in ("all", "eu"):
        assert asyncio.run(stored(fs_queue, queue_of("out", subscription))) == []

    spark.range(90, 96, 1, 1).selectExpr("id as n").write.json(str(source / "b"))
    run()
    everything, eu = expected_regions(range(90, 96))
    assert sorted(p["n"] for p in asyncio.run(consume_all(fs_queue, "out", "eu"))) == eu
    assert sorted(p["n"] for p in asyncio.run(consume_all(fs_queue, "out", "all"))) == everything


def test_a_bad_subscription_option_fails_the_query_at_its_start(
    spark: SparkSession, fs_queue: SparkQueue, tmp_path: Path
) -> None:
    asyncio.run(subscribe(fs_queue, TOPIC, {"billing": None, "audit": None}))
    asyncio.run(publish(fs_queue, "other", 1))  # a topic without subscriptions

    def read(**options: str) -> DataFrame:
        return spark.read.format("pawnqueue").options(**fs_queue.read_options(**options)).load()

    missing = (
        r"subscription 'nope' of topic 'orders' does not exist "
        r"\(its subscriptions: 'audit', 'billing'"
    )
    with pytest.raises(Exception, match=missing):
        stream(spark, fs_queue.read_options(topic=TOPIC, subscription="nope"))
    with pytest.raises(Exception, match=missing):
        read(topic=TOPIC, subscription="nope")
    with pytest.raises(
        Exception,
        match=r"subscription 'billing' of topic 'other' does not exist \(its subscriptions: none",
    ):
        stream(spark, fs_queue.read_options(topics=f"{TOPIC},other", subscription="billing"))
    with pytest.raises(Exception, match="option 'subscription': empty"):
        stream(spark, fs_queue.read_options(topic=TOPIC, subscription=" "))
    with pytest.raises(Exception, match="pawnqueue option 'subscription' 'a/b' is invalid"):
        read(topic=TOPIC, subscription="a/b")
    # A write goes to the topic; its subscriptions take their copies from there.
    df = spark.range(1).select(functions.lit("{}").alias("payload"))
    with pytest.raises(Exception, match="option 'subscription' is for reads"):
        df.write.format("pawnqueue").options(**fs_queue.options).option("topic", TOPIC).option(
            "subscription", "billing"
        ).mode("append").save()
    # Nothing was claimed or written by the failed starts.
    assert asyncio.run(remaining(fs_queue, "_spark/")) == []
    assert asyncio.run(remaining(fs_queue, layout.leases_prefix(queue_of(TOPIC, "billing")))) == []
