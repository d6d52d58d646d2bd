"""What the common case costs per message on S3 (one SeaweedFS on loopback), by publish rate.

One producer process awaits each ``publish()`` at a fixed rate (``--rates``, 1, 10 and 100
messages a second by default) for ``--seconds``; one consumer in another process runs
``listen()`` at default settings and acks each message in its handler. Each point gets a
fresh bucket; medians of ``--runs`` runs.

Counted by SeaweedFS (its per-bucket request counters, as ``bench.cost.idle``) from just
before the first publish to when the consumer has acked every message, nothing else (the
processes' start, their start-up listing and their stop are outside): per message, PUT
(every write but a DELETE), LIST, GET/HEAD (SeaweedFS counts a HEAD as a GET), DELETE and
all; USD per million messages at AWS list prices (PUT/LIST $5, GET/HEAD $0.40 per million,
DELETE free) and that against Amazon SQS ($1.20 per million: a send, a receive and a delete).
Latency from the producer's ``time.time()`` just before ``publish`` (in the payload) to the
handler's call, one host and one clock: p50 and p99. Every message published is checked to
be acked (``lost``), and deliveries past the first are counted (``dup``).

``--set section.key=value`` (repeatable, a JSON value or a string) changes the config of
both processes, to show a setting's other end, e.g. ``--set notify.check_interval_seconds=0.5``.

Run from the repository root::

    .venv/bin/python -m bench.cost.curve                  # 3 runs x 3 rates x 60 s, ~11 min
    .venv/bin/python -m bench.cost.curve --seconds 5 --runs 1 --rates 1 10

Prints a table; writes ``bench/results/cost_curve.json`` (``--out``). The producer and the
consumer are this module run as ``--child producer|consumer`` (``bench.cost.fleet`` runs
many of each the same way): ``run_point`` starts them and stops them (end of input, then
SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.servers.seaweedfs import SeaweedFS

from bench.common import (
    PRICE_SQS_PER_MESSAGE,
    REPO,
    RESULTS,
    RequestClasses,
    delta,
    git_state,
    host_report,
    median,
    merged,
    parse_sets,
    percentile,
    request_columns,
    s3_settings,
    scrape,
    scrubbed_env,
    write_results,
)

TOPIC = "work"
READY_TIMEOUT = 90.0  # a child's start, on a busy host
SETTLE_SECONDS = 3.0  # after every child is ready: the consumers' start-up listing is over
logger = logging.getLogger("bench.cost.curve")
COLUMNS = ("PUT", "LIST", "GET/HEAD", "DELETE", "total")


# -- the child processes ------------------------------------------------------------------------


def emit(document: Any) -> None:
    print(document if isinstance(document, str) else json.dumps(document), flush=True)


class WarningCounter(logging.Handler):
    """Counts the warnings logged, by their first words."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.name}: {str(record.msg)[:50]}"] += 1


async def until_end_of_input(go: asyncio.Event | None = None) -> None:
    """Returns at the end of stdin; sets ``go`` on a ``go`` line."""
    while line := await asyncio.to_thread(sys.stdin.readline):
        if go is not None and line.strip() == "go":
            go.set()


async def producer_child(spec: dict[str, Any], warnings: WarningCounter) -> None:
    """Publishes ``count`` messages at ``rate`` a second from ``offset`` seconds after ``go``,
    awaiting each; a line per publish, ``done`` after the last; stays up (its change signals
    go out) until the end of input."""
    from pawn_queue import PawnQueue

    index, rate, count = int(spec["index"]), float(spec["rate"]), int(spec["count"])
    go = asyncio.Event()
    ended = asyncio.create_task(until_end_of_input(go))
    errors: Counter[str] = Counter()
    async with await PawnQueue.from_config(spec["queue"]) as pq:
        producer = await pq.register_producer(f"bench-p{index}")
        emit("ready")
        await asyncio.wait([ended, asyncio.create_task(go.wait())], return_when="FIRST_COMPLETED")
        start = time.monotonic() + float(spec.get("offset", 0.0))
        for i in range(count):
            if ended.done():
                break
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            sent = time.time()
            try:
                await producer.publish(spec["topic"], {"p": index, "i": i, "t": sent})
                ok = True
            except Exception as exc:  # counted, and the producer goes on
                errors[type(exc).__name__] += 1
                ok = False
            emit({"pub": i, "ok": ok, "s": round(time.time() - sent, 4)})
        emit({"done": index})
        await ended
    emit({"summary": {"errors": dict(errors), "warnings": dict(warnings.counts)}})


