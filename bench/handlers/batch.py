"""Batch handlers against per-message ``listen()``: batch objects of 100 drained on the memory
store and on S3 (one SeaweedFS on loopback), in the same run.

Each measurement publishes ``--messages`` as ``publish_batch`` objects of ``--batch`` (4
writes in flight) on a fresh memory store or bucket, then one consumer (its own PawnQueue,
``max_messages_per_poll`` = the batch size, the setting that drains batch objects fastest
per message) drains them:

- per-message: ``listen(handler)``, the handler acks its message (``await message.ack()``);
- batch: ``listen(handler, batch=N)``, the handler takes the list and returns, and the
  listener acks the list together (one batch in flight: the next poll starts once the
  handler returned and its acks wait only for their write);
- batch-c4: the same with ``concurrency=4``: up to 4 batches in flight, one poll claiming
  for all free slots.

Both count acks with the same observer (its ``settled`` hook): msg/s from the start of
``listen()`` to the last ack; a run fails on a duplicate or a message never acked.
``cpu_us_per_msg``: this process's CPU time over the drain, per message. Runs alternate the
order of the modes; the ratios are of the medians of one run of this script, and
``targets`` compares them with the goal (batch >= 3x per-message on each store).

Run from the repository root::

    .venv/bin/python -m bench.handlers.batch                 # 3 runs, ~2 min
    .venv/bin/python -m bench.handlers.batch --runs 1 --stores memory

Prints a table; writes ``bench/results/batch_handlers.json``.
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

from bench.common import RESULTS, git_state, median, publish_many, s3_settings, write_results
from pawn_queue import Message, PawnQueue
from pawn_queue.config import load_config
from pawn_queue.observe import Observer, Outcome

TOPIC = "bench"
MODES = ("per-message", "batch", "batch-c4")
BATCH_MODES = {"batch": None, "batch-c4": 4}  # listen(batch=N, concurrency=...)
PUBLISH_IN_FLIGHT = 4
GOAL_RATIO = 3.0


class Acks(Observer):
    """Counts acks until ``expected`` distinct messages are acked."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.ids: set[str] = set()
        self.acks = 0
        self.finished = 0.0
        self.done = asyncio.Event()

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.acks += 1
        self.ids.add(message.id)
        if len(self.ids) >= self.expected and not self.done.is_set():
            self.finished = time.perf_counter()
            self.done.set()


def config(store: str, server: SeaweedFS | None, batch: int) -> dict[str, Any]:
    polling = {"max_messages_per_poll": batch}
    if store == "memory":
        return {"backend": "memory", "memory": {"name": uuid.uuid4().hex}, "polling": polling}
    assert server is not None
    bucket = f"bh-{uuid.uuid4().hex[:16]}"
    server.create_bucket(bucket)
    s3 = {**s3_settings(server.endpoint), "bucket_name": bucket}
    return {"backend": "s3", "s3": s3, "polling": polling}


