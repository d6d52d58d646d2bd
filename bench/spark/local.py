"""Spark throughput: rows/s through the pawnqueue streaming source and sink, beside
``spark.read.json`` over the same objects (the native baseline), on local[2].

Every case runs on the local-directory store (``spark.read.json`` reads those files
directly). Messages are small orders (payloads of about 60 bytes of JSON). Cases:

- ``source``: a streaming query (Trigger.AvailableNow into the ``noop`` sink) that claims,
  reads and acks every message: one message per object, and batch objects of 1,000.
  ``rows_per_s`` includes starting and stopping the query; ``micro_batch_rows_per_s`` is
  what its micro-batches sustain (Spark's triggerExecution time), i.e. a running query.
- ``read.json``: ``spark.read.json`` over the same objects before the query consumes them
  (batch objects: ``multiLine`` and an explode of their members), with the schema given.
- ``snapshot``: the pawnqueue batch read of the same objects (claims nothing).
- ``sink``: ``df.write.format("pawnqueue")`` with ``messagesPerObject`` 1 and 1,000.

Each of ``--runs`` runs (default 3) publishes fresh objects and measures every case on them
in the same session, after a warm-up of every case; the summary holds the medians, and the
ratios source / read.json are taken within each run, then their medians.
Starting a streaming query costs about a second whatever it reads (Spark starts a Python
process for the query's driver side), so the ratio with query start grows with the number
of messages read; the micro-batch ratio does not.

Run from the repository root (JSON to bench/results/spark.json)::

    python -m bench.spark.local
    python -m bench.spark.local --singles 500 --batched 100000 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from tests.helpers.spark_helpers import local_spark

from bench.common import REPO, RESULTS, host_report, write_results
from pawn_queue import PawnQueue, PawnQueueConfig

ENVELOPE = "id string, topic string, producer_id string, created_at string, payload string"
BATCH = "id string, topic string, producer_id string, created_at string, batch array<string>"
TARGET_SOURCE_BATCHED = 50_000.0
TARGET_RATIO_BATCHED = 5.0
BATCHED = "batch objects of 1000"
SINGLES = "one message per object"


def order(n: int) -> dict[str, Any]:
    return {"order_id": n, "customer": f"c{n % 97:02d}", "item": "widget", "qty": 1 + n % 5}


async def publish(url: str, topic: str, count: int, per_object: int) -> None:
    # Group commit off: concurrent singles stay one-message objects (what read.json expects).
    config = PawnQueueConfig.from_url(url, producer={"group_commit": False})
    async with PawnQueue(config) as pq:
        await pq.create_topic(topic)
        producer = await pq.register_producer("bench")
        semaphore = asyncio.Semaphore(64)

        async def one(start: int) -> None:
            async with semaphore:
                if per_object == 1:
                    await producer.publish(topic, order(start))
                else:
                    end = min(start + per_object, count)
                    await producer.publish_batch(topic, [order(n) for n in range(start, end)])

        await asyncio.gather(*(one(start) for start in range(0, count, per_object)))


def timed(action: Callable[..., int], *args: Any) -> dict[str, float]:
    started = time.perf_counter()
    rows = action(*args)
    seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds, 1)}


def read_json(spark: SparkSession, root: Path, topic: str, batched: bool) -> int:
    if not batched:
        path = str(root / topic / "messages" / "*.json")
        return spark.read.schema(ENVELOPE).json(path).count()
    path = str(root / topic / "messages" / "*.batch")
    df = spark.read.schema(BATCH).option("multiLine", True).json(path)
    return df.select(F.explode("batch")).count()


def snapshot(spark: SparkSession, url: str, topic: str) -> int:
    return spark.read.format("pawnqueue").option("url", url).option("topic", topic).load().count()


def stream(spark: SparkSession, url: str, topic: str, checkpoint: Path) -> int:
    df = spark.readStream.format("pawnqueue").option("url", url).option("topic", topic).load()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(int(p["numInputRows"]) for p in progress)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    # Without the query's start and stop: what a running query sustains per micro-batch.
    STEADY[topic] = round(rows / seconds, 1) if seconds else 0.0
    return rows


STEADY: dict[str, float] = {}


def sink(spark: SparkSession, url: str, topic: str, rows: int, per_object: int) -> int:
    df = spark.range(0, rows, 1, 2).select(
        F.to_json(
            F.struct(
                F.col("id").alias("order_id"), F.lit("widget").alias("item"), F.lit(1).alias("qty")
            )
        ).alias("payload")
    )
    df.write.format("pawnqueue").option("url", url).option("topic", topic).option(
        "messagesPerObject", str(per_object)
    ).mode("append").save()
    return rows


def warm_up(spark: SparkSession, url: str, workdir: Path) -> None:
    """One small round of every case: the first job of each kind pays for starting Python
    workers and compiling the JVM's code paths, and neither side should pay it measured."""
    for per_object in (1, 1000):
        topic = f"warmup{per_object}"
        asyncio.run(publish(url, topic, 2000, per_object))
        read_json(spark, workdir / "queue", topic, per_object > 1)
        snapshot(spark, url, topic)
        stream(spark, url, topic, workdir / f"ck-{topic}")
        asyncio.run(_create(url, f"warmup-sink{per_object}"))
        sink(spark, url, f"warmup-sink{per_object}", 2000, per_object)