async def consumer_child(spec: dict[str, Any], warnings: WarningCounter) -> None:
    """``listen()`` on the topic, the handler acking; a line per delivery ``[p, i, latency,
    acked]``; stops at the end of input. An exception out of ``listen()`` is counted, and it
    listens again a second later."""
    from pawn_queue import Message, PawnQueue

    errors: Counter[str] = Counter()

    async def handler(message: Message) -> None:
        called = time.time()
        payload = message.payload
        try:
            await message.ack()
            acked = 1
        except Exception as exc:
            errors[f"ack: {type(exc).__name__}"] += 1
            acked = 0
        emit({"h": [payload["p"], payload["i"], round(called - payload["t"], 4), acked]})

    async with await PawnQueue.from_config(spec["queue"]) as pq:
        consumer = await pq.register_consumer(f"bench-c{spec['index']}", [spec["topic"]])

        async def listening() -> None:
            while True:
                try:
                    await consumer.listen(handler)
                except Exception as exc:
                    errors[f"listen: {type(exc).__name__}"] += 1
                    await asyncio.sleep(1.0)

        listener = asyncio.create_task(listening())
        emit("ready")
        await until_end_of_input()
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    emit({"summary": {"errors": dict(errors), "warnings": dict(warnings.counts)}})


def child_main(role: str) -> None:
    warnings = WarningCounter()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger().addHandler(warnings)
    spec = json.loads(sys.stdin.readline())
    run = producer_child if role == "producer" else consumer_child
    asyncio.run(run(spec, warnings))


# -- the parent: start the children, count, stop them --------------------------------------------


@dataclass
class Tally:
    """What the children said. Messages are ``(producer, i)``."""

    published: set[tuple[int, int]] = field(default_factory=set)  # publish returned
    raised: set[tuple[int, int]] = field(default_factory=set)  # publish raised
    publish_s: list[float] = field(default_factory=list)
    done: set[int] = field(default_factory=set)  # producers past their last publish
    acked: set[tuple[int, int]] = field(default_factory=set)
    deliveries: int = 0
    unacked: int = 0  # deliveries whose ack raised
    by_consumer: Counter[int] = field(default_factory=Counter)
    latency: dict[tuple[int, int], float] = field(default_factory=dict)  # of the first
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def on_line(self, child: Child, doc: dict[str, Any]) -> None:
        if "pub" in doc:
            key = (child.index, int(doc["pub"]))
            (self.published if doc["ok"] else self.raised).add(key)
            self.publish_s.append(float(doc["s"]))
        elif "h" in doc:
            p, i, latency, acked = doc["h"]
            self.deliveries += 1
            self.by_consumer[child.index] += 1
            self.latency.setdefault((p, i), float(latency))
            if acked:
                self.acked.add((p, i))
            else:
                self.unacked += 1
        elif "done" in doc:
            self.done.add(child.index)
        self.changed.set()

    def complete(self, producers: int) -> bool:
        return len(self.done) >= producers and not self.published - self.acked


class Child:
    """A ``--child`` process of this module; its stdout lines go to ``on_line``."""

    def __init__(
        self, role: str, index: int, process: asyncio.subprocess.Process, log: Path
    ) -> None:
        self.role, self.index, self.process, self.log = role, index, process, log
        self.ready = asyncio.Event()
        self.summary: dict[str, Any] = {}
        self.reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, role: str, index: int, spec: dict[str, Any], logs: Path, tally: Tally
    ) -> Child:
        log = logs / f"{role}-{index}.log"
        with log.open("ab") as stderr:
            process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "bench.cost.curve", "--child", role),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=scrubbed_env(),
                cwd=REPO,
                limit=1 << 20,
            )
        child = cls(role, index, process, log)
        child.reader = asyncio.create_task(child._read(tally))
        await child.send(json.dumps({**spec, "index": index}))
        return child

    async def _read(self, tally: Tally) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode().strip()
            if line == "ready":
                self.ready.set()
            elif line.startswith("{"):
                doc = json.loads(line)
                if "summary" in doc:
                    self.summary = doc["summary"]
                else:
                    tally.on_line(self, doc)
        tally.changed.set()

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def wait_ready(self) -> None:
        assert self.reader is not None
        waiter = asyncio.create_task(self.ready.wait())
        await asyncio.wait(
            [waiter, self.reader], timeout=READY_TIMEOUT, return_when="FIRST_COMPLETED"
        )
        waiter.cancel()
        if not self.ready.is_set():
            raise RuntimeError(f"{self.role} {self.index} not ready:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    async def stop(self, grace: float = 20.0) -> None:
        """End of input (it stops itself), then SIGTERM, then SIGKILL."""
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        for step in ("wait", "terminate", "kill"):
            if step != "wait" and self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    getattr(self.process, step)()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), grace if step == "wait" else 5.0)
                break
        if self.reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.reader, 5.0)


