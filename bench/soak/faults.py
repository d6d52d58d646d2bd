"""Soak benchmark: producers and consumers for N minutes through injected network faults, then
a drain and an audit of every message.

S3 runs on a SeaweedFS started here, behind ``tests.servers.fault_proxy.FaultProxy`` with a mix of
faults (500, 503 SlowDown, resets, answers lost after the write was applied, slow answers,
and stalls past the request timeout) on ``--fault-rate`` of all requests. Every producer
and consumer has its own PawnQueue (its own connections, leases and signals), all as asyncio
tasks in this process. Producers publish one message at a time at ``--rate`` messages per
second in all (pausing while ``--max-backlog`` are unacked); consumers ``poll()`` and ack.

Reported (printed and written as JSON): publish and consume throughput, publish-to-ack
latency p50/p95/p99, RSS of this process (and SeaweedFS) at the start, every minute and at
the end, fault counts by kind, warnings logged by pawn-queue, and the audit: ``lost`` (a
publish returned an id, and the message was neither acked nor pending nor dead-lettered;
must be 0, else the exit code is 1) and duplicate deliveries, with how many are explained
by a lease that expired; one after an ack (a publish written twice) is unexplained.

Run from the repository root::

    .venv/bin/python -m bench.soak.faults --minutes 10 --out bench/results/soak-10min.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common
from pawn_queue import LeaseLostError, Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.exceptions import PublishError, StoreError

TOPIC = "soak"
VISIBILITY = 10.0
REQUEST_TIMEOUT = 5.0


def rss_mib(pid: int | str = "self") -> float:
    """Resident set size from /proc (Linux), in MiB; NaN elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return float("nan")


