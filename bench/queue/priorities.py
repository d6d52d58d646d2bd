"""Priorities under a backlog (issue 43's target), on a local directory: 10,000 messages of
priority 0 queued (single ``publish()`` calls, 32 at a time: group commit's objects), 4
consumer processes running ``listen()`` on them (a handler of 20 ms), then 100 messages of
priority 9 published at once (concurrent calls) from another process. Measured: how many
of the 10,000 were handled before the last of the 100 (target: fewer than half), and the
100's publish-to-handler latency (target: p50 within 1 s). The baseline, in the same run:
the 100 published with priority 0.

Run from the repository root::

    .venv/bin/python -m bench.queue.priorities            # 3 runs of each case
    .venv/bin/python -m bench.queue.priorities --runs 1

Prints a table; writes ``bench/results/priorities.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, git_state, median, percentile, write_results
from pawn_queue import Message, PawnQueue

BACKLOG, URGENT, CONSUMERS = 10_000, 100, 4
HANDLER_SECONDS = 0.02
TOPIC = "work"


async def consumer(config: dict[str, Any], out: Path) -> None:
    """Handle messages until SIGTERM; one line per message in ``out``, as handled."""
    async with await PawnQueue.from_config(config) as pq:
        consumer = await pq.register_consumer(f"c-{out.stem}", topics=[TOPIC])
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        with out.open("a") as lines:

            async def handler(message: Message) -> None:
                await asyncio.sleep(HANDLER_SECONDS)
                await message.ack()
                sent = float(message.attributes.get("sent", "nan"))
                lines.write(json.dumps([message.priority, sent, time.time()]) + "\n")
                lines.flush()

            listening = asyncio.create_task(consumer.listen(handler))
            await stop.wait()
            listening.cancel()  # a graceful stop: running handlers finish
            await asyncio.gather(listening, return_exceptions=True)


async def publish(
    config: dict[str, Any], count: int, priority: int, concurrent: int, *, stamped: bool
) -> None:
    """``count`` messages, ``concurrent`` calls at a time; with ``stamped``, each says when
    it was sent (``attributes["sent"]``)."""
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer(f"p{priority}")

        async def one(n: int) -> None:
            attributes = {"sent": repr(time.time())} if stamped else {}
            await producer.publish(TOPIC, n, attributes=attributes, priority=priority)

        for start in range(0, count, concurrent):
            await asyncio.gather(*(one(n) for n in range(start, min(start + concurrent, count))))


def handled(root: Path) -> list[list[float]]:
    rows = []
    for path in root.glob("handled-*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def wait_for(root: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(handled(root)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(handled(root))} handled of {count} after {timeout} s")
        time.sleep(0.05)


def run_case(urgent_priority: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pq-priorities-") as tmp:
        root = Path(tmp)
        config = {"backend": "filesystem", "filesystem": {"path": str(root / "store")}}
        asyncio.run(publish(config, BACKLOG, 0, concurrent=32, stamped=False))
        children = [
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "bench.queue.priorities", "--child"),
                    *(json.dumps(config), str(root / f"handled-{n}.jsonl")),
                ]
            )
            for n in range(CONSUMERS)
        ]
        try:
            wait_for(root, BACKLOG // 20, 300)  # the consumers are at work
            asyncio.run(publish(config, URGENT, urgent_priority, concurrent=URGENT, stamped=True))
            wait_for(root, BACKLOG + URGENT, 600)
        finally:
            for child in children:
                child.send_signal(signal.SIGTERM)
            codes = [child.wait(timeout=120) for child in children]
        rows = sorted(handled(root), key=lambda row: row[2])
    if codes != [0] * CONSUMERS:
        raise SystemExit(f"a consumer failed: {codes}")
    urgent = [row for row in rows if not math.isnan(row[1])]  # those with a send time
    last_urgent = max(row[2] for row in urgent)
    latencies = sorted(row[2] - row[1] for row in urgent)
    return {
        "urgent_priority": urgent_priority,
        "handled": len(rows),
        "backlog_handled_before_last_urgent": sum(
            1 for row in rows if math.isnan(row[1]) and row[2] < last_urgent
        ),
        "urgent_p50_seconds": percentile(latencies, 50),
        "urgent_p99_seconds": percentile(latencies, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "priorities.json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        config, out = args.child
        asyncio.run(consumer(json.loads(config), Path(out)))
        return
    runs = [run_case(p) for _ in range(args.runs) for p in (9, 0)]
    summary = {}
    for priority in (9, 0):
        rows = [r for r in runs if r["urgent_priority"] == priority]
        for row in rows:
            print(json.dumps(row))
        summary[f"priority_{priority}"] = {
            key: median(r[key] for r in rows)
            for key in ("backlog_handled_before_last_urgent", "urgent_p50_seconds")
        }
        print(f"the {URGENT} at priority {priority}:", json.dumps(summary[f"priority_{priority}"]))
    write_results(args.out, {"git": git_state(), "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