@contextlib.asynccontextmanager
async def children(logs: Path) -> AsyncIterator[list[Child]]:
    """The children started inside, every one stopped at the end (all at once)."""
    started: list[Child] = []
    try:
        yield started
    finally:
        await asyncio.gather(*(c.stop() for c in started), return_exceptions=True)


@dataclass
class Point:
    """One measured point: what to start and how to count."""

    queue: dict[str, Any]
    producers: list[dict[str, Any]]  # rate, count, offset of each
    consumers: int
    count: Callable[[], Awaitable[dict[str, int]]]  # the store's counters now
    drain_seconds: float = 120.0  # after the last publish, at most
    on_go: Callable[[], None] | None = None  # just before the first publish
    on_end: Callable[[], None] | None = None  # at the end of the count
    claims: str = "second"  # the topic's setting: "message" for a claim a message


async def run_point(point: Point, logs: Path) -> dict[str, Any]:
    """Starts the consumers and producers, counts from just before ``go`` to when every
    published message was acked (or ``drain_seconds`` after the producers are done), then
    stops them all."""
    from pawn_queue import PawnQueue

    async with await PawnQueue.from_config(point.queue) as pq:
        await pq.create_topic(TOPIC, claims=point.claims)
    tally = Tally()
    common = {"queue": point.queue, "topic": TOPIC}
    async with children(logs) as started:
        for i in range(point.consumers):
            started.append(await Child.start("consumer", i, common, logs, tally))
        for i, spec in enumerate(point.producers):
            started.append(await Child.start("producer", i, {**common, **spec}, logs, tally))
        await asyncio.gather(*(c.wait_ready() for c in started))
        producers = [c for c in started if c.role == "producer"]
        await asyncio.sleep(SETTLE_SECONDS)
        before = await point.count()
        if point.on_go is not None:
            point.on_go()
        began = time.monotonic()
        await asyncio.gather(*(p.send("go") for p in producers))
        publish_for = max(s["count"] / s["rate"] + s.get("offset", 0) for s in point.producers)
        deadline = began + publish_for + point.drain_seconds
        while not tally.complete(len(producers)) and time.monotonic() < deadline:
            if all(p.reader is not None and p.reader.done() for p in producers):
                break  # every producer died
            tally.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tally.changed.wait(), 1.0)
        seconds = time.monotonic() - began
        after = await point.count()
        if point.on_end is not None:
            point.on_end()
        timed_out = not tally.complete(len(producers))
    requests = {k: v for k, v in delta(before, after).items() if ":" not in k}
    return result_of(tally, requests, seconds, timed_out, started)


def result_of(
    tally: Tally, requests: dict[str, int], seconds: float, timed_out: bool, started: list[Child]
) -> dict[str, Any]:
    messages = len(tally.published)
    per = max(messages, 1)
    latencies = list(tally.latency.values())
    classes = RequestClasses.from_counts(requests)
    usd = classes.per(per).dollars_per_million()
    errors: dict[str, Counter[str]] = {"producer": Counter(), "consumer": Counter()}
    warnings: Counter[str] = Counter()
    for child in started:
        errors[child.role].update(child.summary.get("errors", {}))
        warnings.update(child.summary.get("warnings", {}))
    return {
        "messages": messages,
        "publish_raised": len(tally.raised),
        "raised_but_delivered": len(tally.raised & tally.acked),
        "acked": len(tally.acked),
        "lost": len(tally.published - tally.acked),
        "deliveries": tally.deliveries,
        "duplicates": tally.deliveries - len(tally.latency),
        "unacked_deliveries": tally.unacked,
        "by_consumer": dict(sorted(tally.by_consumer.items())),
        "seconds": round(seconds, 2),
        "timed_out": timed_out,
        "requests": requests,
        "per_message": {k: round(v / per, 3) for k, v in request_columns(requests).items()},
        "usd_per_million": round(usd, 3),
        "vs_sqs": round(usd / PRICE_SQS_PER_MESSAGE, 2),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "publish_p50_ms": round(percentile(tally.publish_s, 50) * 1000, 1),
        "exceptions": {role: dict(c) for role, c in errors.items() if c},
        "warnings": dict(warnings),
    }