class WarningCounter(logging.Handler):
    """Counts pawn-queue's warnings by their text before the first ``=`` field."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg).split("=", 1)[0].rsplit(" ", 1)[0]
        self.counts[f"{record.levelname.lower()}: {text}"] += 1


@dataclass
class Ledger:
    """What happened to every message. Ids are kept as 16-byte ints to stay small."""

    published: set[int] = field(default_factory=set)
    raised: int = 0
    # id -> deliveries: (consumer, delivered at, outcome, lease expiry, hash of object key)
    deliveries: dict[int, list[tuple[int, float, str, float, int]]] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    t0: float = field(default_factory=time.monotonic)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    published_per_minute: Counter[int] = field(default_factory=Counter)
    acked_per_minute: Counter[int] = field(default_factory=Counter)

    def backlog(self) -> int:
        return len(self.published) - len(self.acked & self.published)


def key_of(message_id: str) -> int:
    return int(message_id.replace("-", ""), 16)


async def produce(
    pq: PawnQueue, index: int, ledger: Ledger, stop: asyncio.Event, args: argparse.Namespace
) -> None:
    """Publish at ``--rate / --producers`` per second (0: as fast as possible), pausing while
    ``--max-backlog`` messages are unacked."""
    producer = await pq.register_producer(f"soak-p{index}")
    period = args.producers / args.rate if args.rate > 0 else 0.0
    due, seq = time.monotonic(), 0
    while not stop.is_set():
        due += period
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if ledger.backlog() >= args.max_backlog:  # consumers fell behind: wait for an ack
            ledger.room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ledger.room.wait(), 1.0)
            continue
        seq += 1
        try:
            mid = await producer.publish(TOPIC, {"p": index, "seq": seq, "t": time.time()})
        except PublishError:
            ledger.raised += 1  # it may still have landed: the audit drains it
            continue
        ledger.published.add(key_of(mid))
        ledger.published_per_minute[int((time.monotonic() - ledger.t0) // 60)] += 1


async def settle(message: Message, ledger: Ledger) -> str:
    for _ in range(50):
        try:
            await message.ack()
        except LeaseLostError:
            return "lost"
        except StoreError:
            ledger.errors["ack raised StoreError (retried)"] += 1
            continue
        return "acked"
    message.abandon()
    return "failed"


async def handle(message: Message, index: int, ledger: Ledger, t0: float) -> None:
    delivered = time.time()
    outcome = await settle(message, ledger)
    mid = key_of(message.id)
    expiry = message._claimed.lease.expires.timestamp()
    ledger.deliveries.setdefault(mid, []).append(
        (index, delivered, outcome, expiry, hash(message._claimed.key))
    )
    if outcome == "acked":
        ledger.acked.add(mid)
        ledger.room.set()
        ledger.latencies.append(time.time() - float(message.payload["t"]))
        ledger.acked_per_minute[int((time.monotonic() - t0) // 60)] += 1


async def consume(
    pq: PawnQueue, index: int, ledger: Ledger, stop: asyncio.Event, t0: float
) -> None:
    consumer = await pq.register_consumer(f"soak-c{index}", [TOPIC])
    while not stop.is_set():
        try:
            messages = await consumer.poll(wait=1.0)
        except StoreError:
            ledger.errors["poll raised StoreError"] += 1
            continue
        await asyncio.gather(*(handle(m, index, ledger, t0) for m in messages))


def audit(ledger: Ledger, pending: set[int], dead: set[int], resent: set[int]) -> dict[str, Any]:
    """Lost messages and duplicate deliveries, explained where the protocol allows them."""
    lost = ledger.published - ledger.acked - pending - dead
    explained = Counter[str]()
    for mid, deliveries in ledger.deliveries.items():
        deliveries.sort(key=lambda d: d[1])
        for earlier, later in itertools.pairwise(deliveries):
            if earlier[2] == "acked":
                # A publish written twice (it looks before writing again: should not happen).
                cause = "after an ack, publish answer lost" if mid in resent else "after an ack"
                explained[f"UNEXPLAINED: {cause}"] += 1
            elif later[1] > earlier[3]:
                explained["lease expired (holder lost it or gave up)"] += 1
            else:
                explained["UNEXPLAINED"] += 1
    return {
        "published_with_id": len(ledger.published),
        "publish_raised": ledger.raised,
        "acked": len(ledger.acked & ledger.published),
        "acked_from_raised_publishes": len(ledger.acked - ledger.published),
        "pending_at_end": len(pending),
        "dead_lettered": len(dead),
        "lost": len(lost),
        "deliveries": sum(len(d) for d in ledger.deliveries.values()),
        "duplicate_deliveries": sum(len(d) - 1 for d in ledger.deliveries.values()),
        "duplicates_by_cause": dict(explained),
    }


def fault_rules(rate: float) -> list[Any]:
    from tests.servers.fault_proxy import FaultRule

    kinds = ("error_500", "slowdown_503", "reset", "drop_response", "slow")
    rules = [FaultRule(kind, rate * 0.19, delay_seconds=0.3) for kind in kinds]
    # A few requests hang past the request timeout; slow answers and stalls alike.
    rules.append(FaultRule("stall", rate * 0.05, delay_seconds=REQUEST_TIMEOUT + 1))
    return rules


@contextlib.contextmanager
def store_setup(backend: str, tmp: Path, rate: float, lifetime: float) -> Iterator[Any]:
    """Yields (config dict, proxy or None, SeaweedFS or None)."""
    polling = {
        "visibility_timeout_seconds": VISIBILITY,
        "lease_refresh_interval_seconds": 2.0,
        "interval_seconds": 0.2,
        "max_messages_per_poll": 10,
    }
    base: dict[str, Any] = {"backend": backend, "polling": polling}
    base["concurrency"] = {"clock_skew_margin_seconds": 0.5}
    if backend == "filesystem":
        yield {**base, "filesystem": {"path": str(tmp / "queue")}}, None, None
        return
    from tests.servers.fault_proxy import FaultProxy
    from tests.servers.seaweedfs import SeaweedFS

    server = SeaweedFS.start(tmp / "seaweedfs")
    try:
        server.create_bucket("soak")
        with FaultProxy(server.endpoint, seed=1, max_lifetime_seconds=lifetime) as proxy:
            proxy.set_rules(fault_rules(rate))
            s3 = {
                "endpoint_url": proxy.endpoint,
                "bucket_name": "soak",
                "aws_access_key_id": "soak",
                "aws_secret_access_key": "soak-secret",
                "request_timeout_seconds": REQUEST_TIMEOUT,
                "connect_timeout_seconds": 2.0,
                "max_retries": 3,
                "retry_timeout_seconds": 15.0,
            }
            yield {**base, "s3": s3}, proxy, server
    finally:
        server.stop()


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    lifetime = args.minutes * 60 + args.drain_timeout + 600
    warnings = WarningCounter()
    logging.getLogger("pawn_queue").addHandler(warnings)
    with store_setup(args.backend, tmp, args.fault_rate, lifetime) as (config, proxy, server):
        if proxy is not None:
            proxy.set_rules([])
        queues = [
            await PawnQueue.from_config(config) for _ in range(args.producers + args.consumers)
        ]
        for pq in queues:
            await pq.setup()
        await queues[0].create_topic(TOPIC)
        if proxy is not None:
            proxy.set_rules(fault_rules(args.fault_rate))
        ledger = Ledger()
        t0 = ledger.t0
        memory = [_memory(0, server)]
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        producers = [
            asyncio.create_task(produce(q, i, ledger, stop_producing, args))
            for i, q in enumerate(queues[: args.producers])
        ]
        consumers = [
            asyncio.create_task(consume(q, i, ledger, stop_consuming, t0))
            for i, q in enumerate(queues[args.producers :])
        ]
        for minute in range(1, int(args.minutes) + 1):
            await asyncio.sleep(max(0.0, t0 + minute * 60 - time.monotonic()))
            memory.append(_memory(minute, server))
            print(
                f"minute {minute}: published {len(ledger.published)}, acked "
                f"{len(ledger.acked)}, backlog {ledger.backlog()}, "
                f"rss {memory[-1]['rss_mib']} MiB",
                file=sys.stderr,
            )
        await asyncio.sleep(max(0.0, t0 + args.minutes * 60 - time.monotonic()))
        stop_producing.set()
        await asyncio.gather(*producers)
        produce_seconds = time.monotonic() - t0
        drained_at = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.drain_timeout):
                while True:
                    if not ledger.backlog():
                        drained_at = time.monotonic() - t0
                        break
                    await asyncio.sleep(0.2)  # the consumers' progress, looked at 5 times a s
        if proxy is not None:
            proxy.set_rules([])
        stop_consuming.set()
        await asyncio.gather(*consumers)
        for pq in queues:
            await pq.teardown()
        memory.append(_memory("end", server))
        # Faults off: what is left (publishes that raised but landed, abandoned leases).
        async with await PawnQueue.from_config(config) as pq:
            sweeper = await pq.register_consumer("soak-sweep", [TOPIC])
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(VISIBILITY * 3):
                    while await pq.store.list(layout.messages_prefix(TOPIC), limit=1):
                        for message in await sweeper.poll(wait=1.0):
                            await handle(message, -1, ledger, t0)
            pending = {_id_of(m.key) for m in await pq.store.list(layout.messages_prefix(TOPIC))}
            dead = {_id_of(m.key) for m in await pq.store.list(layout.dead_letter_prefix(TOPIC))}
            leases_left = len(await pq.store.list(layout.leases_prefix(TOPIC)))
        resent = _resent(proxy)
        acks = len(ledger.latencies)
        ledger_parts = (ledger.published, ledger.deliveries, ledger.acked, ledger.latencies)
        bookkeeping = deep_mib(*ledger_parts, proxy.injected() if proxy else [])
        return {
            "produce_seconds": round(produce_seconds, 1),
            "drained_after_seconds": round(drained_at, 1) if drained_at is not None else None,
            "publish_per_second": round(len(ledger.published) / produce_seconds, 1),
            "consume_per_second": round(acks / (drained_at or produce_seconds), 1),
            "latency_seconds": {
                f"p{p}": round(common.percentile(ledger.latencies, p), 3) for p in (50, 95, 99)
            },
            "published_per_minute": [ledger.published_per_minute[m] for m in range(args.minutes)],
            "acked_per_minute": [ledger.acked_per_minute[m] for m in range(args.minutes)],
            "memory": memory,
            # From minute 1 (connections, caches and code warmed up) to the end; part of it
            # is this benchmark's own record of every message and fault.
            "rss_growth_mib": round(memory[-1]["rss_mib"] - memory[1]["rss_mib"], 1),
            "bookkeeping_mib_at_end": bookkeeping,
            "faults": {k: v for k, v in sorted((proxy.stats() if proxy else {}).items())},
            "errors": dict(ledger.errors),
            "warnings_logged": dict(warnings.counts),
            "leases_left": leases_left,
            "audit": {**audit(ledger, pending, dead, resent), "publishes_answer_lost": len(resent)},
        }


def _memory(minute: int | str, server: Any) -> dict[str, Any]:
    seaweedfs = rss_mib(server.process.pid) if server is not None else None
    return {
        "minute": minute,
        "rss_mib": rss_mib(),
        "python_blocks": sys.getallocatedblocks(),
        "seaweedfs_rss_mib": seaweedfs,
    }


def deep_mib(*objects: object) -> float:
    """Approximate memory held by plain containers (this benchmark's own bookkeeping)."""
    seen: set[int] = set()
    stack, total = list(objects), 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return round(total / 2**20, 1)


def _id_of(key: str) -> int:
    pending = layout.parse_pending_key(key)
    name = key.rsplit("/", 1)[-1].split(".", 1)[0]
    return key_of(pending.object_id if pending is not None else name[-36:])


def _resent(proxy: Any) -> set[int]:
    """Messages whose publish PUT was applied but unanswered."""
    if proxy is None:
        return set()
    return {
        key_of(pending.object_id)
        for injection in proxy.injected()
        if injection.kind == "drop_response" and injection.operation == "put"
        if (pending := layout.parse_pending_key(injection.key)) is not None
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=int, required=True)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--fault-rate", type=float, default=0.05)
    parser.add_argument("--backend", choices=("s3", "filesystem"), default="s3")
    parser.add_argument("--rate", type=float, default=25.0, help="msgs/s in all; 0: no limit")
    parser.add_argument("--max-backlog", type=int, default=1000)
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=common.RESULTS / "soak.json")
    args = parser.parse_args(argv)
    if args.minutes < 1 or args.producers < 1 or args.consumers < 1:
        parser.error("--minutes, --producers and --consumers must be at least 1")

    logging.basicConfig(level=logging.ERROR, format="%(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.ERROR)  # warnings are counted, not printed
    logging.getLogger("pawn_queue").setLevel(logging.WARNING)
    for name in list(os.environ):  # a developer's PAWNQUEUE_*/AWS_* must not reconfigure us
        if name.startswith(common.SCRUBBED_ENV_PREFIXES):
            del os.environ[name]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pq-soak-") as tmp:
        (Path(tmp) / "tmp").mkdir()
        os.environ["TMPDIR"] = str(Path(tmp) / "tmp")  # weed mini's work directory
        results = asyncio.run(run(args, Path(tmp)))
    report = {
        "benchmark": "soak",
        **common.host(),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "visibility_timeout_seconds": VISIBILITY,
            "request_timeout_seconds": REQUEST_TIMEOUT,
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
        **results,
    }
    print(json.dumps(report, indent=2, default=str))
    common.write_results(args.out, report)
    return 1 if results["audit"]["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
