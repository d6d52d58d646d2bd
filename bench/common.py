"""What the benchmarks share, standard library only: where the repository and the results
are, the one results writer, statistics, S3 request counts and their price, and the queue
drivers.

Every benchmark imports this as ``bench.common``, the runners of the other venvs
(``bench.queue.pq013_runner`` under pawn-queue 0.1.3's, ``bench.queue.vsqs_runner`` under
vsqs's) too. Nothing here imports ``pawn_queue``: the drivers below only use what both queue
libraries expose (``producer.publish``, ``consumer.poll``/``listen``,
``message.id``/``payload``/``ack``), so both are measured by the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"  # each benchmark's JSON: RESULTS / "<name>.json"

# AWS S3 Standard list prices, USD per million requests (us-east-1). DELETE is free.
PRICE_PUT_LIST = 5.00  # PUT, COPY, POST, LIST
PRICE_GET_HEAD = 0.40  # GET, HEAD (and everything else that is not a write or a list)
MINUTES_PER_MONTH = 60 * 24 * 30
# Amazon SQS standard, USD per million messages: a send, a receive and a delete at $0.40
# per million requests each (the first million requests a month free left aside).
PRICE_SQS_PER_MESSAGE = 1.20

# Variables that would silently reconfigure a queue under test or the S3 client.
SCRUBBED_ENV_PREFIXES = ("PAWNQUEUE_", "AWS_")


def scrubbed_env() -> dict[str, str]:
    """The environment for runner processes: no queue settings, no PYTHONPATH (the 0.1.3
    runner must import 0.1.3 from its venv, never this checkout)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(SCRUBBED_ENV_PREFIXES) and k != "PYTHONPATH"
    }


# -- settings given on the command line ----------------------------------------------------