def run(singles: int, batched: int, workdir: Path, runs: int = 1) -> list[dict[str, Any]]:
    """Every case ``runs`` times (fresh objects each run), in one session."""
    spark = local_spark()
    url = f"file://{workdir / 'queue'}"
    results: list[dict[str, Any]] = []
    warm_up(spark, url, workdir)
    kinds = ((SINGLES, singles, 1), (BATCHED, batched, 1000))
    for index in range(runs):
        for name, count, per_object in kinds:
            topic = f"t{per_object}-{index}"
            asyncio.run(publish(url, topic, count, per_object))
            cases: list[tuple[str, Callable[..., int], tuple[Any, ...]]] = [
                ("read.json", read_json, (spark, workdir / "queue", topic, per_object > 1)),
                ("snapshot", snapshot, (spark, url, topic)),
                ("source", stream, (spark, url, topic, workdir / f"ck-{topic}")),
            ]
            for case, action, args in cases:
                result: dict[str, Any] = timed(action, *args)
                if case == "source":
                    result["micro_batch_rows_per_s"] = STEADY[topic]
                results.append({"run": index, "case": case, "objects": name, **result})
                print(json.dumps(results[-1]), flush=True)
                if result["rows"] != count:
                    raise SystemExit(f"{case}: {result['rows']} rows, expected {count}")
        for name, count, per_object in kinds:
            topic = f"sink{per_object}-{index}"
            asyncio.run(_create(url, topic))
            result = timed(sink, spark, url, topic, count, per_object)
            results.append({"run": index, "case": "sink", "objects": name, **result})
            print(json.dumps(results[-1]), flush=True)
    spark.stop()
    return results


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of each case's rows/s, and of the per-run ratios source /
    read.json (with query start, and per micro-batch)."""
    medians: dict[str, dict[str, float]] = {}
    for key in sorted({(r["case"], r["objects"]) for r in results}):
        rows = [r for r in results if (r["case"], r["objects"]) == key]
        entry = {"rows_per_s": statistics.median(r["rows_per_s"] for r in rows)}
        if key[0] == "source":
            entry["micro_batch_rows_per_s"] = statistics.median(
                r["micro_batch_rows_per_s"] for r in rows
            )
        medians[f"{key[0]}, {key[1]}"] = entry
    ratios: dict[str, float] = {}
    for name in (SINGLES, BATCHED):
        by_run = {(r["run"], r["case"]): r for r in results if r["objects"] == name}
        runs = sorted({run for run, _ in by_run})
        start = [
            by_run[n, "source"]["rows_per_s"] / by_run[n, "read.json"]["rows_per_s"] for n in runs
        ]
        steady = [
            by_run[n, "source"]["micro_batch_rows_per_s"] / by_run[n, "read.json"]["rows_per_s"]
            for n in runs
        ]
        ratios[f"source / read.json, {name}, with query start"] = round(statistics.median(start), 2)
        ratios[f"source / read.json, {name}, per micro-batch"] = round(statistics.median(steady), 2)
    return {"medians": medians, "ratios": ratios}


async def _create(url: str, topic: str) -> None:
    async with PawnQueue.from_url(url) as pq:
        await pq.create_topic(topic)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--singles", type=int, default=2_000, help="one-message objects")
    parser.add_argument(
        "--batched", type=int, default=200_000, help="messages in batch objects of 1,000"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs; the summary holds medians")
    parser.add_argument("--out", type=Path, default=RESULTS / "spark.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pq-bench-spark-", dir=REPO / "bench") as tmp:
        results = run(args.singles, args.batched, Path(tmp), args.runs)
    summary = summarize(results)
    medians, ratios = summary["medians"], summary["ratios"]
    batched = medians[f"source, {BATCHED}"]
    targets = {
        "source on batch objects >= 5x spark.read.json (rows/s with query start and stop)": ratios[
            f"source / read.json, {BATCHED}, with query start"
        ]
        >= TARGET_RATIO_BATCHED,
        "source on batch objects >= 50,000 rows/s (per micro-batch)": batched[
            "micro_batch_rows_per_s"
        ]
        >= TARGET_SOURCE_BATCHED,
        "source on batch objects >= 50,000 rows/s (with query start and stop)": batched[
            "rows_per_s"
        ]
        >= TARGET_SOURCE_BATCHED,
        "source on one message per object >= spark.read.json": ratios[
            f"source / read.json, {SINGLES}, with query start"
        ]
        >= 1.0,
    }
    report = {
        "benchmark": "spark",
        **host_report(load_at_start),
        "master": "local[2]",
        "store": "filesystem",
        "messages": {"singles": args.singles, "batched": args.batched},
        "runs": args.runs,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": results,
        **summary,
        "targets": targets,
    }
    write_results(args.out, report)
    print(json.dumps({**summary, "targets": targets}, indent=2))


if __name__ == "__main__":
    main()
