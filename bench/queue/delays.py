"""Delay accuracy: when delayed, requeued and retried messages reach a listening consumer,
against when they were asked for, on a local directory and on S3 (one SeaweedFS).

Cases, each on every store, with one ``listen()`` consumer at default settings in the
publishing process (one PawnQueue):

1. delayed: ``--messages`` publishes (one at a time) with delays drawn uniformly from
   ``--min-delay``..``--max-delay`` s (seeded); due = ``time.time()`` just before the
   ``publish`` call + delay, carried in the payload; error = the handler's ``time.time()``
   - due. Reported: p50/p95/max (and min) of the error, early arrivals (error < 0: the
   message was visible before its delay had passed), late ones (error > 0.5 s), also by
   band of delays.
2. requeue: ``--requeue-each`` messages per delay d of ``--requeue-delays``; the handler
   calls ``nack(requeue=True, delay=d)`` on the first receive and acks the second; observed
   = second receive - the ``nack`` call.
3. retry: ``listen(handler, retry=Retry(base_delay=...))`` with a handler that raises on
   the first ``--retry-failures`` receives; observed = each receive - the failed one before
   it, against ``Retry.delay(receive_count)``.

Run from the repository root::

    .venv/bin/python -m bench.queue.delays                  # both stores, ~1 min
    .venv/bin/python -m bench.queue.delays --quick          # fewer messages, shorter delays
    .venv/bin/python -m bench.queue.delays --stores filesystem

Prints a table; writes ``bench/results/delays.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import common
from bench.queue.support import filesystem_config, queues
from pawn_queue import Message, PawnQueue, Retry

logger = logging.getLogger("bench.queue.delays")

STORES = ("filesystem", "s3")
LATE = 0.5  # seconds after due that still count as on time
SLACK = 75.0  # past the 60 s backfill: a message found only by a full poll still counts
BANDS = ((0.0, 2.0), (2.0, 5.0), (5.0, float("inf")))  # delay bands (s), as the margin is 2 s
FAIL_MARK = "bench: failing on purpose"


@dataclass(frozen=True)
class Sizes:
    messages: int = 200
    min_delay: float = 0.2
    max_delay: float = 10.0
    seed: int = 20240611
    requeue_delays: tuple[float, ...] = (0.5, 1.0, 2.0)
    requeue_each: int = 20
    retry_messages: int = 20
    retry_base: float = 0.2
    retry_failures: int = 2


QUICK = Sizes(messages=60, max_delay=5.0, requeue_each=8, retry_messages=8)


# -- measurements -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _listening(
    pq: PawnQueue,
    topic: str,
    handler: Callable[[Message], Awaitable[None]],
    retry: Retry | None = None,
) -> AsyncIterator[None]:
    """A consumer of a new ``topic`` listening with ``handler`` for the span of the context."""
    await pq.create_topic(topic)
    consumer = await pq.register_consumer(f"{topic}-consumer", topics=[topic])
    task = asyncio.create_task(consumer.listen(handler, retry=retry))
    try:
        await asyncio.sleep(0.5)  # past the first poll: the consumer waits, as in use
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _until(done: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), seconds)
    return done.is_set()


async def case_delayed(pq: PawnQueue, s: Sizes) -> dict[str, Any]:
    rng = random.Random(s.seed)
    delays = [round(rng.uniform(s.min_delay, s.max_delay), 3) for _ in range(s.messages)]
    errors: dict[int, float] = {}
    duplicates = 0
    done = asyncio.Event()

    async def handler(message: Message) -> None:
        nonlocal duplicates
        arrived = time.time()
        i = int(message.payload["i"])
        await message.ack()
        if i in errors:
            duplicates += 1
            return
        errors[i] = arrived - float(message.payload["due"])
        if len(errors) == len(delays):
            done.set()

    producer = await pq.register_producer("delays-producer")
    async with _listening(pq, "delayed", handler):
        started = time.monotonic()
        for i, delay in enumerate(delays):
            sent = time.time()
            await producer.publish("delayed", {"i": i, "due": sent + delay}, delay=delay)
        publish_s = time.monotonic() - started
        await _until(done, s.max_delay + SLACK)
    bands = []
    for low, high in BANDS:
        band = [i for i, d in enumerate(delays) if low <= d < high]
        if band:
            picked = [errors[i] for i in band if i in errors]
            upper = high if high != float("inf") else None
            bands.append({"delays_s": [low, upper], **_stats(picked, len(band))})
    return {
        "delays_s": [min(delays), max(delays)],
        "publish_s": round(publish_s, 2),
        "duplicates": duplicates,
        **_stats(list(errors.values()), len(delays)),
        "late_over_s": LATE,
        "bands": bands,
    }


async def case_requeue(pq: PawnQueue, s: Sizes) -> list[dict[str, Any]]:
    nacked: dict[int, float] = {}
    observed: dict[int, float] = {}
    total = s.requeue_each * len(s.requeue_delays)
    done = asyncio.Event()

    async def handler(message: Message) -> None:
        i = int(message.payload["i"])
        now = time.time()
        if i not in nacked:
            nacked[i] = now
            await message.nack(requeue=True, delay=float(message.payload["d"]))
            return
        observed.setdefault(i, now - nacked[i])
        await message.ack()
        if len(observed) == total:
            done.set()

    producer = await pq.register_producer("requeue-producer")
    asked = [d for d in s.requeue_delays for _ in range(s.requeue_each)]
    async with _listening(pq, "requeue", handler):
        for i, d in enumerate(asked):
            await producer.publish("requeue", {"i": i, "d": d})
        await _until(done, max(s.requeue_delays) + SLACK)
    rows = []
    for d in s.requeue_delays:
        errors = [observed[i] - d for i, a in enumerate(asked) if a == d and i in observed]
        rows.append({"asked_s": d, **_stats(errors, s.requeue_each)})
    return rows


async def case_retry(pq: PawnQueue, s: Sizes) -> list[dict[str, Any]]:
    policy = Retry(base_delay=s.retry_base)
    receives: dict[int, list[float]] = {}
    done = asyncio.Event()

    async def handler(message: Message) -> None:
        i = int(message.payload["i"])
        times = receives.setdefault(i, [])
        times.append(time.time())
        if len(times) <= s.retry_failures:
            raise RuntimeError(FAIL_MARK)
        await message.ack()
        if sum(len(t) > s.retry_failures for t in receives.values()) == s.retry_messages:
            done.set()

    producer = await pq.register_producer("retry-producer")
    async with _listening(pq, "retry", handler, retry=policy):
        for i in range(s.retry_messages):
            await producer.publish("retry", {"i": i})
        await _until(done, policy.delay(s.retry_failures) * s.retry_failures + SLACK)
    rows = []
    for k in range(1, s.retry_failures + 1):  # the k-th failed receive and the next one
        asked = policy.delay(k)
        gaps = [t[k] - t[k - 1] - asked for t in receives.values() if len(t) > k]
        rows.append({"after_receive": k, "asked_s": asked, **_stats(gaps, s.retry_messages)})
    return rows


def _stats(errors: list[float], sent: int) -> dict[str, Any]:
    """Errors (observed - asked, seconds) of ``sent`` messages: percentiles, and how many
    came early or late."""
    out: dict[str, Any] = {"sent": sent, "received": len(errors)}
    for name, value in (
        ("p50_s", common.percentile(errors, 50)),
        ("p95_s", common.percentile(errors, 95)),
        ("max_s", max(errors, default=None)),
        ("min_s", min(errors, default=None)),
    ):
        out[name] = None if value is None or value != value else round(value, 3)
    out["early"] = sum(e < 0 for e in errors)
    out["late"] = sum(e > LATE for e in errors)
    return out


async def run_store(name: str, config: dict[str, Any], s: Sizes) -> dict[str, Any]:
    result: dict[str, Any] = {"store": name}
    for case, run in (("delayed", case_delayed), ("requeue", case_requeue), ("retry", case_retry)):
        logger.info("%s: %s ...", name, case)
        started = time.perf_counter()
        async with queues([config]) as (pq,):
            result[case] = await run(pq, s)
        result[f"{case}_seconds"] = round(time.perf_counter() - started, 1)
    return result


# -- report -------------------------------------------------------------------------------------


def _ms(value: float | None, plus: float = 0.0) -> str:
    return "-" if value is None else f"{(value + plus) * 1000:,.0f}"


def table(results: list[dict[str, Any]], s: Sizes) -> str:
    out: list[str] = []

    def section(title: str, header: str, lines: list[str]) -> None:
        out.extend(["", title, header, "-" * len(header), *lines])

    def errors(r: dict[str, Any]) -> str:
        return (
            f"{_ms(r['p50_s']):>8}{_ms(r['p95_s']):>8}{_ms(r['max_s']):>8}{_ms(r['min_s']):>8}"
            f"{r['early']:>7}{r['late']:>6}{r['received']:>6}/{r['sent']}"
        )

    head = f"{'p50':>8}{'p95':>8}{'max':>8}{'min':>8}{'early':>7}{'late':>6}{'got':>7}"
    section(
        f"1. publish(delay=d), d in {s.min_delay:g}-{s.max_delay:g} s: arrival - due, ms "
        f"(late: > {LATE:g} s)",
        f"{'store':<12}{'delays s':<10}" + head,
        [
            f"{r['store']:<12}{band:<10}" + errors(row)
            for r in results
            if "delayed" in r
            for band, row in [
                *((_band(b["delays_s"]), b) for b in r["delayed"]["bands"]),
                ("all", r["delayed"]),
            ]
        ],
    )
    section(
        "2. nack(requeue=True, delay=d): observed = next receive - nack call; p50..min of "
        "observed - asked, ms",
        f"{'store':<12}{'asked s':<10}{'obs p50':>9}" + head,
        [
            f"{r['store']:<12}{q['asked_s']:<10g}{_ms(q['p50_s'], q['asked_s']):>9}" + errors(q)
            for r in results
            if "requeue" in r
            for q in r["requeue"]
        ],
    )
    section(
        f"3. listen(retry=Retry(base_delay={s.retry_base:g})): observed = next receive - failed "
        "one; p50..min of observed - asked, ms",
        f"{'store':<12}{'after #':>7}{'asked s':>9}{'obs p50':>9}" + head,
        [
            f"{r['store']:<12}{q['after_receive']:>7}{q['asked_s']:>9g}"
            f"{_ms(q['p50_s'], q['asked_s']):>9}" + errors(q)
            for r in results
            if "retry" in r
            for q in r["retry"]
        ],
    )
    for r in results:
        if "error" in r:
            out.extend(["", f"{r['store']}: ERROR {r['error']}"])
    out.extend(["", *NOTES])
    return "\n".join(out).lstrip("\n")


def _band(bounds: list[float | None]) -> str:
    low, high = bounds
    return f"{low:g}-{high:g}" if high is not None else f">={low:g}"


NOTES = (
    "Notes: one PawnQueue per store and case publishes and listens (defaults). Times are",
    "time.time() in this process: due = just before the publish call + delay; requeue from",
    "just before nack(); retry from the handler's start on the failed receive. Early: before",
    "the asked time (must be 0 with clocks in agreement). S3: SeaweedFS (weed mini, loopback).",
)


# -- main ---------------------------------------------------------------------------------------


async def run_all(stores: list[str], s: Sizes, tmp: Path, server: Any) -> list[dict[str, Any]]:
    results = []
    for name in stores:
        if name == "s3":
            bucket = "delays"
            await asyncio.to_thread(server.create_bucket, bucket)
            config: dict[str, Any] = {
                "backend": "s3",
                "s3": {**common.s3_settings(server.endpoint), "bucket_name": bucket},
            }
        else:
            config = filesystem_config(tmp / "queue")
        try:
            results.append(await run_store(name, config, s))
        except Exception as exc:
            logger.exception("%s failed", name)
            results.append({"store": name, "error": f"{type(exc).__name__}: {exc}"})
    return results


def _quiet_planned_failures(record: logging.LogRecord) -> bool:
    """The retry case's handler fails on purpose: keep those errors out of the output."""
    return FAIL_MARK not in record.getMessage()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages, shorter delays")
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated subset")
    parser.add_argument("--messages", type=int, help="delayed messages (default 200)")
    parser.add_argument("--max-delay", type=float, help="longest delay, s (default 10)")
    parser.add_argument("--seed", type=int, help="seed of the delays")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "delays.json")
    args = parser.parse_args(argv)

    sizes = QUICK if args.quick else Sizes()
    for field in ("messages", "max_delay", "seed"):
        if getattr(args, field) is not None:
            sizes = replace(sizes, **{field: getattr(args, field)})
    if sizes.messages < 1 or not 0 < sizes.min_delay <= sizes.max_delay:
        parser.error("needs --messages >= 1 and --max-delay >= 0.2")
    stores = [name.strip() for name in args.stores.split(",")]
    if unknown := set(stores) - set(STORES):
        parser.error(f"unknown store(s) {', '.join(sorted(unknown))}; choose from {STORES}")

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("pawn_queue").setLevel(logging.ERROR)
    logging.getLogger("pawn_queue.consumer").addFilter(_quiet_planned_failures)
    for name in list(os.environ):  # a developer's PAWNQUEUE_*/AWS_* must not reconfigure us
        if name.startswith(common.SCRUBBED_ENV_PREFIXES):
            del os.environ[name]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tests.servers.seaweedfs import SeaweedFS

    started = time.perf_counter()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pq-bench-delays-")))
        server = None
        if "s3" in stores:
            (tmp / "tmp").mkdir()  # weed mini leaves a work directory in $TMPDIR
            os.environ["TMPDIR"] = str(tmp / "tmp")
            server = SeaweedFS.start(tmp / "seaweedfs")
            stack.callback(server.stop)
        results = asyncio.run(run_all(stores, sizes, tmp, server))

    text = table(results, sizes)
    print(text)
    report = {
        "benchmark": "delays",
        **common.host(),
        "sizes": asdict(sizes),
        "quick": args.quick,
        "git": common.git_state(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": results,
        "table": text,
    }
    common.write_results(args.out, report)
    print(f"\nwrote {args.out} in {report['wall_seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
