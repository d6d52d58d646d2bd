"""Limits across processes (issue 43's targets), on a local directory:

- concurrency: ``--processes`` processes of 8 tasks each run blocks of 0.1 s under
  ``concurrency_limit("api", 3)`` for ``--seconds``: blocks a second against 3 handlers'
  worth (30/s), and the most running at once (a shared counter under a file lock);
- rate: ``--processes`` processes of 4 tasks each enter ``rate_limit("api", "20/s")`` as
  often as it lets them for ``--seconds``: permits against 20 a second, the most inside any
  one-second span, and the store requests per permit (each process counts its own).

Each process starts at the same wall-clock time and stops at the same one. Run from the
repository root::

    .venv/bin/python -m bench.handlers.limits                # 3 runs of 60 s each case
    .venv/bin/python -m bench.handlers.limits --runs 1 --seconds 20

Prints a table; writes ``bench/results/limits.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.workers.counter import count

from bench.common import RESULTS, git_state, median, write_results
from pawn_queue import PawnQueue
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore

LIMIT, BLOCK_SECONDS, LIMIT_TASKS = 3, 0.1, 8
RATE, RATE_TASKS = 20, 4
START_DELAY = 8.0  # seconds for every process to start before the common start


async def child(
    case: str, config: dict[str, Any], start: float, end: float, counter: Path
) -> dict[str, Any]:
    """One process's run: the times it entered, and its store requests."""
    counting = CountingStore(open_store(load_config(config)))
    async with PawnQueue(load_config(config), store=counting) as pq:
        times: list[float] = []

        async def block() -> None:
            async with pq.concurrency_limit("api", LIMIT):
                count(counter, +1)
                await asyncio.sleep(BLOCK_SECONDS)
                count(counter, -1)
            times.append(time.time())

        async def permit() -> None:
            async with pq.rate_limit("api", f"{RATE}/s"):
                times.append(time.time())

        async def task(step: Any) -> None:
            while time.time() < end:
                await step()

        await asyncio.sleep(max(0.0, start - time.time()))
        counting.reset()
        step, tasks = (block, LIMIT_TASKS) if case == "concurrency" else (permit, RATE_TASKS)
        await asyncio.gather(*(task(step) for _ in range(tasks)))
        requests = dict(counting.reset())
    return {"times": [t for t in times if t <= end], "requests": requests}


def most_in_any_second(times: list[float]) -> int:
    times, most, first = sorted(times), 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def run_case(case: str, processes: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pq-limits-") as tmp:
        root = Path(tmp)
        config = {"backend": "filesystem", "filesystem": {"path": str(root / "store")}}
        (root / "store").mkdir()
        (root / "run.counter").write_text("{}")
        start = time.time() + START_DELAY
        end = start + seconds
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.handlers.limits",
                    "--child",
                    case,
                    json.dumps(config),
                    str(start),
                    str(end),
                    str(root / f"{n}.json"),
                ]
            )
            for n in range(processes)
        ]
        codes = [c.wait(timeout=seconds + 120) for c in children]
        if codes != [0] * processes:
            raise SystemExit(f"a child failed: {codes}")
        results = [json.loads((root / f"{n}.json").read_text()) for n in range(processes)]
        counter = json.loads((root / "run.counter").read_text())
    times = [t for r in results for t in r["times"]]
    requests = sum(sum(r["requests"].values()) for r in results)
    row: dict[str, Any] = {"case": case, "processes": processes, "seconds": seconds}
    if case == "concurrency":
        ideal = LIMIT / BLOCK_SECONDS * seconds
        row |= {"blocks": len(times), "ideal": ideal, "ratio": len(times) / ideal}
        row |= {"most_at_once": counter.get("most", 0)}
    else:
        ideal = RATE * seconds
        row |= {"permits": len(times), "ideal": ideal, "ratio": len(times) / ideal}
        row |= {"most_in_a_second": most_in_any_second(times)}
    row["requests_per_unit"] = requests / max(1, len(times))
    by_kind: dict[str, int] = {}
    for result in results:
        for kind, n in result["requests"].items():
            by_kind[kind] = by_kind.get(kind, 0) + n
    row["requests_per_unit_by_kind"] = {k: n / max(1, len(times)) for k, n in by_kind.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS / "limits.json")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, config, start, end, out = args.child
        counter = Path(out).parent / "run.counter"
        result = asyncio.run(child(case, json.loads(config), float(start), float(end), counter))
        Path(out).write_text(json.dumps(result))
        return
    runs = [
        run_case(case, args.processes, args.seconds)
        for _ in range(args.runs)
        for case in ("concurrency", "rate")
    ]
    summary = {}
    for case in ("concurrency", "rate"):
        rows = [r for r in runs if r["case"] == case]
        summary[case] = {
            "ratio_median": median(r["ratio"] for r in rows),
            "requests_per_unit_median": median(r["requests_per_unit"] for r in rows),
        }
        for r in rows:
            print(json.dumps(r))
        print(case, json.dumps(summary[case]))
    write_results(args.out, {"git": git_state(), "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
