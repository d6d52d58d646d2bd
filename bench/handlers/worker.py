"""The worker against ``listen()``, and ``--processes 2`` against ``--processes 1``, on a
local directory (one-message objects, published before each run).

1. overhead: messages/s of a no-op handler run by ``listen(concurrency=8)`` (the handler
   acks) and by the worker (an :class:`~pawn_queue.App` subscriber with ``concurrency=8``,
   run by the worker's own event loop code with its message log at INFO to a file, its
   store-health wrapper, stopped by SIGTERM). Each run is a fresh process; the rate is
   counted from the first delivery to the last settlement.
2. processes: ``pawn-queue worker bench.handlers.worker_app:spin --processes N`` (real processes,
   the supervisor), each message 2 ms of pure Python; the rate is counted from the first
   handler's start to the last handler's end (wall clock), so process start-up is left out.

Run from the repository root::

    .venv/bin/python -m bench.handlers.worker            # 3 runs of each, ~2 min
    .venv/bin/python -m bench.handlers.worker --runs 1 --messages 1000

Prints a table; writes ``bench/results/worker.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    RESULTS,
    git_state,
    last_json_line,
    median,
    scrubbed_env,
    write_results,
)
from pawn_queue import App, Message, PawnQueue
from pawn_queue.config import parse_url
from pawn_queue.observe import Observer, Outcome

TOPIC = "bench"
CONCURRENCY = 8


class Clock(Observer):
    """First delivery to the ``target``-th settlement; calls ``done`` then."""

    def __init__(self, target: int, done: Any) -> None:
        self.target, self.done = target, done
        self.first: float | None = None
        self.count = 0
        self.last = 0.0

    def delivered(self, message: Message) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.count += 1
        if self.count == self.target:
            self.last = time.perf_counter()
            self.done()

    def rate(self) -> float:
        assert self.first is not None
        return self.target / (self.last - self.first)


async def publish(
    url: str, count: int, payload: dict[str, Any], *, group_commit: bool = False
) -> None:
    """``count`` messages, 16 publishes at a time: one-message objects, or with group
    commit the batch objects those concurrent calls share."""
    config = parse_url(url) | {"producer": {"group_commit": group_commit}}
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer("bench")
        slots = asyncio.Semaphore(16)

        async def one() -> None:
            async with slots:
                await producer.publish(TOPIC, payload)

        await asyncio.gather(*(one() for _ in range(count)))


async def child_listen(url: str, count: int) -> float:
    listening: asyncio.Task[None] | None = None
    clock = Clock(count, lambda: listening and listening.cancel())
    async with PawnQueue(PawnQueue.from_url(url).config, observers=[clock]) as pq:
        consumer = await pq.register_consumer("bench", [TOPIC])

        async def noop(message: Message) -> None:
            await message.ack()

        listening = asyncio.create_task(consumer.listen(noop, concurrency=CONCURRENCY))
        with contextlib.suppress(asyncio.CancelledError):
            await listening
    return clock.rate()


def child_worker(url: str, count: int, log: Path) -> float:
    from bench.handlers.worker_app import noop
    from pawn_queue.service.logs import TextFormatter
    from pawn_queue.service.runner import WorkerOptions, run_app

    app = App(url, name="bench")
    app.subscriber(TOPIC, concurrency=CONCURRENCY)(noop)
    clock = Clock(count, lambda: os.kill(os.getpid(), signal.SIGTERM))
    app.add_observer(clock)
    handler = logging.FileHandler(log)  # the worker's message log, at INFO, as text
    handler.setFormatter(TextFormatter())
    root = logging.getLogger("pawn_queue")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    code = asyncio.run(run_app(app, WorkerOptions()))
    assert code == 0, code
    return clock.rate()


def run_child(case: str, url: str, count: int, log: Path) -> float:
    argv = [sys.executable, "-m", "bench.handlers.worker", "--child", case, "--url", url]
    argv += ["--messages", str(count), "--log", str(log)]
    done = subprocess.run(
        argv, cwd=REPO, env=scrubbed_env(), capture_output=True, text=True, timeout=600
    )
    if done.returncode:
        raise RuntimeError(f"{case} failed: {done.stderr[-2000:]}")
    return float(last_json_line(done.stdout)["rate"])


def run_processes(url: str, count: int, processes: int, spin: float) -> float:
    asyncio.run(publish(url, count, {"spin": spin}))
    argv = [
        sys.executable,
        "-m",
        "pawn_queue",
        "--url",
        url,
        "worker",
        "bench.handlers.worker_app:spin",
    ]
    argv += ["--topic", TOPIC, "--processes", str(processes), "--concurrency", "1"]
    worker = subprocess.Popen(
        argv, cwd=REPO, env=scrubbed_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert worker.stdout is not None
    spans = []
    for line in worker.stdout:
        start, end = map(float, line.split())
        spans.append((start, end))
        if len(spans) == count:
            break
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=120)
    return count / (max(e for _, e in spans) - min(s for s, _ in spans))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--cpu-messages", type=int, default=1500)
    parser.add_argument("--spin", type=float, default=0.002)
    parser.add_argument("--out", type=Path, default=RESULTS / "worker.json")
    parser.add_argument("--child", choices=("listen", "worker"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--log", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child == "listen":
            rate = asyncio.run(child_listen(args.url, args.messages))
        else:
            rate = child_worker(args.url, args.messages, args.log)
        print(json.dumps({"rate": rate}))
        return
    rates: dict[str, list[float]] = {"p1": [], "p2": []}
    with tempfile.TemporaryDirectory(prefix="pq-bench-worker-") as tmp:
        for run in range(args.runs):
            for objects in ("single", "batch"):
                for case in ("listen", "worker") if run % 2 == 0 else ("worker", "listen"):
                    url = f"file://{tmp}/{case}-{objects}-{run}"
                    asyncio.run(
                        publish(url, args.messages, {"n": 1}, group_commit=objects == "batch")
                    )
                    rate = run_child(case, url, args.messages, Path(tmp) / "log")
                    rates.setdefault(f"{case}-{objects}", []).append(rate)
            for processes in (1, 2) if run % 2 == 0 else (2, 1):
                url = f"file://{tmp}/p{processes}-{run}"
                rates[f"p{processes}"].append(
                    run_processes(url, args.cpu_messages, processes, args.spin)
                )
    medians = {case: median(values) for case, values in rates.items()}
    overhead = {
        objects: 1 - medians[f"worker-{objects}"] / medians[f"listen-{objects}"]
        for objects in ("single", "batch")
    }
    scaling = medians["p2"] / medians["p1"]
    lines = [
        f"no-op handler, {args.messages} messages, concurrency {CONCURRENCY}, local directory "
        f"(median of {args.runs}):",
    ]
    for objects, label in (("single", "one-message objects"), ("batch", "group-commit batches")):
        lines += [
            f"  {label}:",
            f"    listen()   {medians[f'listen-{objects}']:9,.0f} msg/s",
            f"    worker     {medians[f'worker-{objects}']:9,.0f} msg/s",
            f"    worker overhead: {overhead[objects]:.1%} (target <= 10%)",
        ]
    lines += [
        f"{args.spin * 1000:g} ms of pure Python per message, {args.cpu_messages} messages:",
        f"  --processes 1 {medians['p1']:7,.0f} msg/s   runs {rates['p1']}",
        f"  --processes 2 {medians['p2']:7,.0f} msg/s   runs {rates['p2']}",
        f"  ratio: {scaling:.2f}x (target >= 1.6x)",
    ]
    text = "\n".join(lines)
    print(text)
    result = {
        "rates": rates,
        "medians": medians,
        "worker_overhead": overhead,
        "processes_ratio": scaling,
        "settings": vars(args) | {"out": str(args.out), "log": None},
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "git": git_state(),
        "table": text,
    }
    write_results(args.out, result)


if __name__ == "__main__":
    main()
