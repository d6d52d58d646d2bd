"""The main job on the embedded default: a local directory as the queue, no server.

A producer publishes orders with a progress bar; several consumer workers process them
concurrently; a fraction of the orders fail and end in dead letter. Prints a summary.

    python examples/demo.py [--orders 3000] [--workers 4] [--dir ./queue-demo]
    pawn-queue demo [--orders 3000] [--workers 4] [--dir ./queue-demo]

``--dir`` must be new, empty, or the queue of an earlier run, of which only what the demo
wrote is deleted; any other directory is refused, untouched.

Needs Rich (the ``cli`` extra); the core does not import this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pawn_queue import Message, PawnQueue, PawnQueueConfig
from pawn_queue._protocol import layout
from pawn_queue.cli.demo_dirs import claim_directory
from pawn_queue.store._fs_support import RESERVED

ITEMS = ["widget", "gadget", "gizmo", "doohickey", "sprocket"]
TOPIC = "orders"
# What the demo's queue writes at the top of its directory (_probe/: earlier versions).
QUEUE_ENTRIES = (
    TOPIC,
    layout.REGISTRY.rstrip("/"),
    layout.NOTIFY.rstrip("/"),
    layout.PROBE.rstrip("/"),
    RESERVED,
)


class OrderFailed(Exception):
    """A simulated processing failure: the order goes to dead letter."""


async def run(orders: int, workers: int, directory: Path, fail_rate: float) -> None:
    console = Console()
    url = f"file://{directory}"
    config = PawnQueueConfig.from_url(url, polling={"interval_seconds": 0.05})
    async with PawnQueue(config) as pq:
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer("order-service")
        rng = random.Random(7)
        expected_failures: set[int] = set()

        started = time.perf_counter()
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        with progress:
            task = progress.add_task("publishing orders", total=orders)
            semaphore = asyncio.Semaphore(32)

            async def publish(order_id: int) -> None:
                fail = rng.random() < fail_rate
                if fail:
                    expected_failures.add(order_id)
                order = {
                    "order_id": order_id,
                    "item": rng.choice(ITEMS),
                    "quantity": rng.randint(1, 5),
                    "price": round(rng.uniform(2, 200), 2),
                    "fail": fail,
                }
                async with semaphore:
                    await producer.publish(TOPIC, order)
                progress.advance(task)

            await asyncio.gather(*(publish(i) for i in range(orders)))
        publish_seconds = time.perf_counter() - started

        processed: Counter[int] = Counter()
        revenue: Counter[str] = Counter()
        done = asyncio.Event()
        dead_lettered = 0

        def settled() -> int:
            return sum(processed.values()) + dead_lettered

        async def handle(message: Message) -> None:
            nonlocal dead_lettered
            order = message.payload
            await asyncio.sleep(0.001)  # stands in for real work
            if order["fail"]:
                dead_lettered += 1
                if settled() >= orders:
                    done.set()
                raise OrderFailed(f"order {order['order_id']} was rejected")
            await message.ack()
            processed[order["order_id"]] += 1
            revenue[order["item"]] += order["quantity"] * order["price"]
            if settled() >= orders:
                done.set()

        started = time.perf_counter()
        consumers = [
            await pq.register_consumer(f"worker-{i}", topics=[TOPIC]) for i in range(workers)
        ]
        tasks = [asyncio.create_task(c.listen(handle)) for c in consumers]
        await done.wait()
        consume_seconds = time.perf_counter() - started
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        remaining = await pq.store.list(f"{TOPIC}/messages/")
        dead = await pq.store.list(f"{TOPIC}/dead-letter/")

    table = Table(title=f"pawn-queue demo on {directory}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    duplicates = sum(n - 1 for n in processed.values() if n > 1)
    table.add_row("published", str(orders))
    table.add_row("processed (acked)", str(len(processed)))
    table.add_row("dead-lettered", f"{len(dead)} (expected {len(expected_failures)})")
    table.add_row("duplicates", str(duplicates))
    table.add_row("left pending", str(len(remaining)))
    table.add_row("consumer workers", str(workers))
    table.add_row("publish rate", f"{orders / publish_seconds:,.0f} msg/s")
    table.add_row("consume rate", f"{orders / consume_seconds:,.0f} msg/s")
    console.print(table)
    top = Table(title="revenue by item")
    top.add_column("item")
    top.add_column("revenue", justify="right")
    for item, amount in revenue.most_common():
        top.add_row(item, f"{amount:,.2f}")
    console.print(top)
    ok = len(processed) + len(dead) == orders and not remaining and duplicates == 0
    if not ok:
        raise SystemExit("demo FAILED: messages lost or duplicated")


def run_demo(
    orders: int = 3000,
    workers: int = 4,
    directory: Path = Path("queue-demo"),
    fail_rate: float = 0.05,
) -> None:
    """Run the demo with its queue in ``directory`` (a directory holding anything but an
    earlier demo queue is refused: :func:`~pawn_queue.cli.demo_dirs.claim_directory`). Raises
    SystemExit on failure."""
    # Failed orders are expected here and counted in the summary; keep their log lines quiet.
    logging.getLogger("pawn_queue.consumer").setLevel(logging.CRITICAL)
    directory = directory.resolve()
    claim_directory(directory, QUEUE_ENTRIES)
    asyncio.run(run(orders, workers, directory, fail_rate))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--orders", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("queue-demo"),
        help="queue directory: new, empty, or an earlier demo's (then cleared)",
    )
    parser.add_argument("--fail-rate", type=float, default=0.05)
    args = parser.parse_args(argv)
    run_demo(args.orders, args.workers, args.dir, args.fail_rate)


if __name__ == "__main__":
    main()
