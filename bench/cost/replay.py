"""Replay on S3 (one SeaweedFS on loopback): ``seek`` back one hour over a topic's retained
messages.

Each run, on a fresh bucket: a topic with a two-hour replay window and one subscription;
``--publishers`` tasks publish ``--messages`` messages (group commit: objects of about 30)
while ``--consumers`` ``listen()``-ers of the subscription drain and ack them all. Then
``seek(topic, subscription, now - 1 h)`` with the listeners still running: the time from the
call to the first message delivered again (target: within 2 s), to ``seek`` returning, and
to every message delivered again; the S3 requests of the seek and its redelivery (counted
by the server) per message. Each message must come back exactly once: the run fails loudly
otherwise.

Run from the repository root::

    .venv/bin/python -m bench.cost.replay               # 3 runs of 100,000 messages, ~5 min
    .venv/bin/python -m bench.cost.replay --quick       # 1 run of 5,000

Prints a table; writes ``bench/results/replay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
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
from pawn_queue import Message, PawnQueue

TOPIC, SUBSCRIPTION = "bench", "replayed"
TARGET_FIRST_SECONDS = 2.0


class Deliveries:
    """What the listeners received: each message number once per phase, and when."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.seen: set[int] = set()
        self.duplicates = 0
        self.first: float | None = None
        self.complete = asyncio.Event()

    def reset(self) -> None:
        self.seen.clear()
        self.first = None
        self.complete.clear()

    async def handle(self, message: Message) -> None:
        number = message.payload["n"]
        if self.first is None:
            self.first = time.perf_counter()
        if number in self.seen:
            self.duplicates += 1
        self.seen.add(number)
        await message.ack()
        if len(self.seen) == self.expected:
            self.complete.set()


async def run_once(server: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    bucket = f"replay-{uuid.uuid4().hex[:16]}"
    server.create_bucket(bucket)
    config = {"backend": "s3", "s3": {**s3_settings(server.endpoint), "bucket_name": bucket}}
    deliveries = Deliveries(args.messages)
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic(TOPIC, replay_window_seconds=7200)
        await pq.create_subscription(TOPIC, SUBSCRIPTION)
        producer = await pq.register_producer("bench")
        consumers = [
            await pq.register_consumer(f"c{i}", [TOPIC], subscription=SUBSCRIPTION)
            for i in range(args.consumers)
        ]
        listeners = [asyncio.create_task(c.listen(deliveries.handle)) for c in consumers]
        try:
            started = time.perf_counter()
            share = [
                args.messages // args.publishers + (i < args.messages % args.publishers)
                for i in range(args.publishers)
            ]
            offsets = [sum(share[:i]) for i in range(args.publishers)]

            async def publish(first: int, count: int) -> None:
                for n in range(first, first + count):
                    await producer.publish(TOPIC, {"n": n})

            await asyncio.gather(*(publish(o, c) for o, c in zip(offsets, share, strict=True)))
            published = time.perf_counter() - started
            async with asyncio.timeout(600):
                await deliveries.complete.wait()
            drained = time.perf_counter() - started
            if deliveries.duplicates:
                raise AssertionError(f"{deliveries.duplicates} duplicates before the seek")
            await pq.runtime.background.done()

            deliveries.reset()
            await asyncio.sleep(1.5)  # the server's counters lag a little
            before = await asyncio.to_thread(scrape, server.metrics_url, bucket)
            seek_started = time.perf_counter()
            await pq.seek(TOPIC, SUBSCRIPTION, datetime.now(UTC) - timedelta(hours=1))
            seek_returned = time.perf_counter() - seek_started
            async with asyncio.timeout(600):
                await deliveries.complete.wait()
            redelivered = time.perf_counter() - seek_started
            assert deliveries.first is not None
            first = deliveries.first - seek_started
        finally:
            for task in listeners:
                task.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
        await pq.runtime.background.done()
    if deliveries.duplicates or len(deliveries.seen) != args.messages:
        raise AssertionError(
            f"after the seek: {len(deliveries.seen)} of {args.messages} messages, "
            f"{deliveries.duplicates} duplicates"
        )
    await asyncio.sleep(1.5)
    after = await asyncio.to_thread(scrape, server.metrics_url, bucket)
    counts = delta(before, after)
    classes = RequestClasses.from_counts(counts).per(args.messages)
    return {
        "publish_seconds": published,
        "drain_seconds": drained,
        "first_redelivery_seconds": first,
        "seek_returned_seconds": seek_returned,
        "all_redelivered_seconds": redelivered,
        "redelivered_per_second": args.messages / redelivered,
        "seek_and_redelivery_per_message": classes.as_dict(),
        "seek_and_redelivery_usd_per_million": classes.dollars_per_million(),
        "counts": {k: v for k, v in counts.items() if ":" not in k},
    }


def summary(runs: list[dict[str, Any]], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    keys = (
        "publish_seconds",
        "drain_seconds",
        "first_redelivery_seconds",
        "seek_returned_seconds",
        "all_redelivered_seconds",
        "redelivered_per_second",
        "seek_and_redelivery_usd_per_million",
    )
    medians = {key: median(run[key] for run in runs) for key in keys}
    lines = [
        f"seek back one hour over {args.messages:,} retained messages (SeaweedFS, "
        f"{args.publishers} publishers, {args.consumers} listeners, one process; medians of "
        f"{len(runs)} runs)",
        "",
        "| measure | median | runs |",
        "|---|---|---|",
    ]
    for key in keys:
        shown = ", ".join(f"{run[key]:.3g}" for run in runs)
        lines.append(f"| {key} | {medians[key]:.3g} | {shown} |")
    met = medians["first_redelivery_seconds"] <= TARGET_FIRST_SECONDS
    lines.append("")
    lines.append(
        f"target: first redelivery within {TARGET_FIRST_SECONDS:g} s: "
        f"{'met' if met else 'NOT met'} ({medians['first_redelivery_seconds']:.3f} s)"
    )
    medians["target_met"] = met
    return "\n".join(lines), medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--publishers", type=int, default=32)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="1 run of 5,000 messages")
    parser.add_argument("--out", type=Path, default=RESULTS / "replay.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.messages = 1, 5_000
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pq-bench-replay-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            for _ in range(args.runs):
                runs.append(asyncio.run(run_once(server, args)))
        finally:
            server.stop()
    text, medians = summary(runs, args)
    print(text)
    document = {
        "runs": runs,
        "medians": medians,
        "settings": vars(args) | {"out": str(args.out)},
        "git": git_state(),
        "table": text,
    }
    write_results(args.out, document)


if __name__ == "__main__":
    main()
