"""Queue benchmark cases on waiting (``python -m bench.queue``): 4. what an idle ``listen()``
costs in requests, and 5. how long a published message takes to reach the handler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from bench import common
from bench.common import RequestClasses
from bench.queue_support import (
    PQ013_PYTHON,
    PQ013_RUNNER,
    TOPIC,
    Bench,
    Skipped,
    queues,
    run_child,
    settings_of,
)

logger = logging.getLogger("bench.queue")


# -- 4. idle ------------------------------------------------------------------------------------


async def case_idle(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes

    async def ours(label: str, topics: int, polling: dict[str, float]) -> dict[str, Any]:
        bucket = await b.bucket(f"idle-ours-{topics}t-{len(polling)}")
        config = b.ours_s3(bucket, strategy=None, polling=polling)
        async with queues([config]) as (pq,):
            names = [f"topic-{i}" for i in range(topics)]
            for name in names:
                await pq.create_topic(name)
            consumer = await pq.register_consumer("idle-consumer", topics=names)
            requests = await common.measure_idle(
                consumer, s.idle_seconds, b.count(bucket), s.idle_warmup
            )
            settings = f"{label}: {settings_of(pq)}"
        return {
            "lib": "ours",
            "settings": settings,
            "topics": topics,
            "seconds": s.idle_seconds,
            "requests": requests,
        }

    async def legacy() -> list[dict[str, Any]]:
        jobs = [{"bucket": await b.bucket(f"idle-013-{t}t"), "topics": t} for t in (1, 10)]
        spec = b.pq013_spec(
            "idle", jobs=jobs, seconds=s.idle_seconds, warmup=s.idle_warmup, interval=1.0
        )
        try:
            results = await run_child(PQ013_PYTHON, PQ013_RUNNER, spec, s.idle_seconds + 120)
        except Skipped as exc:
            return [{"lib": "0.1.3", "skipped": str(exc)}]
        return [{"lib": "0.1.3", "settings": "poll 1 s", **r} for r in results]

    jobs: list[Awaitable[Any]] = [
        ours("defaults", 1, {}),
        ours("defaults", 10, {}),
        ours("set", 1, {"interval_seconds": 1.0}),
        ours("set", 10, {"interval_seconds": 1.0}),
    ]
    results = await asyncio.gather(legacy(), *jobs)
    rows = [*results[1:], *results[0]]
    for row in rows:
        if "requests" not in row:
            continue
        per_minute = RequestClasses.from_counts(row["requests"]).per(row["seconds"] / 60)
        row["requests_per_min"] = per_minute.as_dict()
        row["usd_per_month"] = round(
            per_minute.dollars_per_million() * common.MINUTES_PER_MONTH / 1e6, 3
        )
    return rows


# -- 5. latency ---------------------------------------------------------------------------------


async def case_latency(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes
    rows: list[dict[str, Any]] = []
    variants: list[tuple[str, dict[str, float], bool, float]] = [
        ("2 PawnQueues, defaults", {}, False, s.latency_slow_seconds),
        ("2 PawnQueues", {"interval_seconds": 0.05}, False, s.latency_fast_seconds),
        ("1 PawnQueue (local wake-up), defaults", {}, True, s.latency_fast_seconds),
    ]
    for label, polling, shared, duration in variants:
        runs = []
        for run in range(s.runs):
            bucket = await b.bucket(f"latency-{len(rows)}-{run}")
            config = b.ours_s3(bucket, polling=polling)
            async with queues([config] if shared else [config, config]) as pqs:
                await pqs[0].create_topic(TOPIC)
                producer = await pqs[0].register_producer("bench-producer")
                consumer = await pqs[-1].register_consumer("bench-consumer", topics=[TOPIC])
                result = await common.measure_latency(
                    common.sender(producer, TOPIC),
                    consumer,
                    period=s.latency_period,
                    duration=duration,
                    drain_timeout=30.0,
                )
                settings = settings_of(pqs[-1])
            runs.append(result.summary())
        rows.append(_latency_row("ours", label, settings, duration, runs))
        logger.info("  ours %s: %s", label, rows[-1]["p50_ms"])
    try:
        buckets = [await b.bucket(f"latency-013-{r}") for r in range(s.runs)]
        spec = b.pq013_spec(
            "latency",
            buckets=buckets,
            period=s.latency_period,
            duration=s.latency_013_seconds,
            drain_timeout=60.0,
            interval=1.0,
        )
        runs = await run_child(
            PQ013_PYTHON, PQ013_RUNNER, spec, s.runs * (s.latency_013_seconds + 90)
        )
        rows.append(_latency_row("0.1.3", "2 PawnQueues", "poll 1 s", s.latency_013_seconds, runs))
    except Skipped as exc:
        rows.append({"lib": "0.1.3", "skipped": str(exc)})
    return rows


def _latency_row(
    lib: str, setup: str, settings: str, duration: float, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "lib": lib,
        "setup": setup,
        "settings": settings,
        "publish_seconds": duration,
        "p50_ms": round(common.median(r["p50_ms"] for r in runs), 1),
        "p95_ms": round(common.median(r["p95_ms"] for r in runs), 1),
        "received": sum(r["received"] for r in runs),
        "sent": sum(r["sent"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "runs": runs,
    }
