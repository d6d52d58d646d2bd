"""A Spark pipeline on pawn-queue: orders in, revenue per item per minute and alerts out.

1. The topic ``orders`` has two subscriptions, ``service`` and ``revenue``: each receives
   every order, whatever the other does with it.
2. Producers publish orders to ``orders`` (single messages and batch objects).
3. The order service (plain consumers, in this process) takes every order of ``service``.
4. A structured-streaming query reads ``revenue`` (format ``pawnqueue``, option
   ``subscription``), parses the orders, and in each micro-batch writes the revenue per item
   per minute and the order ids to Parquet and the high-value orders to the topic ``alerts``.
   Its checkpoint makes it exactly-once: every write is idempotent per micro-batch (Parquet
   by directory, the topic by ``writeId``/``batchId``).
5. A consumer prints the alerts; the revenue table is read back and checked, and so is that
   the service and the query each got every order exactly once.

The query runs with Trigger.AvailableNow: it processes what is there and stops. With
``--rounds 2`` (the default) it runs twice on the same checkpoint, with new orders in between.

    python examples/orders_pipeline.py                      # local directory, local Spark
    python examples/orders_pipeline.py --url "s3://bucket/demo?endpoint_url=http://127.0.0.1:8333"
    spark-submit --master spark://host:7077 examples/orders_pipeline.py --url s3://... --out s3a://...

On a cluster, every node needs this package with the ``spark`` extra, the driver and the
executors need the store's credentials (``PAWNQUEUE_S3_AWS_ACCESS_KEY_ID`` and
``PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY``: the driver in its environment, executors e.g. via
spark.executorEnv.*), and ``--out`` must be a path every node can reach; an ``s3a://``
one needs Hadoop's S3A filesystem (``--packages org.apache.hadoop:hadoop-aws:<Hadoop
version>`` and ``spark.hadoop.fs.s3a.*``; see docs/spark/cluster.md).
The script checks that Spark can write ``--out`` before it publishes anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pawn_queue import Consumer, PawnQueue
from pawn_queue.cli.demo_dirs import claim_directory
from pawn_queue.spark import register

ITEMS = {"widget": 4.5, "gadget": 19.0, "gizmo": 7.25, "sprocket": 2.0, "flux-capacitor": 121.0}
ORDER_SCHEMA = "order_id long, customer string, item string, quantity int, price double"
SUBSCRIPTIONS = ("service", "revenue")  # of the topic orders: the service's, the query's


async def set_up(url: str) -> None:
    """The topics, and the subscriptions of ``orders`` (before any order is published: a
    subscription receives what is published after it was created)."""
    async with PawnQueue.from_url(url) as pq:
        await pq.create_topic("orders")
        await pq.create_topic("alerts")
        await asyncio.gather(*(pq.create_subscription("orders", name) for name in SUBSCRIPTIONS))


async def publish_orders(url: str, first: int, count: int, seed: int) -> float:
    """Two producers publish ``count`` orders; returns their total value."""
    rng = random.Random(seed)
    orders = []
    for order_id in range(first, first + count):
        item = rng.choice(list(ITEMS))
        orders.append(
            {
                "order_id": order_id,
                "customer": f"c{rng.randrange(50):02d}",
                "item": item,
                "quantity": rng.randint(1, 5),
                "price": ITEMS[item],
            }
        )
    async with PawnQueue.from_url(url) as pq:
        await pq.create_topic("orders")
        await pq.create_topic("alerts")
        web = await pq.register_producer("web-shop")
        partner = await pq.register_producer("partner-feed")
        half = len(orders) // 2
        # The web shop publishes one message per order; the partner feed sends batches.
        await asyncio.gather(*(web.publish("orders", order) for order in orders[:half]))
        for start in range(half, len(orders), 250):
            await partner.publish_batch("orders", orders[start : start + 250])
    return sum(o["quantity"] * o["price"] for o in orders)


class OrderService(threading.Thread):
    """The order service: consumers of the subscription ``service`` of ``orders``, running
    beside the Spark query in a thread of their own; each order it takes is acked and
    counted by id."""

    def __init__(self, url: str, workers: int = 2) -> None:
        super().__init__(name="order-service", daemon=True)
        self._url, self._workers = url, workers
        self.orders: Counter[int] = Counter()
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self.error = exc
        finally:
            with self._changed:
                self._changed.notify_all()

    async def _serve(self) -> None:
        async with PawnQueue.from_url(self._url) as pq:
            consumers = [
                await pq.register_consumer(f"order-service-{i}", ["orders"], subscription="service")
                for i in range(self._workers)
            ]
            await asyncio.gather(*(self._work(consumer) for consumer in consumers))

    async def _work(self, consumer: Consumer) -> None:
        while not self._stopping.is_set():
            for message in await consumer.poll(wait=0.5):
                await message.ack()  # the order is handled: shipped, say
                with self._changed:
                    self.orders[message.payload["order_id"]] += 1
                    self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 300) -> None:
        """Until it has taken ``count`` orders (raises on its error or the timeout)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self.orders.total() >= count or not self.is_alive(), timeout
            )
        if self.error is not None:
            raise SystemExit(f"the order service failed: {self.error!r}")
        if self.orders.total() < count:
            raise SystemExit(f"the order service took {self.orders.total()} of {count} orders")

    def stop(self) -> None:
        self._stopping.set()
        self.join()


