"""A rate limit against store latency, in one process (no server): two queues on one memory
store whose requests to the rate's keys take ``latency`` seconds (0.5x to 1.5x, uniform),
two tasks each entering ``rate_limit("api", "20/s")`` 30 times. Per latency: permits a
second against 20, and the most used inside any one-second span (the bound is 25: the rate
plus a chunk). Run from the repository root::

    .venv/bin/python -m bench.handlers.rate_latency          # 3 runs per latency

Prints a line per run; writes ``bench/results/rate_latency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from statistics import median
from typing import Any, TypeVar

from bench.common import RESULTS, git_state, write_results
from bench.handlers.limits import most_in_any_second
from pawn_queue import PawnQueue
from pawn_queue.config import PawnQueueConfig
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")
RATE = 20
TAKES = 30  # per task; 2 tasks in each of 2 queues: 120 permits, 6 s at 20/s


class SlowRates(StoreWrapper):
    """Requests to ``_rates/`` keys take about ``latency`` seconds."""

    def __init__(self, inner: MemoryStore, latency: float) -> None:
        super().__init__(inner)
        self.latency = latency

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.key.startswith("_rates/"):
            await asyncio.sleep(self.latency * random.uniform(0.5, 1.5))
        return await run()


async def run_once(latency: float) -> dict[str, Any]:
    store = SlowRates(MemoryStore(), latency)
    config = PawnQueueConfig.from_url("memory://")
    entered: list[float] = []

    async def take(queue: PawnQueue) -> None:
        for _ in range(TAKES):
            async with queue.rate_limit("api", f"{RATE}/s"):
                entered.append(time.monotonic())

    async with PawnQueue(config, store=store) as a, PawnQueue(config, store=store) as b:
        await asyncio.gather(*(take(q) for q in (a, b) for _ in range(2)))
    seconds = max(entered) - min(entered)
    return {
        "latency": latency,
        "permits": len(entered),
        "per_second": (len(entered) - 1) / seconds,
        "most_in_a_second": most_in_any_second(entered),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.0, 0.05, 0.1, 0.3, 0.6])
    parser.add_argument("--out", type=Path, default=RESULTS / "rate_latency.json")
    args = parser.parse_args()
    runs = []
    for latency in args.latencies:
        for _ in range(args.runs):
            row = asyncio.run(run_once(latency))
            print(row)
            runs.append(row)
    summary = {
        str(latency): {
            "per_second_median": median(r["per_second"] for r in runs if r["latency"] == latency),
            "most_in_a_second_max": max(
                r["most_in_a_second"] for r in runs if r["latency"] == latency
            ),
        }
        for latency in args.latencies
    }
    print(summary)
    write_results(args.out, {"git": git_state(), "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
