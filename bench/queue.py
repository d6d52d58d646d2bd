"""Queue benchmarks: this pawn-queue against pawn-queue 0.1.3 (PyPI) on one SeaweedFS started
once per run, and the local-directory store against vsqs 0.3, all through public APIs.

Cases (each figure the median of ``--runs`` runs):

1. publish: msgs/s one at a time and 32 in flight (ours and 0.1.3 on S3, ours on a directory)
2. drain: N published messages consumed and acked by 1 and 4 consumers, each its own
   PawnQueue, all in one process and event loop (0.1.3: likewise, in its runner process)
3. requests per message of publish + drain, from SeaweedFS's per-bucket request counters,
   and USD per million messages at AWS list prices; for this version also split by step
   (publish, and drain: claim + read + ack)
4. idle: requests per minute of an idle ``listen()`` on 1 and 10 topics, USD per month
5. latency: publish-to-handler p50/p95 with one publish every 50 ms
6. backlog (``--backlog``): one ``poll()`` + acks at 100 and 100,000 pending messages
7. batch: a drain of ``publish_batch`` objects of 100, if the Producer has it, with polls
   of 10 (the default) by 1 and 4 consumers, and polls of 100 by 1 consumer
8. local: the filesystem store against vsqs 0.3 at a 2,000 and a 10,000-message backlog

Run from the repository root (``bench/queue.py`` is named like the standard library's
``queue``, so it must be run as a module)::

    .venv/bin/python -m bench.queue                 # everything but --backlog, < 10 min
    .venv/bin/python -m bench.queue --quick         # smaller sizes, ~3 min
    .venv/bin/python -m bench.queue --cases drain,idle --backlog

0.1.3 runs in ``.venv-pq013`` (bench/pq013_runner.py) and vsqs in ``.venv-vsqs``
(bench/vsqs_bench.py); a case whose venv is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO / "src", REPO):  # pawn_queue from this checkout, and tests.seaweedfs
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench import common  # noqa: E402
from bench import store as store_bench  # noqa: E402
from bench.common import RequestClasses  # noqa: E402

from pawn_queue import PawnQueue, PawnQueueConfig  # noqa: E402
from pawn_queue.store import open_store  # noqa: E402
from pawn_queue.store.base import Store  # noqa: E402

PQ013_PYTHON = REPO / ".venv-pq013" / "bin" / "python"
VSQS_PYTHON = REPO / ".venv-vsqs" / "bin" / "python"
PQ013_RUNNER = REPO / "bench" / "pq013_runner.py"
VSQS_RUNNER = REPO / "bench" / "vsqs_bench.py"
TOPIC = "bench"
IN_FLIGHT = 32
CASES = ("publish", "drain", "batch", "idle", "latency", "local", "backlog")
DEFAULT_CASES = ("publish", "drain", "batch", "idle", "latency", "local")

logger = logging.getLogger("bench.queue")


@dataclass(frozen=True)
class Sizes:
    runs: int = 3
    publish_serial: int = 300
    publish_concurrent: int = 1000
    publish_serial_013: int = 150
    publish_concurrent_013: int = 300
    drain_ours: int = 500  # conditional_write
    drain_csprng: int = 100  # ~0.8 s per claim round of 10: ~8 s per run
    drain_013: int = 200  # 0.1.3 drains at ~60-90 msg/s
    drain_timeout: float = 120.0
    batch_messages: int = 20000  # 200 objects: a run long enough to leave start-up behind
    batch_size: int = 100
    idle_seconds: float = 20.0
    idle_warmup: float = 1.5
    latency_period: float = 0.05
    latency_fast_seconds: float = 4.0  # publishing time per run, ours
    latency_slow_seconds: float = 8.0  # ... ours at the default 5 s interval
    latency_013_seconds: float = 5.0  # ... 0.1.3 (it falls behind: 10 msgs/s at most)
    local_backlogs: tuple[int, ...] = (2000, 10000)
    local_ops: int = 150
    backlog_sizes: tuple[int, ...] = (100, 100_000)
    backlog_polls: int = 5


QUICK = Sizes(
    publish_serial=100,
    publish_concurrent=300,
    publish_serial_013=100,
    publish_concurrent_013=200,
    drain_ours=200,
    drain_csprng=60,
    drain_013=60,
    drain_timeout=60.0,
    batch_messages=500,
    idle_seconds=8.0,
    latency_fast_seconds=2.0,
    latency_slow_seconds=5.0,
    latency_013_seconds=3.0,
    local_backlogs=(500, 2000),
    local_ops=100,
    backlog_sizes=(100, 10_000),
    backlog_polls=3,
)


# -- plumbing ---------------------------------------------------------------------------------


class Bench:
    """One SeaweedFS for the whole run; every measurement gets fresh buckets."""

    def __init__(self, server: Any, sizes: Sizes, tmp: Path) -> None:
        self.server = server
        self.sizes = sizes
        self.tmp = tmp
        self._buckets = 0

    async def bucket(self, name: str) -> str:
        self._buckets += 1
        bucket = f"b{self._buckets:03d}-{name}"[:63]
        await asyncio.to_thread(self.server.create_bucket, bucket)
        return bucket

    def s3(self) -> dict[str, Any]:
        """Connection settings shared with the 0.1.3 runner (bucket added per use)."""
        return {
            "endpoint_url": self.server.endpoint,
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench-secret",
            "region_name": "us-east-1",
            "use_ssl": False,
        }

    def ours_s3(
        self,
        bucket: str,
        *,
        strategy: str | None = "conditional_write",
        polling: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        config: dict[str, Any] = {"backend": "s3", "s3": {**self.s3(), "bucket_name": bucket}}
        if strategy is not None:
            config["concurrency"] = {"strategy": strategy}
        if polling:
            config["polling"] = polling
        return config

    def count(self, bucket: str) -> Callable[[], dict[str, int]]:
        return lambda: common.scrape(self.server.metrics_url, bucket)

    async def counted(self, bucket: str) -> dict[str, int]:
        return await asyncio.to_thread(common.scrape, self.server.metrics_url, bucket)

    def pq013_spec(self, action: str, **spec: Any) -> dict[str, Any]:
        return {
            "action": action,
            "s3": self.s3(),
            "metrics_url": self.server.metrics_url,
            **spec,
        }


@contextlib.asynccontextmanager
async def queues(configs: Sequence[dict[str, Any]]) -> AsyncIterator[list[PawnQueue]]:
    """Set up one PawnQueue per config; tear all down at exit."""
    async with AsyncExitStack() as stack:
        out = []
        for config in configs:
            out.append(await stack.enter_async_context(await PawnQueue.from_config(config)))
        yield out


def _require(python: Path) -> None:
    if not python.exists():
        raise Skipped(f"{python.relative_to(REPO)} missing")


async def run_child(python: Path, script: Path, spec: dict[str, Any], time_limit: float) -> Any:
    """Run a runner under another venv's interpreter; its last stdout line is JSON."""
    _require(python)
    process = await asyncio.create_subprocess_exec(
        str(python),
        "-P",  # do not put bench/ (and its queue.py) first on sys.path
        str(script),
        json.dumps({**spec, "deadline": time_limit}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=common.scrubbed_env(),
        cwd=REPO,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), time_limit + 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"{script.name} exited {process.returncode}:\n{err.decode()[-3000:]}")
    return common.last_json_line(out.decode())


