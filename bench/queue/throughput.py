"""Queue benchmark cases on throughput and requests (``python -m bench.queue.compare``):
1. publish, 2-3. drain and requests per message (also split by step), 8. local directory against
vsqs 0.3, and 6. backlog (7. batch objects is in bench/queue/batch.py).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.common import RequestClasses
from bench.micro import store as store_bench
from bench.queue.support import (
    IN_FLIGHT,
    PQ013_PYTHON,
    PQ013_RUNNER,
    TOPIC,
    VSQS_PYTHON,
    VSQS_RUNNER,
    Bench,
    Sizes,
    Skipped,
    counting_queue,
    filesystem_config,
    queues,
    run_child,
)
from pawn_queue import PawnQueue, PawnQueueConfig
from pawn_queue.store import open_store

logger = logging.getLogger("bench.queue")


# -- 1. publish ---------------------------------------------------------------------------------


async def case_publish(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes
    rows: list[dict[str, Any]] = []

    async def ours(store: str, config: dict[str, Any]) -> None:
        samples: dict[str, list[float]] = {"serial": [], "concurrent": []}
        async with queues([config]) as (pq,):
            producer = await pq.register_producer("bench-producer")
            for run in range(s.runs):
                for mode, count, in_flight in (
                    ("serial", s.publish_serial, 1),
                    ("concurrent", s.publish_concurrent, IN_FLIGHT),
                ):
                    topic = f"{mode}-{run}"
                    await pq.create_topic(topic)
                    seconds = await common.publish_many(
                        common.numbered(producer, topic), count, in_flight
                    )
                    samples[mode].append(count / seconds)
        rows.append(_publish_row("ours", store, samples, s.publish_serial, s.publish_concurrent))

    await ours("s3", b.ours_s3(await b.bucket("publish-ours")))
    with tempfile.TemporaryDirectory(prefix="pq-bench-pub-", dir=b.tmp) as root:
        await ours("filesystem", filesystem_config(Path(root) / "queue"))
    try:
        spec = b.pq013_spec(
            "publish",
            bucket=await b.bucket("publish-013"),
            serial=s.publish_serial_013,
            concurrent=s.publish_concurrent_013,
            in_flight=IN_FLIGHT,
            runs=s.runs,
        )
        samples = await run_child(PQ013_PYTHON, PQ013_RUNNER, spec, 300)
        rows.append(
            _publish_row("0.1.3", "s3", samples, s.publish_serial_013, s.publish_concurrent_013)
        )
    except Skipped as exc:
        rows.append({"lib": "0.1.3", "store": "s3", "skipped": str(exc)})
    return rows


def _publish_row(
    lib: str, store: str, samples: dict[str, list[float]], serial: int, concurrent: int
) -> dict[str, Any]:
    return {
        "lib": lib,
        "store": store,
        "serial_per_s": round(common.median(samples["serial"]), 1),
        "concurrent_per_s": round(common.median(samples["concurrent"]), 1),
        "in_flight": IN_FLIGHT,
        "messages": {"serial": serial, "concurrent": concurrent},
        "runs": {k: [round(v, 1) for v in vs] for k, vs in samples.items()},
    }


# -- 2 + 3. drain and requests per message ------------------------------------------------


async def ours_drain_run(
    b: Bench, bucket: str, messages: int, consumers: int, strategy: str
) -> dict[str, Any]:
    config = b.ours_s3(bucket, strategy=strategy)
    async with queues([config] * (1 + consumers)) as (pq_producer, *pq_consumers):
        await pq_producer.create_topic(TOPIC)
        producer = await pq_producer.register_producer("bench-producer")
        consumer_objs = [
            await pq.register_consumer(f"bench-consumer-{i}", topics=[TOPIC])
            for i, pq in enumerate(pq_consumers)
        ]
        before = await b.counted(bucket)
        publish_seconds = await common.publish_many(
            common.numbered(producer, TOPIC), messages, IN_FLIGHT
        )
        published = await b.counted(bucket)
        result = await common.drain(consumer_objs, messages, b.sizes.drain_timeout)
        after = await b.counted(bucket)
    return {
        "publish_seconds": publish_seconds,
        "requests": common.delta(before, after),
        "drain_requests": common.delta(published, after),
        **result.summary(),
    }


def drain_row(
    lib: str, strategy: str, consumers: int, messages: int, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    med = _per_message(runs, "requests")
    codes: Counter[str] = Counter()
    for r in runs:
        codes.update({k: v for k, v in r["requests"].items() if ":" in k})
    split: dict[str, Any] = {}
    if all("drain_requests" in r for r in runs):
        publish = [
            RequestClasses.from_counts(common.delta(r["drain_requests"], r["requests"])).per(
                r["expected"]
            )
            for r in runs
        ]
        split["requests_per_msg_by_step"] = {
            "publish": common.median_classes(publish).as_dict(),
            "drain": _per_message(runs, "drain_requests").as_dict(),
        }
    return {
        "lib": lib,
        "strategy": strategy,
        "consumers": consumers,
        "messages": messages,
        "msgs_per_s": round(common.median(r["msgs_per_s"] for r in runs), 1),
        "requests_per_msg": med.as_dict(),
        **split,
        "usd_per_million_msgs": round(med.dollars_per_million(), 2),
        "duplicates": sum(r["duplicates"] for r in runs),
        "timed_out": sum(bool(r["timed_out"]) for r in runs),
        "requests_by_code_all_runs": dict(sorted(codes.items())),
        "runs": runs,
    }


def _per_message(runs: list[dict[str, Any]], counts: str) -> RequestClasses:
    return common.median_classes(
        [RequestClasses.from_counts(r[counts]).per(r["expected"]) for r in runs]
    )


async def case_drain(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes
    rows: list[dict[str, Any]] = []
    for strategy, messages in (
        ("conditional_write", s.drain_ours),
        ("csprng_verify", s.drain_csprng),
    ):
        for consumers in (1, 4):
            runs = []
            for run in range(s.runs):
                bucket = await b.bucket(f"drain-{strategy[:4]}-{consumers}c-{run}")
                runs.append(await ours_drain_run(b, bucket, messages, consumers, strategy))
            rows.append(drain_row("ours", strategy, consumers, messages, runs))
            _progress(rows[-1])
    for consumers in (1, 4):
        try:
            buckets = [await b.bucket(f"drain-013-{consumers}c-{r}") for r in range(s.runs)]
            spec = b.pq013_spec(
                "drain",
                buckets=buckets,
                messages=s.drain_013,
                consumers=consumers,
                in_flight=IN_FLIGHT,
                timeout=s.drain_timeout,
            )
            runs = await run_child(
                PQ013_PYTHON, PQ013_RUNNER, spec, s.runs * (s.drain_timeout + 30)
            )
            rows.append(drain_row("0.1.3", "conditional_write", consumers, s.drain_013, runs))
            _progress(rows[-1])
        except Skipped as exc:
            rows.append({"lib": "0.1.3", "consumers": consumers, "skipped": str(exc)})
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if r["lib"] == "0.1.3"
                and r["consumers"] == row.get("consumers")
                and "msgs_per_s" in r
            ),
            None,
        )
        if "msgs_per_s" in row and base is not None:
            row["ratio_vs_013"] = round(row["msgs_per_s"] / base["msgs_per_s"], 2)
    rates = await raw_store_rates(b)
    for row in rows:
        if row["lib"] == "ours" and "msgs_per_s" in row:
            limit = common.median(
                store_limit(r["drain_requests"], r["expected"], rates) for r in row["runs"]
            )
            row["store_limit_msgs_per_s"] = round(limit, 1)
            row["of_store_limit"] = round(row["msgs_per_s"] / limit, 2)
    rows.append({"lib": "raw store", "ops_per_s_at_32_in_flight": rates})
    return rows


async def raw_store_rates(b: Bench) -> dict[str, float]:
    """What this server does per operation with 32 requests in flight (bench/micro/store.py's
    pass, on a bucket of its own), medians of the runs."""
    config = PawnQueueConfig.from_dict(b.ours_s3(await b.bucket("raw-store")))
    store = open_store(config)
    try:
        runs = [
            await store_bench.run_once(store, f"r{run}", IN_FLIGHT, store_bench.Budget(1.0, None))
            for run in range(b.sizes.runs)
        ]
    finally:
        await store.close()
    return {op: round(common.median(r[op] for r in runs), 1) for op in store_bench.OPS}


def store_limit(requests: dict[str, int], messages: int, rates: dict[str, float]) -> float:
    """Messages per second the store allows for a drain that made ``requests``: the time
    each kind of request takes at the store's rate, summed per message. LISTs are left out:
    their cost grows with the prefix, and bench/micro/store.py lists a larger one than a drain."""
    seconds = sum(
        count / rates[kind]
        for kind, count in requests.items()
        if kind in rates and kind != "LIST"  # "KIND:code" keys repeat the totals
    )
    return messages / seconds


def _progress(row: dict[str, Any]) -> None:
    logger.info(
        "  %s %s c=%s: %s msg/s, %s",
        row["lib"],
        row.get("strategy", ""),
        row.get("consumers", ""),
        row.get("msgs_per_s"),
        row.get("requests_per_msg"),
    )


# -- 8. local directory: ours vs vsqs ---------------------------------------------------------


async def case_local(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pq-bench-local-", dir=b.tmp) as root:
        async with queues([filesystem_config(Path(root) / "queue")]) as (pq,):
            await pq.create_topic(TOPIC)
            producer = await pq.register_producer("bench-producer")
            consumer = await pq.register_consumer("bench-consumer", topics=[TOPIC])
            pending = 0
            fill = common.numbered(producer, TOPIC)
            for backlog in s.local_backlogs:
                fill_seconds = await common.publish_many(fill, backlog - pending, IN_FLIGHT)
                pending = backlog
                publish_rates, consume_rates = [], []
                for _ in range(s.runs):
                    seconds = await common.publish_many(fill, s.local_ops, 1)
                    publish_rates.append(s.local_ops / seconds)
                    consumed = 0
                    started = time.perf_counter()
                    while consumed < s.local_ops:
                        messages = await consumer.poll()
                        if not messages:
                            raise RuntimeError("empty poll on a non-empty local queue")
                        await asyncio.gather(*(m.ack() for m in messages))
                        consumed += len(messages)
                    consume_rates.append(consumed / (time.perf_counter() - started))
                    pending += s.local_ops - consumed
                rows.append(
                    {
                        "lib": "ours",
                        "store": "filesystem",
                        "backlog": backlog,
                        "fill_seconds": round(fill_seconds, 1),
                        "publish_per_s": round(common.median(publish_rates), 1),
                        "consume_per_s": round(common.median(consume_rates), 1),
                        "publish_runs": [round(r, 1) for r in publish_rates],
                        "consume_runs": [round(r, 1) for r in consume_rates],
                    }
                )
    with tempfile.TemporaryDirectory(prefix="pq-bench-vsqs-", dir=b.tmp) as root:
        spec = {
            "dir": root,
            "backlogs": list(s.local_backlogs),
            "ops": s.local_ops,
            "runs": s.runs,
        }
        try:
            vsqs_rows = await run_child(VSQS_PYTHON, VSQS_RUNNER, spec, 600)
            rows += [{"lib": "vsqs 0.3", "store": "directory", **r} for r in vsqs_rows]
        except Skipped as exc:
            rows.append({"lib": "vsqs 0.3", "skipped": str(exc)})
    return rows


# -- 6. backlog ---------------------------------------------------------------------------------


async def case_backlog(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes
    rows: list[dict[str, Any]] = []
    for store in ("filesystem", "s3"):
        for pending in s.backlog_sizes:
            with tempfile.TemporaryDirectory(prefix="pq-bench-backlog-", dir=b.tmp) as root:
                count: Callable[[], dict[str, int]]
                if store == "s3":
                    bucket = await b.bucket(f"backlog-{pending}")
                    config = b.ours_s3(bucket)
                    consumer_pq = await PawnQueue.from_config(config)
                    count = b.count(bucket)
                else:
                    config = filesystem_config(Path(root) / "queue")
                    consumer_pq, counting = counting_queue(config)
                    count = counting.snapshot
                rows.append(await _backlog_one(store, pending, config, consumer_pq, count, s))
                logger.info("  %s %s pending: %s", store, pending, rows[-1])
    return rows


async def _backlog_one(
    store: str,
    pending: int,
    config: dict[str, Any],
    consumer_pq: PawnQueue,
    count: Callable[[], dict[str, int]],
    s: Sizes,
) -> dict[str, Any]:
    async with queues([config]) as (pq,), consumer_pq:
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer("bench-producer")
        consumer = await consumer_pq.register_consumer("bench-consumer", topics=[TOPIC])
        fill_seconds = await common.publish_many(common.numbered(producer, TOPIC), pending, 128)
        times, requests = [], []
        for _ in range(s.backlog_polls):
            before = await asyncio.to_thread(count)
            started = time.perf_counter()
            messages = await consumer.poll()
            await asyncio.gather(*(m.ack() for m in messages))
            times.append(time.perf_counter() - started)
            requests.append(common.delta(before, await asyncio.to_thread(count)))
            if len(messages) == 0:
                raise RuntimeError("empty poll on a non-empty queue")
    classes = common.median_classes([RequestClasses.from_counts(r) for r in requests])
    return {
        "store": store,
        "pending": pending,
        "fill_seconds": round(fill_seconds, 1),
        "fill_msgs_per_s": round(pending / fill_seconds, 1),
        "poll_and_ack_ms": round(common.median(times) * 1000, 1),
        "requests_per_poll": classes.as_dict(),
        "runs_ms": [round(t * 1000, 1) for t in times],
        "requests_runs": requests,
    }