# -- this benchmark ------------------------------------------------------------------------------


def server_counts(server: SeaweedFS, bucket: str) -> Callable[[], Awaitable[dict[str, int]]]:
    """SeaweedFS's request counters of ``bucket``, read in a thread."""

    async def count() -> dict[str, int]:
        return await asyncio.to_thread(scrape, server.metrics_url, bucket)

    return count


async def run_all(server: SeaweedFS, args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    overrides = parse_sets(args.set)
    rows: list[dict[str, Any]] = []
    for run in range(args.runs):
        for rate in args.rates if run % 2 == 0 else args.rates[::-1]:
            bucket = f"curve-{uuid.uuid4().hex[:12]}"
            server.create_bucket(bucket)
            s3 = {**s3_settings(server.endpoint), "bucket_name": bucket}
            queue = merged({"backend": "s3", "s3": s3}, overrides)
            count = max(1, round(rate * args.seconds))
            point = Point(
                queue,
                [{"rate": rate, "count": count}],
                consumers=1,
                count=server_counts(server, bucket),
                claims=args.claims,
            )
            row = {"run": run, "rate": rate, **await run_point(point, logs)}
            logger.info("run %d, %g msg/s: %s", run, rate, {k: row[k] for k in SHOWN})
            rows.append(row)
    return rows


SHOWN = ("messages", "per_message", "usd_per_million", "p50_ms", "p99_ms", "lost", "duplicates")


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    runs = f"median of {args.runs} run{'s' * (args.runs != 1)}"
    sets = f", set: {' '.join(args.set)}" if args.set else ", defaults"
    sets += f", claims={args.claims}" if args.claims != "second" else ""
    lines = [
        f"1 producer process (awaited publish) -> 1 listen() process, SeaweedFS, "
        f"{args.seconds:g} s a point, {runs}{sets} ({git_state()['commit']})",
        "requests per message; USD per million messages at AWS list prices; SQS: "
        f"${PRICE_SQS_PER_MESSAGE:.2f}",
        "",
    ]
    head = (
        f"{'msg/s':>6}{'msgs':>6}{'PUT':>7}{'LIST':>7}{'GET/HEAD':>9}{'DELETE':>7}{'all':>7}"
        f"{'USD/M':>8}{'xSQS':>6}{'p50 ms':>8}{'p99 ms':>8}{'lost':>5}{'dup':>5}"
    )
    lines += [head, "-" * len(head)]
    medians = []
    for rate in args.rates:
        mine = [r for r in rows if r["rate"] == rate]
        m: dict[str, Any] = {"rate": rate, "runs": len(mine)}
        m["messages"] = median(r["messages"] for r in mine)
        m["per_message"] = {c: median(r["per_message"][c] for r in mine) for c in COLUMNS}
        for k in ("usd_per_million", "vs_sqs", "p50_ms", "p99_ms"):
            m[k] = median(r[k] for r in mine)
        m["lost"] = sum(r["lost"] for r in mine)
        m["duplicates"] = sum(r["duplicates"] for r in mine)
        medians.append(m)
        per = m["per_message"]
        lines.append(
            f"{rate:>6g}{m['messages']:>6.0f}"
            + "".join(f"{per[c]:>{w}.2f}" for c, w in zip(COLUMNS, (7, 7, 9, 7, 7), strict=True))
            + f"{m['usd_per_million']:>8.2f}{m['vs_sqs']:>6.1f}{m['p50_ms']:>8.0f}"
            f"{m['p99_ms']:>8.0f}{m['lost']:>5}{m['duplicates']:>5}"
        )
    errors = [
        f"run {r['run']}, {r['rate']:g}/s: {r['exceptions']}" for r in rows if r["exceptions"]
    ]
    if errors:
        lines += ["", "exceptions raised:", *errors]
    return "\n".join(lines), medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    parser.add_argument("--seconds", type=float, default=60.0, help="publishing, per point")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument(
        "--claims", choices=("message", "second"), default="second", help="the topic's setting"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "cost_curve.json")
    parser.add_argument("--child", choices=("producer", "consumer"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pawn_queue").setLevel(logging.WARNING)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pq-bench-curve-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            rows = asyncio.run(run_all(server, args, Path(tmp)))
        finally:
            server.stop()
    text, medians = table(rows, args)
    print(text)
    write_results(
        args.out,
        {
            "medians": medians,
            "results": rows,
            "settings": vars(args) | {"out": str(args.out)},
            "host": host_report(load),
            "git": git_state(),
            "table": text,
        },
    )


if __name__ == "__main__":
    main()