class Skipped(Exception):
    """A case that cannot run here (missing venv or API); reported, not failed."""


class CountingStore:
    """Counts store calls, named like S3 requests, for stores without server metrics."""

    _NAMES = {
        "get": "GET",
        "head": "HEAD",
        "put": "PUT",
        "list": "LIST",
        "delete": "DELETE",
        "delete_many": "DELETE",
    }

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.counts: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        kind = self._NAMES.get(name)
        if kind is None:
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[kind] += 1
            return await attr(*args, **kwargs)

        return counted

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


def filesystem_config(path: Path, **polling: float) -> dict[str, Any]:
    config: dict[str, Any] = {"backend": "filesystem", "filesystem": {"path": str(path)}}
    if polling:
        config["polling"] = polling
    return config


def counting_queue(config: dict[str, Any]) -> tuple[PawnQueue, CountingStore]:
    parsed = PawnQueueConfig.from_dict(config)
    store = CountingStore(open_store(parsed))
    return PawnQueue(parsed, store=cast(Store, store)), store


def settings_of(pq: PawnQueue) -> str:
    """The consumer-side settings that decide idle cost and latency, as configured."""
    notify = pq.config.notify
    if not notify.enabled:
        return f"poll {pq.config.polling.interval_seconds:g} s"
    return (
        f"HEAD {notify.check_interval_seconds:g}->{notify.idle_check_interval_seconds:g} s, "
        f"backfill {notify.backfill_interval_seconds:g} s"
    )


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
    """What this server does per operation with 32 requests in flight (bench/store.py's
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
    their cost grows with the prefix, and bench/store.py lists a larger one than a drain."""
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


