"""Queue benchmarks: this pawn-queue against pawn-queue 0.1.3 (PyPI) on one SeaweedFS started
once per run, and the local-directory store against vsqs 0.3, all through public APIs.

Cases (each figure the median of ``--runs`` runs):

1. publish: msgs/s one at a time and 32 in flight (ours and 0.1.3 on S3, ours on a directory)
2. drain: N published messages consumed and acked by 1 and 4 consumers, each its own
   PawnQueue, all in one process and event loop (0.1.3: likewise, in its runner process)
3. requests per message of publish + drain, from SeaweedFS's per-bucket request counters,
   and USD per million messages at AWS list prices; for this version also split by step
   (publish, and drain: claim + read + ack)
4. idle: requests per minute of an idle ``listen()`` on 1 and 10 topics, USD per month
5. latency: publish-to-handler p50/p95 with one publish every 50 ms
6. backlog (``--backlog``): one ``poll()`` + acks at 100 and 100,000 pending messages
7. batch: ``publish_batch`` objects of 100 drained by ``listen()``, with polls of 10 (the
   default) by 1 and 4 consumers and polls of 100 by 1 consumer, published before or while
   the consumers listen, on S3 and on the memory store: msgs/s, requests per message, USD,
   and the goals in ``targets``
8. local: the filesystem store against vsqs 0.3 at a 2,000 and a 10,000-message backlog
9. wake: publish-to-handler latency of an idle ``listen()`` (defaults) when another process
   publishes after idle gaps of 1-60 s (``--wake-gaps``), on a directory and on S3

Run from the repository root::

    .venv/bin/python -m bench.queue.compare            # everything but --backlog, < 17 min
    .venv/bin/python -m bench.queue.compare --quick    # smaller sizes, ~3.5 min
    .venv/bin/python -m bench.queue.compare --cases drain,idle --backlog

0.1.3 runs in ``.venv-pq013`` (bench/queue/pq013_runner.py) and vsqs in ``.venv-vsqs``
(bench/queue/vsqs_runner.py); a case whose venv is missing is skipped with a note. The cases
are in bench/queue/throughput.py (1-3, 6, 8), batch.py (7) and waiting.py (4-5, 9), the
plumbing in support.py, the printed tables in report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import common
from bench.queue.batch import case_batch
from bench.queue.report import table
from bench.queue.support import CASES, DEFAULT_CASES, QUICK, Bench, Sizes, Skipped
from bench.queue.throughput import case_backlog, case_drain, case_local, case_publish
from bench.queue.waiting import case_idle, case_latency, case_wake

logger = logging.getLogger("bench.queue")


# -- main ---------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Bench], Awaitable[Any]]] = {
    "publish": case_publish,
    "drain": case_drain,
    "batch": case_batch,
    "idle": case_idle,
    "latency": case_latency,
    "wake": case_wake,
    "local": case_local,
    "backlog": case_backlog,
}


async def run_cases(b: Bench, cases: list[str], timings: dict[str, float]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for case in cases:
        logger.info("case %s ...", case)
        started = time.perf_counter()
        try:
            results[case] = await asyncio.wait_for(RUNNERS[case](b), 900)
        except Skipped as exc:
            results[case] = {"skipped": str(exc)}
        except Exception as exc:
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}"}
        timings[case] = round(time.perf_counter() - started, 1)
        logger.info("case %s done in %.1f s", case, timings[case])
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (~3 min)")
    parser.add_argument("--backlog", action="store_true", help="add case 6 (100,000 pending)")
    parser.add_argument("--cases", help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--runs", type=int, help="runs per figure (default 3)")
    parser.add_argument(
        "--wake-gaps", help="idle gaps (s) of case wake, e.g. 1,5,10 (default 1,5,10,20,40,60)"
    )
    parser.add_argument("--out", type=Path, default=common.RESULTS / "queue.json")
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else Sizes()
    if args.runs:
        sizes = replace(sizes, runs=args.runs)
    if args.wake_gaps:
        try:
            gaps = tuple(float(g) for g in args.wake_gaps.split(","))
        except ValueError:
            parser.error(f"--wake-gaps: got {args.wake_gaps!r}, want seconds like 1,5,10")
        sizes = replace(sizes, wake_gaps=gaps)
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else list(DEFAULT_CASES)
    if args.backlog and "backlog" not in cases:
        cases.append("backlog")
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {CASES}")

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("pawn_queue").setLevel(logging.ERROR)
    for name in list(os.environ):  # a developer's PAWNQUEUE_*/AWS_* must not reconfigure us
        if name.startswith(common.SCRUBBED_ENV_PREFIXES):
            del os.environ[name]
    # SIGTERM unwinds like Ctrl-C, so SeaweedFS is stopped and temp dirs are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tests.servers.seaweedfs import SeaweedFS

    started = time.perf_counter()
    timings: dict[str, float] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pq-bench-queue-")))
        # weed mini leaves a work directory in $TMPDIR after it stops: keep it in ours.
        (tmp / "tmp").mkdir()
        os.environ["TMPDIR"] = str(tmp / "tmp")
        server = SeaweedFS.start(tmp / "seaweedfs")
        stack.callback(server.stop)
        bench = Bench(server, sizes, tmp)
        results = asyncio.run(run_cases(bench, cases, timings))

    text = table(results)
    print(text)
    report = {
        "benchmark": "queue",
        **common.host(),
        "sizes": {k: v for k, v in vars(sizes).items()},
        "quick": args.quick,
        "cases": cases,
        "git": common.git_state(),
        "case_seconds": timings,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "prices_usd_per_million": {
            "put_copy_post_list": common.PRICE_PUT_LIST,
            "get_head": common.PRICE_GET_HEAD,
            "delete": 0.0,
        },
        "results": results,
        "table": text,
    }
    common.write_results(args.out, report)
    print(f"\nwrote {args.out} in {report['wall_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
