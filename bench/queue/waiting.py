"""Queue benchmark cases on waiting (``python -m bench.queue.compare``): 4. what an idle
``listen()`` costs in requests, 5. how long a published message takes to reach the handler, and
9. how long a publish from another process takes to wake a ``listen()`` that was idle a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.common import REPO, RequestClasses
from bench.queue.support import (
    PQ013_PYTHON,
    PQ013_RUNNER,
    TOPIC,
    Bench,
    Skipped,
    filesystem_config,
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


# -- 9. wake: an idle listen() and a publish from another process --------------------------------

# Past the 60 s backfill: a change signal that went unheard shows as ~60 s, not as a loss.
WAKE_TIMEOUT = 75.0


async def case_wake(b: Bench) -> list[dict[str, Any]]:
    """A ``listen()`` consumer at default settings in this process; a producer in a child
    process publishes one message after each idle gap (from the handler's ack of the
    previous one, or from the start of ``listen()``). Latency: the handler's ``time.time()``
    minus the producer's just before ``publish`` (one host, one clock). Every run of every
    store is its own consumer/producer pair; all run at once (they only wait)."""
    s = b.sizes
    gaps = s.wake_gaps
    with tempfile.TemporaryDirectory(prefix="pq-bench-wake-", dir=b.tmp) as root:
        pairs: list[tuple[str, dict[str, Any]]] = []
        for run in range(s.wake_runs):
            pairs.append(("filesystem", filesystem_config(Path(root) / f"queue-{run}")))
            pairs.append(("s3", b.ours_s3(await b.bucket(f"wake-{run}"), strategy=None)))
        runs = await asyncio.gather(*(_wake_pair(config, gaps) for _, config in pairs))
    rows: list[dict[str, Any]] = []
    for store in ("filesystem", "s3"):
        mine = [r for (name, _), r in zip(pairs, runs, strict=True) if name == store]
        for k, gap in enumerate(gaps):
            seen = [r["latencies"][k] for r in mine if r["latencies"][k] is not None]
            rows.append(
                {
                    "store": store,
                    "gap_s": gap,
                    "runs": len(mine),
                    "received": len(seen),
                    "median_s": round(common.median(seen), 4) if seen else None,
                    "max_s": max(seen, default=None),
                    "latencies_s": [r["latencies"][k] for r in mine],
                    "publish_s": [r["publish_s"][k] for r in mine],
                    "settings": mine[0]["settings"],
                }
            )
        logger.info(
            "  wake %s: %s",
            store,
            ", ".join(f"{r['gap_s']:g} s -> {r['median_s']} s" for r in rows[-len(gaps) :]),
        )
    return rows


async def _wake_pair(config: dict[str, Any], gaps: tuple[float, ...]) -> dict[str, Any]:
    arrived = [asyncio.Event() for _ in gaps]
    latencies: list[float | None] = [None] * len(gaps)
    publish_s: list[float | None] = [None] * len(gaps)

    async def handler(message: Any) -> None:
        latency = time.time() - float(message.payload["t"])
        i = int(message.payload["i"])
        await message.ack()
        if latencies[i] is None:
            latencies[i] = round(latency, 4)
        arrived[i].set()

    async with queues([config]) as (pq,):
        await pq.create_topic(TOPIC)
        consumer = await pq.register_consumer("wake-consumer", topics=[TOPIC])
        settings = settings_of(pq)
        async with producer_process(config) as publish:
            listener = asyncio.create_task(consumer.listen(handler))
            try:
                idle_since = time.monotonic()
                for i, gap in enumerate(gaps):
                    await asyncio.sleep(max(0.0, idle_since + gap - time.monotonic()))
                    publish_s[i] = await publish(i)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived[i].wait(), WAKE_TIMEOUT)
                    idle_since = time.monotonic()
            finally:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
    return {"latencies": latencies, "publish_s": publish_s, "settings": settings}


@contextlib.asynccontextmanager
async def producer_process(
    config: dict[str, Any], topic: str = TOPIC
) -> AsyncIterator[Callable[[int], Awaitable[float]]]:
    """``bench.queue.wake_producer`` in a child process publishing to ``topic``; yields
    ``publish(i)``, which returns how long the child's publish took."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.queue.wake_producer",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=common.scrubbed_env(),
        cwd=REPO,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def exchange(line: str) -> str:
        stdin.write(line.encode() + b"\n")
        await stdin.drain()
        answer = await asyncio.wait_for(stdout.readline(), 60)
        if not answer:
            raise RuntimeError(f"wake_producer exited (code {await process.wait()})")
        return answer.decode()

    async def publish(i: int) -> float:
        return float(json.loads(await exchange(json.dumps({"i": i})))["publish_s"])

    try:
        ready = await exchange(json.dumps({"queue": config, "topic": topic}))
        if ready.strip() != "ready":
            raise RuntimeError(f"wake_producer said {ready!r}")
        yield publish
    finally:
        with contextlib.suppress(OSError):
            stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


def wake_table(rows: list[dict[str, Any]]) -> list[str]:
    """The printed section of case 9."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    settings = rows[0]["settings"] if rows else "?"  # every pair runs at defaults
    header = f"{'store':<12}{'idle s':>7}{'median s':>10}{'max s':>8}{'got':>6}   each run, s"
    lines = [
        f"{r['store']:<12}{r['gap_s']:>7g}{seconds(r['median_s']):>10}{seconds(r['max_s']):>8}"
        f"{r['received']:>4}/{r['runs']}   " + " ".join(seconds(x) for x in r["latencies_s"])
        for r in rows
    ]
    return [
        "",
        "9. Wake-up of an idle listen() by a publish from another process, latency by idle gap",
        f"   consumer at defaults: {settings}",
        "   idle s: from the previous ack (or the start of listen()) to the publish, by a",
        "   producer in a child process; at an idle gap equal to the backfill interval the",
        f"   backfill poll may find the message; '-': not received within {WAKE_TIMEOUT:g} s",
        header,
        "-" * len(header),
        *lines,
    ]
