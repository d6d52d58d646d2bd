"""Group commit on S3 (one SeaweedFS on loopback): throughput and cost of single
``publish()`` calls with group commit on and off, in the same run.

1. drain: ``--publishers`` tasks (1, 4, 32) call ``publish()`` one message at a time on one
   producer while 4 consumers (``listen()``, acking) drain the topic, all in one process;
   messages/s from the first publish to the last ack, and the S3 requests the server
   counted for the bucket (publish + consume + ack, change signals included), as USD per
   million messages at AWS list prices (PUT/LIST $5, GET/HEAD $0.40 per million).
   Group commit on and off, and pawn-queue 0.1.3 (PyPI, ``.venv-pq013``, through
   bench/queue/pq013_runner.py) on the same workload: one PawnQueue, one producer, 4 consumers
   ``listen()``-ing at 0.1.3's poll interval ``--pq013-interval`` (its rate hardly depends
   on it: 23-24 msg/s at 1, 0.1 and 0.01 s). 0.1.3 drains at tens of messages a second, so
   its drain stops after ``--pq013-timeout`` s: the rate is then what it acked by then,
   marked bounded, and its requests per message are per message acked (a bounded run's
   therefore include the publishes of the messages it left pending).
2. serial: one caller publishing ``--serial`` messages one after the other: mean latency,
   group commit on and off taking turns of 20 publishes in the same run.

Runs alternate the order of the modes. The ratios are of medians measured in the same run;
the JSON's ``targets`` compares them with the goals (group commit on at 32 publishers: at
least 5x off, at least 20x 0.1.3).

Run from the repository root::

    .venv/bin/python -m bench.cost.group_commit            # 3 runs, ~20 min
    .venv/bin/python -m bench.cost.group_commit --runs 1 --messages 1000 --pq013-timeout 20

Prints a table; writes ``bench/results/group_commit.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.servers.seaweedfs import SeaweedFS

from bench.common import (
    RESULTS,
    RequestClasses,
    delta,
    git_state,
    median,
    s3_settings,
    scrape,
    write_results,
)
from bench.queue.batch import ListenDrain
from bench.queue.support import PQ013_PYTHON, PQ013_RUNNER, Skipped, run_child
from pawn_queue import PawnQueue

TOPIC = "bench"
CONSUMERS = 4
MODES = ("on", "off", "0.1.3")
# Goals at 32 publishers: group commit on against off, and against 0.1.3 (msg/s ratios).
TARGETS = {"on / off": 5.0, "on / 0.1.3": 20.0}


def config(server: SeaweedFS, bucket: str, group_commit: bool) -> dict[str, Any]:
    return {
        "backend": "s3",
        "s3": {**s3_settings(server.endpoint), "bucket_name": bucket},
        "producer": {"group_commit": group_commit},
    }


async def drain_case(
    server: SeaweedFS, publishers: int, messages: int, group_commit: bool
) -> dict[str, Any]:
    bucket = f"gc-{uuid.uuid4().hex[:16]}"
    server.create_bucket(bucket)
    async with await PawnQueue.from_config(config(server, bucket, group_commit)) as pq:
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer("bench")
        consumers = [await pq.register_consumer(f"c{i}", [TOPIC]) for i in range(CONSUMERS)]
        before = await asyncio.to_thread(scrape, server.metrics_url, bucket)
        drain = ListenDrain(messages)
        drain.start(consumers)
        started = drain.started
        share = [messages // publishers + (i < messages % publishers) for i in range(publishers)]

        async def publish(count: int) -> None:
            for n in range(count):
                await producer.publish(TOPIC, {"n": n})

        await asyncio.gather(*(publish(count) for count in share))
        published = time.perf_counter()
        try:
            if not await drain.wait(300):
                raise TimeoutError(f"{len(drain.ids)} of {messages} messages acked in 300 s")
        finally:
            await drain.stop()
        elapsed = drain.finished - started
        await pq.runtime.background.done()
    await asyncio.sleep(1.5)  # the server's counters lag a little
    after = await asyncio.to_thread(scrape, server.metrics_url, bucket)
    counts = delta(before, after)
    classes = RequestClasses.from_counts(counts).per(messages)
    return {
        "counts": {k: v for k, v in counts.items() if ":" not in k},
        "rate": messages / elapsed,
        "publish_rate": messages / (published - started),
        "per_message": classes.as_dict(),
        "usd_per_million": classes.dollars_per_million(),
    }


async def pq013_case(
    server: SeaweedFS, publishers: int, args: argparse.Namespace
) -> dict[str, Any]:
    """drain_case's workload on pawn-queue 0.1.3, in its own venv (bench/queue/pq013_runner.py)."""
    bucket = f"gc013-{uuid.uuid4().hex[:16]}"
    server.create_bucket(bucket)
    spec = {
        "action": "listen_drain",
        "s3": s3_settings(server.endpoint),
        "metrics_url": server.metrics_url,
        "bucket": bucket,
        "publishers": publishers,
        "messages": args.messages,
        "consumers": CONSUMERS,
        "interval": args.pq013_interval,
        "timeout": args.pq013_timeout,
    }
    result: dict[str, Any] = await run_child(
        PQ013_PYTHON, PQ013_RUNNER, spec, args.pq013_timeout + 120
    )
    counts = result.pop("requests")
    classes = RequestClasses.from_counts(counts).per(max(1, result["acked"]))
    return {
        **result,
        "counts": {k: v for k, v in counts.items() if ":" not in k},
        "per_message": classes.as_dict(),
        "usd_per_million": classes.dollars_per_million(),
    }


