"""Raw store throughput: PUT, GET, HEAD, LIST (a page of 100) and DELETE operations per second
for the memory, filesystem and S3 stores, with 1 and 32 requests in flight.

The S3 store runs against a SeaweedFS this script starts on loopback ports. Each figure is the
median of ``--runs`` runs; objects are ~200 bytes. Run from the repository root::

    python -m bench.micro.store                      # all stores, 1 s per measurement
    python -m bench.micro.store --stores s3 --ops 2000 --out /tmp/s3.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import SecretStr

from bench.common import RESULTS, write_results
from pawn_queue.config import S3Config
from pawn_queue.store.base import Store

OPS = ("PUT", "GET", "HEAD", "LIST", "DELETE")
STORES = ("memory", "filesystem", "s3")
PAYLOAD = b'{"pad": "' + b"x" * 189 + b'"}'  # 200 bytes of JSON
PAGE = 100


@dataclass(frozen=True)
class Budget:
    """How long one measurement lasts: a duration, or a number of operations."""

    seconds: float | None
    ops: int | None

    def done(self, started: float, count: int) -> bool:
        if self.ops is not None:
            return count >= self.ops
        assert self.seconds is not None
        return time.perf_counter() - started >= self.seconds


async def _rate(
    op: Callable[[], Awaitable[bool]], concurrency: int, budget: Budget
) -> tuple[float, int]:
    """Run ``op`` from ``concurrency`` workers until the budget is spent or ``op`` says it
    has nothing left; return operations per second and the count."""
    count = 0
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal count
        while not budget.done(started, count):
            count += 1  # claimed before the await so workers never overshoot an op budget
            if not await op():
                count -= 1
                return

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return (count / elapsed if elapsed > 0 else 0.0), count


async def run_once(store: Store, run: str, concurrency: int, budget: Budget) -> dict[str, float]:
    """One pass over every operation on fresh keys under ``run/``."""
    rates: dict[str, float] = {}
    keys: list[str] = []
    numbers = itertools.count()

    async def put() -> bool:
        key = f"bench/{run}/{next(numbers):09d}.json"
        await store.put(key, PAYLOAD)
        keys.append(key)
        return True

    rates["PUT"], _ = await _rate(put, concurrency, budget)
    while len(keys) < 2 * PAGE:  # LIST needs full pages even after a slow PUT run
        await put()

    async def get() -> bool:
        await store.get(random.choice(keys))
        return True

    async def head() -> bool:
        await store.head(random.choice(keys))
        return True

    ordered = sorted(keys)

    async def list_page() -> bool:
        start = random.choice(ordered[: -PAGE - 1])
        page = await store.list(f"bench/{run}/", start_after=start, limit=PAGE)
        assert len(page) == PAGE, len(page)
        return True

    rates["keys"] = len(keys)  # the LIST prefix's size: listing cost grows with it
    rates["GET"], _ = await _rate(get, concurrency, budget)
    rates["HEAD"], _ = await _rate(head, concurrency, budget)
    rates["LIST"], _ = await _rate(list_page, concurrency, budget)

    pending = list(keys)
    random.shuffle(pending)

    async def delete() -> bool:
        if not pending:
            return False
        await store.delete(pending.pop())
        return True

    # Every key written is deleted: the budget does not cut this one short.
    rates["DELETE"], _ = await _rate(delete, concurrency, Budget(None, len(pending)))
    return rates


def _open_store(name: str, stack: ExitStack) -> Store:
    if name == "memory":
        from pawn_queue.store.memory import MemoryStore

        return MemoryStore()
    if name == "filesystem":
        from pawn_queue.store.filesystem import FilesystemStore

        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="pq-bench-fs-"))
        return FilesystemStore(Path(root) / "store")
    if name == "s3":
        from tests.servers.seaweedfs import SeaweedFS

        from pawn_queue.store.s3 import S3Store

        data = stack.enter_context(tempfile.TemporaryDirectory(prefix="pq-bench-sw-"))
        server = SeaweedFS.start(Path(data))
        stack.callback(server.stop)
        server.create_bucket("bench-store")
        return S3Store(
            S3Config(
                endpoint_url=server.endpoint,
                bucket_name="bench-store",
                aws_access_key_id=SecretStr("bench"),
                aws_secret_access_key=SecretStr("bench-secret"),
            )
        )
    raise SystemExit(f"unknown store {name!r}; choose from {', '.join(STORES)}")


async def _bench_store(
    name: str, concurrencies: list[int], runs: int, budget: Budget
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with ExitStack() as stack:
        store = _open_store(name, stack)
        try:
            await run_once(store, "warmup", 4, Budget(None, 50))
            for concurrency in concurrencies:
                samples: dict[str, list[float]] = {op: [] for op in (*OPS, "keys")}
                for run in range(runs):
                    rates = await run_once(store, f"c{concurrency}-r{run}", concurrency, budget)
                    for op, rate in rates.items():
                        samples[op].append(rate)
                for op in OPS:
                    rows.append(
                        {
                            "store": name,
                            "op": op,
                            "concurrency": concurrency,
                            "ops_per_s": round(statistics.median(samples[op]), 1),
                            "runs": [round(r, 1) for r in samples[op]],
                            **({"prefix_keys": samples["keys"]} if op == "LIST" else {}),
                        }
                    )
                    print(
                        f"  {name:<10} {op:<6} c={concurrency:<3} "
                        f"{statistics.median(samples[op]):>10,.0f} ops/s",
                        file=sys.stderr,
                    )
        finally:
            await store.close()
    return rows


def _table(rows: list[dict[str, object]], concurrencies: list[int]) -> str:
    header = f"{'store':<11}{'op':<8}" + "".join(f"{f'{c} in flight':>14}" for c in concurrencies)
    lines = [header, "-" * len(header)]
    by_key = {(r["store"], r["op"], r["concurrency"]): r["ops_per_s"] for r in rows}
    for store in dict.fromkeys(r["store"] for r in rows):
        for op in OPS:
            cells = "".join(f"{by_key.get((store, op, c), 0):>14,.0f}" for c in concurrencies)
            lines.append(f"{store!s:<11}{op:<8}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seconds", type=float, help="per measurement (default 1.0)")
    group.add_argument("--ops", type=int, help="operations per measurement instead of time")
    parser.add_argument("--concurrency", default="1,32", help="requests in flight, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--out", type=Path, default=RESULTS / "store.json")
    args = parser.parse_args(argv)

    budget = Budget(None, args.ops) if args.ops else Budget(args.seconds or 1.0, None)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    started = time.perf_counter()
    rows: list[dict[str, object]] = []
    for name in stores:
        rows += asyncio.run(_bench_store(name, concurrencies, args.runs, budget))

    table = _table(rows, concurrencies)
    print(table)
    report = {
        "benchmark": "store",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "payload_bytes": len(PAYLOAD),
        "list_page": PAGE,
        "budget": {"seconds": budget.seconds, "ops": budget.ops},
        "runs": args.runs,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": rows,
        "table": table,
    }
    write_results(args.out, report)
    print(f"\nwrote {args.out} in {report['wall_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