# -- 7. batch objects ---------------------------------------------------------------------------


async def case_batch(b: Bench) -> list[dict[str, Any]]:
    s = b.sizes
    rows: list[dict[str, Any]] = []
    default_poll = PawnQueueConfig.from_dict({"backend": "memory"}).polling.max_messages_per_poll
    for consumers, poll in ((1, default_poll), (4, default_poll), (1, s.batch_size)):
        runs = []
        for run in range(s.runs):
            bucket = await b.bucket(f"batch-{consumers}c-{poll}p-{run}")
            config = b.ours_s3(bucket, polling={"max_messages_per_poll": poll})
            async with queues([config] * (1 + consumers)) as (pq_producer, *pq_consumers):
                await pq_producer.create_topic(TOPIC)
                producer = await pq_producer.register_producer("bench-producer")
                if not hasattr(producer, "publish_batch"):
                    raise Skipped("Producer.publish_batch not available")
                consumer_objs = [
                    await pq.register_consumer(f"bench-consumer-{i}", topics=[TOPIC])
                    for i, pq in enumerate(pq_consumers)
                ]
                before = await b.counted(bucket)
                batches = -(-s.batch_messages // s.batch_size)
                started = time.perf_counter()
                publish_seconds = await common.publish_many(
                    _batch_publisher(producer, s.batch_size), batches, 4
                )
                result = await common.drain(consumer_objs, batches * s.batch_size, s.drain_timeout)
                total = time.perf_counter() - started
                requests = common.delta(before, await b.counted(bucket))
            runs.append(
                {
                    "publish_seconds": publish_seconds,
                    "end_to_end_seconds": total,
                    "end_to_end_msgs_per_s": round(result.unique / total, 1),
                    "requests": requests,
                    **result.summary(),
                }
            )
        label = f"batch {s.batch_size} poll {poll}"
        row = drain_row("ours", label, consumers, s.batch_messages, runs)
        row["end_to_end_msgs_per_s"] = round(
            common.median(r["end_to_end_msgs_per_s"] for r in runs), 1
        )
        rows.append(row)
        _progress(row)
    return rows


def _batch_publisher(producer: Any, size: int) -> Callable[[int], Awaitable[object]]:
    def publish(i: int) -> Awaitable[object]:
        sent: Awaitable[object] = producer.publish_batch(
            TOPIC, [{"n": i * size + j} for j in range(size)]
        )
        return sent

    return publish


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


# -- table --------------------------------------------------------------------------------------


def _f(value: Any, spec: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def table(results: dict[str, Any]) -> str:
    out: list[str] = []

    def section(title: str, header: str, lines: list[str]) -> None:
        out.extend(["", title, header, "-" * len(header), *lines])

    def skipped(rows: list[dict[str, Any]]) -> list[str]:
        return [f"{r['lib']:<7}skipped: {r['skipped']}" for r in rows if "skipped" in r]

    if "publish" in results:
        rows = results["publish"]
        section(
            "1. Publish, msgs/s",
            f"{'lib':<7}{'store':<12}{'serial':>10}{f'{IN_FLIGHT} in flight':>14}",
            [
                f"{r['lib']:<7}{r['store']:<12}{_f(r['serial_per_s']):>10}"
                f"{_f(r['concurrent_per_s']):>14}"
                for r in rows
                if "serial_per_s" in r
            ]
            + skipped(rows),
        )
    for key, title in (
        ("drain", "2-3. Drain on S3: msgs/s, requests per message (publish + drain), USD"),
        ("batch", "7. Drain of publish_batch objects"),
    ):
        if key not in results:
            continue
        rows = results[key]
        lines = []
        for r in rows:
            if "msgs_per_s" not in r:
                continue
            q = r["requests_per_msg"]
            extra = r.get("end_to_end_msgs_per_s")
            lines.append(
                f"{r['lib']:<7}{r['strategy']:<19}{r['messages']:>6}{r['consumers']:>4}"
                f"{_f(r['msgs_per_s']):>8}"
                + (
                    f"{_f(extra):>8}"
                    if key == "batch"
                    else f"{_f(r.get('ratio_vs_013'), '.2f'):>8}"
                    f"{_f(r.get('of_store_limit'), '.0%'):>7}"
                )
                + f"{q['put_list']:>10.2f}{q['get_head']:>10.2f}{q['delete']:>8.2f}"
                f"{r['usd_per_million_msgs']:>9.2f}{r['duplicates']:>5}"
            )
        ratio = f"{'e2e/s':>8}" if key == "batch" else f"{'/0.1.3':>8}{'limit':>7}"
        section(
            title,
            f"{'lib':<7}{'strategy':<19}{'N':>6}{'c':>4}{'msgs/s':>8}{ratio}"
            f"{'PUT+LIST':>10}{'GET+HEAD':>10}{'DELETE':>8}{'$/M msg':>9}{'dup':>5}",
            lines + skipped(rows),
        )
    if "drain" in results:
        split_rows = [r for r in results["drain"] if "requests_per_msg_by_step" in r]
        section(
            "3. Requests per message by step: publish, and drain (claim + read + ack)",
            f"{'lib':<7}{'strategy':<19}{'c':>4}{'step':>9}{'PUT+LIST':>10}{'GET+HEAD':>10}"
            f"{'DELETE':>8}",
            [
                f"{r['lib']:<7}{r['strategy']:<19}{r['consumers']:>4}{step:>9}"
                f"{q['put_list']:>10.2f}{q['get_head']:>10.2f}{q['delete']:>8.2f}"
                for r in split_rows
                for step, q in r["requests_per_msg_by_step"].items()
            ],
        )
    if "idle" in results:
        rows = results["idle"]
        section(
            f"4. Idle listen(): requests per minute (over {rows[0].get('seconds', '?')} s), "
            "USD per month",
            f"{'lib':<7}{'settings':<34}{'topics':>7}{'PUT+LIST':>10}{'GET+HEAD':>10}"
            f"{'$/month':>9}",
            [
                f"{r['lib']:<7}{r['settings']:<34}{r['topics']:>7}"
                f"{r['requests_per_min']['put_list']:>10.1f}"
                f"{r['requests_per_min']['get_head']:>10.1f}{r['usd_per_month']:>9.2f}"
                for r in rows
                if "requests_per_min" in r
            ]
            + skipped(rows),
        )
    if "latency" in results:
        rows = results["latency"]
        section(
            "5. Latency publish -> handler, one publish every 50 ms",
            f"{'lib':<7}{'setup':<38}{'settings':<22}{'p50 ms':>8}{'p95 ms':>9}{'got/sent':>11}",
            [
                f"{r['lib']:<7}{r['setup']:<38}{r['settings']:<22}{_f(r['p50_ms']):>8}"
                f"{_f(r['p95_ms']):>9}{r['received']:>6}/{r['sent']}"
                for r in rows
                if "p50_ms" in r
            ]
            + skipped(rows),
        )
    if "backlog" in results:
        rows = results["backlog"]
        section(
            "6. One poll() of 10 + acks at a backlog (fill: publish, 128 in flight)",
            f"{'store':<12}{'pending':>9}{'fill/s':>8}{'poll+ack ms':>13}{'PUT+LIST':>10}"
            f"{'GET+HEAD':>10}{'DELETE':>8}",
            [
                f"{r['store']:<12}{r['pending']:>9,}{_f(r['fill_msgs_per_s']):>8}"
                f"{r['poll_and_ack_ms']:>13.1f}{r['requests_per_poll']['put_list']:>10.0f}"
                f"{r['requests_per_poll']['get_head']:>10.0f}"
                f"{r['requests_per_poll']['delete']:>8.0f}"
                for r in rows
            ],
        )
    if "local" in results:
        rows = results["local"]
        section(
            "8. Local directory, msgs/s: publish (serial) and consume (poll/receive + ack)",
            f"{'lib':<10}{'backlog':>9}{'publish':>10}{'consume':>10}",
            [
                f"{r['lib']:<10}{r['backlog']:>9,}{_f(r['publish_per_s']):>10}"
                f"{_f(r['consume_per_s']):>10}"
                for r in rows
                if "backlog" in r
            ]
            + skipped(rows),
        )
    for name, value in results.items():
        if isinstance(value, dict) and "error" in value:
            out.extend(["", f"{name}: ERROR {value['error']}"])
        elif isinstance(value, dict) and "skipped" in value:
            out.extend(["", f"{name}: skipped: {value['skipped']}"])
    out.extend(["", *NOTES])
    return "\n".join(out).lstrip("\n")


NOTES = (
    "Notes: one SeaweedFS (weed mini, loopback) for every S3 figure, a fresh bucket per",
    "measurement. Drain: N messages published 32 in flight, then c consumers, each its own",
    "PawnQueue, all in one process and event loop (0.1.3 alike, in its runner process), each",
    "looping poll() + concurrent acks, sleeping 10 ms doubling to 250 ms after empty polls.",
    "Requests: SeaweedFS_s3_request_total of the bucket over publish + drain (HEAD counts as",
    "GET; a DeleteObjects batch as one DELETE). USD at AWS list prices: PUT/COPY/POST/LIST",
    "$5 per million, GET/HEAD $0.40, DELETE free; per month = 30 days. limit: the drain's",
    "msgs/s as a share of what the server allows for the drain's own PUT, GET, HEAD and",
    "DELETE requests, at the rates bench/store.py's pass measures on it (32 in flight) in",
    "the same run; LISTs left out (their cost grows with the prefix listed).",
)


# -- main ---------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Bench], Awaitable[Any]]] = {
    "publish": case_publish,
    "drain": case_drain,
    "batch": case_batch,
    "idle": case_idle,
    "latency": case_latency,
    "local": case_local,
    "backlog": case_backlog,
}


async def run_cases(b: Bench, cases: list[str], timings: dict[str, float]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for case in cases:
        logger.info("case %s ...", case)
        started = time.perf_counter()
        try:
            results[case] = await asyncio.wait_for(RUNNERS[case](b), 900)
        except Skipped as exc:
            results[case] = {"skipped": str(exc)}
        except Exception as exc:
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}"}
        timings[case] = round(time.perf_counter() - started, 1)
        logger.info("case %s done in %.1f s", case, timings[case])
    return results


def _git_state() -> dict[str, Any]:
    """The checkout measured: the library may be mid-change, so say which files differ."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout

    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "changed": [line[3:] for line in git("status", "--porcelain").splitlines() if line],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (~3 min)")
    parser.add_argument("--backlog", action="store_true", help="add case 6 (100,000 pending)")
    parser.add_argument("--cases", help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--runs", type=int, help="runs per figure (default 3)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "queue.json")
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else Sizes()
    if args.runs:
        sizes = replace(sizes, runs=args.runs)
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else list(DEFAULT_CASES)
    if args.backlog and "backlog" not in cases:
        cases.append("backlog")
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {CASES}")

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("pawn_queue").setLevel(logging.ERROR)
    for name in list(os.environ):  # a developer's PAWNQUEUE_*/AWS_* must not reconfigure us
        if name.startswith(common.SCRUBBED_ENV_PREFIXES):
            del os.environ[name]
    # SIGTERM unwinds like Ctrl-C, so SeaweedFS is stopped and temp dirs are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tests.seaweedfs import SeaweedFS

    started = time.perf_counter()
    timings: dict[str, float] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pq-bench-queue-")))
        # weed mini leaves a work directory in $TMPDIR after it stops: keep it in ours.
        (tmp / "tmp").mkdir()
        os.environ["TMPDIR"] = str(tmp / "tmp")
        server = SeaweedFS.start(tmp / "seaweedfs")
        stack.callback(server.stop)
        bench = Bench(server, sizes, tmp)
        results = asyncio.run(run_cases(bench, cases, timings))

    text = table(results)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "queue",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sizes": {k: v for k, v in vars(sizes).items()},
        "quick": args.quick,
        "cases": cases,
        "git": _git_state(),
        "case_seconds": timings,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "prices_usd_per_million": {
            "put_copy_post_list": common.PRICE_PUT_LIST,
            "get_head": common.PRICE_GET_HEAD,
            "delete": 0.0,
        },
        "results": results,
        "table": text,
    }
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out} in {report['wall_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