async def drain_case(
    store: str, server: SeaweedFS | None, mode: str, messages: int, batch: int
) -> dict[str, Any]:
    """One drain on a fresh store: msg/s and CPU per message."""
    settings = config(store, server, batch)
    objects = -(-messages // batch)
    acks = Acks(objects * batch)

    async def per_message(message: Message) -> None:
        await message.ack()

    async def batch_handler(batch_of: list[Message]) -> None:
        return None  # returning acks them all

    async with contextlib.AsyncExitStack() as stack:
        publisher = await stack.enter_async_context(await PawnQueue.from_config(settings))
        await publisher.create_topic(TOPIC)
        producer = await publisher.register_producer("bench")

        def publish(i: int) -> Any:
            return producer.publish_batch(TOPIC, [{"n": i * batch + j} for j in range(batch)])

        await publish_many(publish, objects, PUBLISH_IN_FLIGHT)
        pq = await stack.enter_async_context(PawnQueue(load_config(settings), observers=[acks]))
        consumer = await pq.register_consumer("drain", [TOPIC])
        cpu = time.process_time()
        started = time.perf_counter()
        if mode in BATCH_MODES:
            listening = asyncio.create_task(
                consumer.listen(batch_handler, batch=batch, concurrency=BATCH_MODES[mode])
            )
        else:
            listening = asyncio.create_task(consumer.listen(per_message))
        waiting = asyncio.create_task(acks.done.wait())
        try:
            await asyncio.wait({listening, waiting}, timeout=300, return_when="FIRST_COMPLETED")
            cpu = time.process_time() - cpu
            if listening.done():
                listening.result()  # it failed: say why
            if not acks.done.is_set():
                raise TimeoutError(f"{len(acks.ids)} of {acks.expected} acked in 300 s")
        finally:
            waiting.cancel()
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
    if acks.acks != len(acks.ids):
        raise AssertionError(f"{acks.acks - len(acks.ids)} duplicate acks")
    count = len(acks.ids)
    return {
        "messages": count,
        "msgs_per_s": round(count / (acks.finished - started), 1),
        "cpu_us_per_msg": round(cpu / count * 1e6, 2),
    }


async def run_all(server: SeaweedFS | None, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {}
    for run in range(args.runs):
        modes = MODES if run % 2 == 0 else MODES[::-1]
        for store in args.stores:
            messages = args.messages_memory if store == "memory" else args.messages_s3
            for mode in modes:
                result = await drain_case(store, server, mode, messages, args.batch)
                results.setdefault(f"{store}-{mode}", []).append(result)
                print(
                    f"run {run + 1} {store} {mode}: {result['msgs_per_s']:,.0f} msg/s, "
                    f"{result['cpu_us_per_msg']} us CPU/msg",
                    flush=True,
                )
    return results


def summary(
    results: dict[str, list[dict[str, Any]]], args: argparse.Namespace
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    lines = [
        f"batch objects of {args.batch}, one consumer, polls of {args.batch} "
        f"(median of {args.runs} runs):",
        f"{'store':>7} {'handler':>12} {'msg/s':>9} {'CPU us/msg':>11}",
    ]
    medians: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for store in args.stores:
        for mode in MODES:
            runs = results[f"{store}-{mode}"]
            m = {
                "msgs_per_s": median(r["msgs_per_s"] for r in runs),
                "cpu_us_per_msg": median(r["cpu_us_per_msg"] for r in runs),
            }
            medians[f"{store}-{mode}"] = m
            lines.append(
                f"{store:>7} {mode:>12} {m['msgs_per_s']:9,.0f} {m['cpu_us_per_msg']:11.2f}"
            )
        base = medians[f"{store}-per-message"]["msgs_per_s"]
        for mode in BATCH_MODES:
            ratio = medians[f"{store}-{mode}"]["msgs_per_s"] / base
            medians[f"{store}-{mode}-ratio"] = round(ratio, 2)
            met = ratio >= GOAL_RATIO
            targets[f"{store}: {mode} / per-message msg/s"] = {
                "goal": f">= {GOAL_RATIO:g}x",
                "measured": round(ratio, 2),
                "met": met,
            }
            label = f"{mode} / per-message"
            lines.append(f"{store:>7} {label:>24} {ratio:.2f}x ({'met' if met else 'not met'})")
    return "\n".join(lines), medians, targets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--messages-memory", type=int, default=100_000)
    parser.add_argument("--messages-s3", type=int, default=20_000)
    parser.add_argument("--stores", nargs="+", choices=("memory", "s3"), default=["memory", "s3"])
    parser.add_argument("--out", type=Path, default=RESULTS / "batch_handlers.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pq-bench-bh-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs") if "s3" in args.stores else None
        try:
            results = asyncio.run(run_all(server, args))
        finally:
            if server is not None:
                server.stop()
    text, medians, targets = summary(results, args)
    print(text)
    document = {
        "results": results,
        "medians": medians,
        "targets": targets,
        "settings": vars(args) | {"out": str(args.out)},
        "host": {"python": platform.python_version()},
        "git": git_state(),
        "table": text,
    }
    write_results(args.out, document)


if __name__ == "__main__":
    main()