SERIAL_BLOCK = 20  # publishes per turn of a mode in the serial case


async def serial_case(server: SeaweedFS, count: int) -> dict[str, float]:
    """Mean latency of ``count`` serial publishes per mode, group commit on and off open side
    by side and taking turns of SERIAL_BLOCK publishes, so that a change in the host's speed
    during the run weighs on both alike."""
    async with contextlib.AsyncExitStack() as stack:
        producers = {}
        for mode in ("on", "off"):
            bucket = f"gc-{uuid.uuid4().hex[:16]}"
            server.create_bucket(bucket)
            pq = await stack.enter_async_context(
                await PawnQueue.from_config(config(server, bucket, mode == "on"))
            )
            await pq.create_topic(TOPIC)
            producers[mode] = await pq.register_producer("bench")
            await producers[mode].publish(TOPIC, {"warm": True})
        seconds = dict.fromkeys(producers, 0.0)
        for start in range(0, count, SERIAL_BLOCK):
            for mode, producer in producers.items():
                started = time.perf_counter()
                for n in range(start, min(start + SERIAL_BLOCK, count)):
                    await producer.publish(TOPIC, {"n": n})
                seconds[mode] += time.perf_counter() - started
        return {mode: total / count for mode, total in seconds.items()}


async def run_all(server: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    drain: dict[str, list[dict[str, Any]]] = {}
    serial: dict[str, list[float]] = {"on": [], "off": []}
    skipped: dict[str, str] = {}
    for run in range(args.runs):
        modes = MODES if run % 2 == 0 else MODES[::-1]
        for publishers in args.publishers:
            for mode in modes:
                if mode == "0.1.3" and (args.no_pq013 or mode in skipped):
                    continue
                case = f"{publishers}-{mode}"
                try:
                    if mode == "0.1.3":
                        result = await pq013_case(server, publishers, args)
                    else:
                        result = await drain_case(server, publishers, args.messages, mode == "on")
                except Skipped as exc:
                    skipped[mode] = str(exc)
                    print(case, "skipped:", exc, flush=True)
                    continue
                drain.setdefault(case, []).append(result)
                bounded = " (bounded)" if result.get("bounded") else ""
                print(case, f"{result['rate']:,.0f} msg/s{bounded}", result["counts"], flush=True)
        for mode, latency in (await serial_case(server, args.serial)).items():
            serial[mode].append(latency)
    return {"drain": drain, "serial": serial, "skipped": skipped}


def summary(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    lines = [
        f"single publish() calls, {args.messages} messages, {CONSUMERS} consumers draining, "
        f"SeaweedFS (median of {args.runs}):",
        f"{'publishers':>10} {'group commit':>12} {'msg/s':>8} {'PUT/LIST':>9} {'GET/HEAD':>9} "
        f"{'$/million':>9}",
    ]
    medians: dict[str, Any] = {}
    for publishers in args.publishers:
        for mode in MODES:
            runs = results["drain"].get(f"{publishers}-{mode}")
            if not runs:
                continue
            bounded = sum(bool(r.get("bounded")) for r in runs)
            m = {
                "rate": median(r["rate"] for r in runs),
                "put_list": median(r["per_message"]["put_list"] for r in runs),
                "get_head": median(r["per_message"]["get_head"] for r in runs),
                "usd": median(r["usd_per_million"] for r in runs),
                "bounded_runs": bounded,
            }
            medians[f"{publishers}-{mode}"] = m
            note = (
                f"  (bounded at {args.pq013_timeout:g} s: {bounded} of {len(runs)})"
                if bounded
                else ""
            )
            lines.append(
                f"{publishers:>10} {mode:>12} {m['rate']:8,.0f} {m['put_list']:9.3f} "
                f"{m['get_head']:9.3f} {m['usd']:9.2f}{note}"
            )
        for name in TARGETS:
            first, _, second = name.partition(" / ")
            a, b = medians.get(f"{publishers}-{first}"), medians.get(f"{publishers}-{second}")
            if a is None or b is None:
                continue
            ratio = a["rate"] / b["rate"]
            # The first key keeps its name from before 0.1.3 was measured here.
            key = f"{publishers}-ratio" if second == "off" else f"{publishers}-ratio-013"
            medians[key] = ratio
            lines.append(f"{'':>10} {name:>12} {ratio:7.2f}x")
    targets = {}
    for name, goal in TARGETS.items():
        key = "32-ratio" if name.endswith("off") else "32-ratio-013"
        if key in medians:
            measured = medians[key]
            targets[f"32 publishers, {name} msg/s"] = {
                "goal": f">= {goal:g}x",
                "measured": round(measured, 2),
                "met": measured >= goal,
            }
            lines.append(
                f"target 32 publishers {name} >= {goal:g}x: {measured:.2f}x "
                f"({'met' if measured >= goal else 'not met'})"
            )
    medians["targets"] = targets
    for mode, reason in results.get("skipped", {}).items():
        lines.append(f"{mode}: skipped: {reason}")
    on, off = median(results["serial"]["on"]), median(results["serial"]["off"])
    medians["serial"] = {"on_ms": on * 1000, "off_ms": off * 1000, "ratio": on / off}
    lines.append(
        f"serial publish() latency: on {on * 1000:.2f} ms, off {off * 1000:.2f} ms "
        f"(on / off {on / off:.2f})"
    )
    return "\n".join(lines), medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--serial", type=int, default=300)
    parser.add_argument("--publishers", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument(
        "--pq013-timeout", type=float, default=60.0, help="bound of a 0.1.3 drain, seconds"
    )
    parser.add_argument(
        "--pq013-interval", type=float, default=1.0, help="0.1.3's polling.interval_seconds"
    )
    parser.add_argument("--no-pq013", action="store_true", help="leave pawn-queue 0.1.3 out")
    parser.add_argument("--out", type=Path, default=RESULTS / "group_commit.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pq-bench-gc-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            results = asyncio.run(run_all(server, args))
        finally:
            server.stop()
    text, medians = summary(results, args)
    print(text)
    document = {
        "results": results,
        "medians": medians,
        "targets": medians.pop("targets"),
        "settings": vars(args) | {"out": str(args.out)},
        "host": {"python": platform.python_version()},
        "git": git_state(),
        "table": text,
    }
    write_results(args.out, document)


if __name__ == "__main__":
    main()