async def print_alerts(url: str) -> int:
    """A plain consumer takes the alerts the pipeline published."""
    count = 0
    async with PawnQueue.from_url(url) as pq:
        consumer = await pq.register_consumer("alert-printer", topics=["alerts"])
        while messages := await consumer.poll(wait=1.0):
            for message in messages:
                alert = message.payload
                if count < 5:
                    print(
                        f"  ALERT order {alert['order_id']}: {alert['customer']} spent "
                        f"{alert['total']:.2f} on {alert['quantity']} x {alert['item']}"
                    )
                count += 1
                await message.ack()
    if count > 5:
        print(f"  ... and {count - 5} more")
    return count


def spark_session(master: str | None) -> SparkSession:
    """The session spark-submit configured, or a local one when run with plain python."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("orders-pipeline")
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master(master or "local[2]")
    spark = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    print(f"spark master: {spark.sparkContext.master}")
    return spark


def check_output(spark: SparkSession, out: str) -> None:
    """Exit, before anything is published, when Spark has no filesystem for ``out``'s scheme.

    A pip-installed PySpark has none for ``s3a://`` (Hadoop's hadoop-aws is not in the wheel);
    without this check the first round would publish and only the query would fail.
    """
    scheme = urlsplit(out).scheme.lower()
    if "://" not in out or scheme in ("", "file"):
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop = jvm.org.apache.hadoop
    try:
        # Resolves the class from fs.<scheme>.impl without creating or contacting anything.
        hadoop.fs.FileSystem.getFileSystemClass(scheme, spark._jsc.hadoopConfiguration())
    except Py4JJavaError:  # its Java stack trace says no more than the message below
        version = hadoop.util.VersionInfo.getVersion()
        missing = (
            "org.apache.hadoop.fs.s3a.S3AFileSystem"
            if scheme == "s3a"
            else f"a filesystem for {scheme}://"
        )
        hint = (
            f"add it with --packages org.apache.hadoop:hadoop-aws:{version} (the Hadoop of this "
            "Spark; --packages also fetches the AWS SDK) and set spark.hadoop.fs.s3a.endpoint, "
            "spark.hadoop.fs.s3a.path.style.access and the credentials"
            if scheme == "s3a"
            else "add the jars of that filesystem to Spark (--packages or spark.jars.packages)"
        )
        raise SystemExit(
            f"--out {out}: Spark cannot write there, {missing} is not available: {hint}; "
            "nothing was published"
        ) from None


def run_query(spark: SparkSession, url: str, out: str, threshold: float) -> None:
    orders = (
        spark.readStream.format("pawnqueue")
        .option("url", url)
        .option("topic", "orders")
        .option("subscription", "revenue")
        .option("maxMessagesPerTrigger", "2000")
        .load()
        .select(F.from_json("payload", ORDER_SCHEMA).alias("o"), "created_at")
        .select("o.*", "created_at")
        .withColumn("total", F.col("quantity") * F.col("price"))
    )

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        revenue = batch.groupBy(F.date_trunc("minute", "created_at").alias("minute"), "item").agg(
            F.sum("total").alias("revenue"), F.count("*").alias("orders")
        )
        # A micro-batch run again (after a failure) overwrites its own directories...
        revenue.write.mode("overwrite").parquet(f"{out}/revenue/batch={batch_id}")
        batch.select("order_id").write.mode("overwrite").parquet(f"{out}/orders/batch={batch_id}")
        alerts = batch.where(F.col("total") >= threshold).select(
            F.to_json(F.struct("order_id", "customer", "item", "quantity", "total")).alias(
                "payload"
            )
        )
        # ... and publishes its alerts once: same writeId and batchId, same messages.
        (
            alerts.write.format("pawnqueue")
            .option("url", url)
            .option("topic", "alerts")
            .option("writeId", "orders-pipeline")
            .option("batchId", str(batch_id))
            .mode("append")
            .save()
        )
        batch.unpersist()

    query = (
        orders.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", f"{out}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def reset(url: str, out: str) -> None:
    """Clear what an earlier run wrote in its local directories, and nothing else (a
    directory this pipeline did not make is refused: see pawn_queue.cli.demo_dirs)."""
    parts = urlsplit(url)
    if parts.scheme != "file" or "://" in out:
        raise SystemExit("--reset only deletes local directories (a file:// URL and a local --out)")
    queue = ("orders", "alerts", "_registry", "_notify", "_spark", "_probe", ".pawnqueue")
    claim_directory(Path(parts.netloc + parts.path).expanduser(), queue, "orders_pipeline.py")
    claim_directory(
        Path(out).expanduser(), ("revenue", "orders", "checkpoint"), "orders_pipeline.py"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="file://./pipeline-demo", help="store URL")
    parser.add_argument("--out", default="./pipeline-demo-out", help="Parquet and checkpoint")
    parser.add_argument("--orders", type=int, default=3000, help="orders per round")
    parser.add_argument("--rounds", type=int, default=2, help="query runs on one checkpoint")
    parser.add_argument("--threshold", type=float, default=400.0, help="alert at this total")
    parser.add_argument("--reset", action="store_true", help="delete local state first")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[2])")
    args = parser.parse_args()
    if args.reset:
        reset(args.url, args.out)

    spark = spark_session(args.master)
    check_output(spark, args.out)
    asyncio.run(set_up(args.url))
    service = OrderService(args.url)
    service.start()
    published, value, alerts = 0, 0.0, 0
    try:
        for round_ in range(1, args.rounds + 1):
            value += asyncio.run(publish_orders(args.url, published, args.orders, seed=round_))
            published += args.orders
            print(f"round {round_}: published {args.orders} orders ({published} in all)")
            run_query(spark, args.url, args.out, args.threshold)
            service.wait_for(published)
            print(f"round {round_}: the order service took {service.orders.total()} orders")
            alerts += asyncio.run(print_alerts(args.url))
    finally:
        service.stop()

    revenue = (
        spark.read.parquet(f"{args.out}/revenue")
        .groupBy("minute", "item")
        .agg(F.sum("revenue").alias("revenue"), F.sum("orders").alias("orders"))
        .orderBy("minute", F.desc("revenue"))
    )
    revenue.show(10, truncate=False)
    totals = revenue.agg(F.sum("orders"), F.sum("revenue")).first()
    assert totals is not None
    counted, summed = int(totals[0] or 0), float(totals[1] or 0.0)
    # Which orders each subscription delivered, and how often: the ids the query wrote, and
    # the ones the service took.
    ids = spark.read.parquet(f"{args.out}/orders").agg(
        F.count("*"), F.countDistinct("order_id"), F.min("order_id"), F.max("order_id")
    )
    row = ids.first()
    assert row is not None
    every = {"orders": published, "distinct": published, "first": 0, "last": published - 1}
    received = {
        "service": {
            "orders": service.orders.total(),
            "distinct": len(service.orders),
            "first": min(service.orders, default=None),
            "last": max(service.orders, default=None),
        },
        "revenue": dict(zip(("orders", "distinct", "first", "last"), row, strict=True)),
    }
    print(
        json.dumps(
            {
                "orders_published": published,
                "orders_in_revenue_table": counted,
                "revenue": round(summed, 2),
                "expected_revenue": round(value, 2),
                "alerts_received": alerts,
                "subscriptions": received,
            }
        )
    )
    spark.stop()
    if counted != published or abs(summed - value) > 0.01:
        raise SystemExit("the revenue table does not match what was published")
    for name, got in received.items():
        if got != every:
            raise SystemExit(f"subscription {name!r} did not get every order exactly once: {got}")
    print("exactly once: every order counted once")
    print(
        "checked: each subscription of orders got every order exactly once ("
        + ", ".join(f"{name}: {got['distinct']} of {published}" for name, got in received.items())
        + ")"
    )


if __name__ == "__main__":
    main()
