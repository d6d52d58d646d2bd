"""Group commit on S3 (one SeaweedFS on loopback): throughput and cost of single
``publish()`` calls with group commit on and off, in the same run.

1. drain: ``--publishers`` tasks (1, 4, 32) call ``publish()`` one message at a time on one
   producer while 4 consumers (``listen()``, acking) drain the topic, all in one process;
   messages/s from the first publish to the last ack, and the S3 requests the server
   counted for the bucket (publish + consume + ack, change signals included), as USD per
   million messages at AWS list prices (PUT/LIST $5, GET/HEAD $0.40 per million).
2. serial: one caller publishing ``--serial`` messages one after the other: mean latency.

Run from the repository root::

    .venv/bin/python -m bench.group_commit            # 3 runs, ~3 min
    .venv/bin/python -m bench.group_commit --runs 1 --messages 1000

Prints a table; writes ``bench/results/group_commit.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    RequestClasses,
    delta,
    git_state,
    median,
    scrape,
)

from pawn_queue import Message, PawnQueue

sys.path.insert(0, str(REPO))  # tests.servers.seaweedfs
from tests.servers.seaweedfs import SeaweedFS

TOPIC = "bench"
CONSUMERS = 4


def config(server: SeaweedFS, bucket: str, group_commit: bool) -> dict[str, Any]:
    return {
        "backend": "s3",
        "s3": {
            "endpoint_url": server.endpoint,
            "bucket_name": bucket,
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench-secret",
            "use_ssl": False,
        },
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
        acked = 0
        done = asyncio.Event()

        async def handle(message: Message) -> None:
            nonlocal acked
            await message.ack()
            acked += 1
            if acked == messages:
                done.set()

        listeners = [asyncio.create_task(c.listen(handle)) for c in consumers]
        started = time.perf_counter()
        share = [messages // publishers + (i < messages % publishers) for i in range(publishers)]

        async def publish(count: int) -> None:
            for n in range(count):
                await producer.publish(TOPIC, {"n": n})

        await asyncio.gather(*(publish(count) for count in share))
        published = time.perf_counter()
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - started
        for listener in listeners:
            listener.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
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


async def serial_case(server: SeaweedFS, count: int, group_commit: bool) -> float:
    bucket = f"gc-{uuid.uuid4().hex[:16]}"
    server.create_bucket(bucket)
    async with await PawnQueue.from_config(config(server, bucket, group_commit)) as pq:
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer("bench")
        await producer.publish(TOPIC, {"warm": True})
        started = time.perf_counter()
        for n in range(count):
            await producer.publish(TOPIC, {"n": n})
        return (time.perf_counter() - started) / count


async def run_all(server: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    drain: dict[str, list[dict[str, Any]]] = {}
    serial: dict[str, list[float]] = {"on": [], "off": []}
    for run in range(args.runs):
        modes = (True, False) if run % 2 == 0 else (False, True)
        for publishers in args.publishers:
            for on in modes:
                case = f"{publishers}-{'on' if on else 'off'}"
                result = await drain_case(server, publishers, args.messages, on)
                drain.setdefault(case, []).append(result)
                print(case, f"{result['rate']:,.0f} msg/s", result["counts"], flush=True)
        for on in modes:
            serial["on" if on else "off"].append(await serial_case(server, args.serial, on))
    return {"drain": drain, "serial": serial}


def summary(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    lines = [
        f"single publish() calls, {args.messages} messages, {CONSUMERS} consumers draining, "
        f"SeaweedFS (median of {args.runs}):",
        f"{'publishers':>10} {'group commit':>12} {'msg/s':>8} {'PUT/LIST':>9} {'GET/HEAD':>9} "
        f"{'$/million':>9}",
    ]
    medians: dict[str, Any] = {}
    for publishers in args.publishers:
        for mode in ("on", "off"):
            runs = results["drain"][f"{publishers}-{mode}"]
            m = {
                "rate": median(r["rate"] for r in runs),
                "put_list": median(r["per_message"]["put_list"] for r in runs),
                "get_head": median(r["per_message"]["get_head"] for r in runs),
                "usd": median(r["usd_per_million"] for r in runs),
            }
            medians[f"{publishers}-{mode}"] = m
            lines.append(
                f"{publishers:>10} {mode:>12} {m['rate']:8,.0f} {m['put_list']:9.3f} "
                f"{m['get_head']:9.3f} {m['usd']:9.2f}"
            )
        ratio = medians[f"{publishers}-on"]["rate"] / medians[f"{publishers}-off"]["rate"]
        medians[f"{publishers}-ratio"] = ratio
        lines.append(f"{'':>10} {'on / off':>12} {ratio:7.2f}x")
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
        "--out", type=Path, default=REPO / "bench" / "results" / "group_commit.json"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pq-bench-gc-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            results = asyncio.run(run_all(server, args))
        finally:
            server.stop()
    text, medians = summary(results, args)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "results": results,
        "medians": medians,
        "settings": vars(args) | {"out": str(args.out)},
        "host": {"python": platform.python_version()},
        "git": git_state(),
        "table": text,
    }
    args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