def parse_sets(items: Iterable[str]) -> dict[str, Any]:
    """``--set section.key=value`` items as a nested config dict (each value JSON, else a
    string), to be ``merged`` over a benchmark's queue config."""
    out: dict[str, Any] = {}
    for item in items:
        path, _, text = item.partition("=")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        *parents, leaf = path.split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return out


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` over it, nested mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = (
            merged(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
        )
    return out


# -- statistics ---------------------------------------------------------------------------


def s3_settings(endpoint: str) -> dict[str, Any]:
    """The ``s3`` settings of the benches' SeaweedFS at ``endpoint`` (it takes any
    credentials); each use adds its ``bucket_name``."""
    return {
        "endpoint_url": endpoint,
        "aws_access_key_id": "bench",
        "aws_secret_access_key": "bench-secret",
        "region_name": "us-east-1",
        "use_ssl": False,
    }


def median(values: Iterable[float]) -> float:
    items = [v for v in values if not math.isnan(v)]
    return statistics.median(items) if items else math.nan


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


# -- S3 request counts from SeaweedFS's Prometheus metrics ----------------------------------

_COUNTER = "SeaweedFS_s3_request_total"


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        if "=" in part:
            name, _, value = part.partition("=")
            out[name.strip()] = value.strip().strip('"')
    return out


def scrape(metrics_url: str, bucket: str) -> dict[str, int]:
    """Requests counted so far for ``bucket``, by ``TYPE`` and ``TYPE:code`` (HEAD is GET)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith(_COUNTER + "{"):
            continue
        labels_text, _, value = line[len(_COUNTER) + 1 :].rpartition("}")
        labels = _labels(labels_text)
        if labels.get("bucket") != bucket:
            continue
        n = int(float(value.split()[0]))
        kind = labels.get("type", "?")
        counts[kind] = counts.get(kind, 0) + n
        code_key = f"{kind}:{labels.get('code', '?')}"
        counts[code_key] = counts.get(code_key, 0) + n
    return counts


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    keys = sorted(set(before) | set(after))
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) != before.get(k, 0)
    }


@dataclass
class RequestClasses:
    """Requests split the way AWS bills them."""

    put_list: float = 0.0  # PUT, COPY, POST, LIST: $5 per million
    get_head: float = 0.0  # GET, HEAD: $0.40 per million
    delete: float = 0.0  # free

    @classmethod
    def from_counts(cls, counts: Mapping[str, float]) -> RequestClasses:
        out = cls()
        for kind, n in counts.items():
            if ":" in kind:
                continue  # the per-code breakdown repeats the totals
            if kind in ("GET", "HEAD"):
                out.get_head += n
            elif kind == "DELETE":
                out.delete += n
            else:
                out.put_list += n
        return out

    def per(self, n: float) -> RequestClasses:
        return RequestClasses(self.put_list / n, self.get_head / n, self.delete / n)

    @property
    def total(self) -> float:
        return self.put_list + self.get_head + self.delete

    def dollars_per_million(self) -> float:
        """USD for a million of whatever these counts are per (messages, minutes, ...)."""
        return self.put_list * PRICE_PUT_LIST + self.get_head * PRICE_GET_HEAD

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in asdict(self).items()}


def request_columns(counts: Mapping[str, float]) -> dict[str, float]:
    """Requests by the columns the cost tables print: ``PUT`` (PUT, POST, COPY: every
    write but a DELETE), ``LIST``, ``GET/HEAD`` (SeaweedFS counts a HEAD as a GET), ``DELETE``
    and ``total`` (the ``TYPE:code`` breakdown of ``scrape`` is left out)."""
    out = {"PUT": 0.0, "LIST": 0.0, "GET/HEAD": 0.0, "DELETE": 0.0}
    for kind, n in counts.items():
        if ":" in kind:
            continue
        column = {"GET": "GET/HEAD", "HEAD": "GET/HEAD", "LIST": "LIST", "DELETE": "DELETE"}
        out[column.get(kind, "PUT")] += n
    out["total"] = sum(out.values())
    return out


def median_classes(samples: Sequence[RequestClasses]) -> RequestClasses:
    return RequestClasses(
        median(s.put_list for s in samples),
        median(s.get_head for s in samples),
        median(s.delete for s in samples),
    )


# -- drivers shared by both libraries ---------------------------------------------------------


class MessageLike(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def payload(self) -> Any: ...

    async def ack(self) -> None: ...


class ConsumerLike(Protocol):
    async def poll(self) -> Sequence[MessageLike]: ...

    async def listen(self, handler: Callable[[Any], Awaitable[None]]) -> None: ...


async def publish_many(
    publish: Callable[[int], Awaitable[object]], count: int, in_flight: int
) -> float:
    """Call ``publish(i)`` for i in range(count) with ``in_flight`` at once; seconds taken."""
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            i, next_index = next_index, next_index + 1
            await publish(i)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(in_flight, count))))
    return time.perf_counter() - started


def numbered(producer: Any, topic: str) -> Callable[[int], Awaitable[object]]:
    """``publish(i)`` for publish_many: message ``{"n": i}`` to ``topic``."""
    return lambda i: producer.publish(topic, {"n": i})


def sender(producer: Any, topic: str) -> Callable[[dict[str, Any]], Awaitable[object]]:
    return lambda payload: producer.publish(topic, payload)


@dataclass
class DrainResult:
    seconds: float
    expected: int
    acked: int = 0
    unique: int = 0
    polls: int = 0
    empty_polls: int = 0
    timed_out: bool = False
    ids: set[str] = field(default_factory=set, repr=False)

    @property
    def rate(self) -> float:
        return self.unique / self.seconds if self.seconds > 0 else math.nan

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("ids")
        d["msgs_per_s"] = round(self.rate, 1)
        d["duplicates"] = self.acked - self.unique
        return d


async def drain(
    consumers: Sequence[ConsumerLike],
    expected: int,
    time_limit: float,
    backoff: tuple[float, float] = (0.01, 0.25),
    one_by_one: bool = False,
) -> DrainResult:
    """Every consumer loops ``poll()`` then acks what it got (concurrently; with
    ``one_by_one``, each ``ack()`` awaited before the next) until
    ``expected`` distinct messages are acked or ``time_limit`` passes. After an empty poll
    a consumer sleeps ``backoff[0]``, doubling up to ``backoff[1]`` while polls stay empty
    (without it, consumers that find nothing to claim spin on LIST requests)."""
    result = DrainResult(seconds=0.0, expected=expected)
    done = asyncio.Event()

    async def ack(message: MessageLike) -> None:
        await message.ack()
        result.acked += 1
        result.ids.add(message.id)
        if len(result.ids) >= expected:
            done.set()

    async def run(consumer: ConsumerLike) -> None:
        pause = backoff[0]
        while not done.is_set():
            messages = await consumer.poll()
            result.polls += 1
            if not messages:
                result.empty_polls += 1
                await asyncio.sleep(pause)
                pause = min(pause * 2, backoff[1])
                continue
            pause = backoff[0]
            if one_by_one:
                for message in messages:
                    await ack(message)
            else:
                await asyncio.gather(*(ack(m) for m in messages))

    started = time.perf_counter()
    tasks = [asyncio.create_task(run(c)) for c in consumers]
    try:
        waiter = asyncio.create_task(done.wait())
        finished, _ = await asyncio.wait(
            [waiter, *tasks], timeout=time_limit, return_when=asyncio.FIRST_COMPLETED
        )
        for task in finished:
            error = None if task is waiter else task.exception()
            if error is not None:
                raise error
        result.timed_out = not done.is_set()
        result.seconds = time.perf_counter() - started
    finally:
        waiter.cancel()
        # Let each consumer finish the acks of its current poll, then stop it.
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    result.unique = len(result.ids)
    return result


async def measure_idle(
    consumer: ConsumerLike, seconds: float, count: Callable[[], dict[str, int]], warmup: float
) -> dict[str, int]:
    """Requests made by an idle ``listen()`` during ``seconds``, after ``warmup``."""

    async def handler(message: Any) -> None:
        await message.ack()

    task = asyncio.create_task(consumer.listen(handler))
    try:
        await asyncio.sleep(warmup)
        before = await asyncio.to_thread(count)
        await asyncio.sleep(seconds)
        after = await asyncio.to_thread(count)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return delta(before, after)


@dataclass
class LatencyResult:
    sent: int
    received: int
    duplicates: int
    latencies: list[float] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "received": self.received,
            "duplicates": self.duplicates,
            "p50_ms": round(percentile(self.latencies, 50) * 1000, 1),
            "p95_ms": round(percentile(self.latencies, 95) * 1000, 1),
            "max_ms": round(max(self.latencies, default=math.nan) * 1000, 1),
        }


async def measure_latency(
    publish: Callable[[dict[str, Any]], Awaitable[object]],
    consumer: ConsumerLike,
    *,
    period: float,
    duration: float,
    drain_timeout: float,
    warmup: float = 0.5,
) -> LatencyResult:
    """A listening consumer; one publish every ``period`` for ``duration``; latency is the
    handler's ``time.time()`` minus the publisher's just before ``publish``."""
    latencies: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    sent = max(1, round(duration / period))
    all_in = asyncio.Event()

    async def handler(message: Any) -> None:
        nonlocal duplicates
        arrived = time.time()
        if message.id in seen:
            duplicates += 1
        else:
            seen.add(message.id)
            latencies.append(arrived - float(message.payload["t"]))
        await message.ack()
        if len(seen) >= sent:
            all_in.set()

    listener = asyncio.create_task(consumer.listen(handler))
    try:
        await asyncio.sleep(warmup)
        start = time.monotonic()
        for i in range(sent):
            await asyncio.sleep(max(0.0, start + i * period - time.monotonic()))
            await publish({"t": time.time(), "i": i})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), drain_timeout)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    return LatencyResult(sent, len(seen), duplicates, latencies)


# -- child processes ---------------------------------------------------------------------------


def last_json_line(stdout: str) -> Any:
    """The JSON document a runner prints as its last line."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise ValueError(f"no JSON in output: {stdout[-500:]!r}")


def host() -> dict[str, Any]:
    """When and where a benchmark ran: the first fields of its results."""
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def host_report(load_at_start: tuple[float, float, float]) -> dict[str, Any]:
    """``host()``, and how busy the host was at the benchmark's start and end."""
    return {
        **host(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
    }


def git_state() -> dict[str, Any]:
    """The checkout measured: the library may be mid-change, so say which files differ."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout

    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "changed": [line[3:] for line in git("status", "--porcelain").splitlines() if line],
    }


def write_results(path: Path, document: Mapping[str, Any]) -> None:
    """Write a benchmark's results ``document`` as JSON to ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
