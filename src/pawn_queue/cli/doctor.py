"""``pawn-queue doctor`` (store checks), ``metrics`` (exporter) and ``demo``."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue._protocol import layout
from pawn_queue._protocol.strategy import probe_store
from pawn_queue.cli.common import (
    CliError,
    JsonOption,
    build_config,
    finite_seconds,
    open_queue,
    options,
    print_json,
    require_extra,
    run,
    stdout_console,
)
from pawn_queue.client import PawnQueue
from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import AlreadyExists, NotFound, StoreError, StoreThrottledError
from pawn_queue.store.base import Store
from pawn_queue.store.throttling import first_refusal_raised, throttle_backoff_of

_RACERS = 8
_SAMPLES = 5


@dataclass(slots=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str


@dataclass(slots=True)
class Report:
    checks: list[Check] = field(default_factory=list)
    strategy: str | None = None
    risks: list[str] = field(default_factory=list)
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    clock_skew_seconds: float | None = None

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)


def _probe_key() -> str:
    return layout.probe_key(str(uuid.uuid4()))


async def _race(store: Store, report: Report) -> None:
    key = _probe_key()
    try:
        # A create refused for the store's rate (the key written within its second, by the
        # winner) is not sent again: under a per-key limit the losers' resends would be
        # refused again and again, backing off for tens of seconds.
        with first_refusal_raised():
            results = await asyncio.gather(
                *(store.put(key, secrets.token_bytes(16), "create") for _ in range(_RACERS)),
                return_exceptions=True,
            )
    finally:
        await store.delete(key)
    winners = sum(1 for r in results if isinstance(r, str))
    lost = sum(1 for r in results if isinstance(r, AlreadyExists))
    throttled = sum(1 for r in results if isinstance(r, StoreThrottledError))
    other = [
        r
        for r in results
        if isinstance(r, BaseException) and not isinstance(r, AlreadyExists | StoreThrottledError)
    ]
    detail = f"{_RACERS} concurrent create-only puts: {winners} won, {lost} refused"
    if throttled:
        detail += f", {throttled} refused for the store's request rate"
    if other:
        detail += f", {len(other)} failed ({other[0]})"
    report.add("create-only race", "ok" if winners == 1 and not other else "fail", detail)
    if winners != 1:
        report.risks.append(
            "create-only writes are not exclusive under a race: two consumers can claim one "
            "message with conditional_write; set concurrency.strategy to csprng_verify"
        )


async def _read_after_write(store: Store, report: Report) -> None:
    key = _probe_key()
    data = secrets.token_bytes(32)
    try:
        await store.put(key, data)
        same = (await store.get(key)).data == data
        listed = any(m.key == key for m in await store.list(layout.PROBE))
    finally:
        await store.delete(key)
    try:
        await store.head(key)
        gone = False
    except NotFound:
        gone = True
    ok = same and listed and gone
    detail = f"get={'same' if same else 'STALE'} list={'seen' if listed else 'MISSING'} "
    detail += f"delete={'gone' if gone else 'STILL THERE'}"
    report.add("read-after-write", "ok" if ok else "fail", detail)
    if not ok:
        report.risks.append("the store is not strongly consistent: messages may be missed")


async def _latency(store: Store, report: Report) -> None:
    # A key a sample: a store that limits writes per key would refuse rewrites of one key,
    # and each pause would count as the PUT's latency.
    keys = [_probe_key() for _ in range(_SAMPLES)]
    samples: dict[str, list[float]] = {"PUT": [], "GET": [], "HEAD": []}
    try:
        for key in keys:
            for op in samples:
                started = time.perf_counter()
                if op == "PUT":
                    await store.put(key, b"x" * 256)
                elif op == "GET":
                    await store.get(key)
                else:
                    await store.head(key)
                samples[op].append((time.perf_counter() - started) * 1000)
    finally:
        await store.delete_many(keys)
    parts = []
    for op, values in samples.items():
        values.sort()
        p50 = statistics.median(values)
        p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
        report.latency_ms[op] = {"p50": p50, "p90": p90, "max": values[-1]}
        parts.append(f"{op} p50 {p50:.1f} p90 {p90:.1f} max {values[-1]:.1f}")
    slow = max(v["p50"] for v in report.latency_ms.values()) > 500
    report.add("latency (ms)", "warn" if slow else "ok", "; ".join(parts))


async def _clock_skew(store: Store, report: Report, margin: float) -> None:
    key = _probe_key()
    try:
        before = datetime.now(UTC)
        await store.put(key, b"clock")
        after = datetime.now(UTC)
        stored = (await store.head(key)).last_modified
    finally:
        await store.delete(key)
    # S3 keeps last_modified to the second: anything within [before - 1 s, after] is no skew.
    if stored < before.replace(microsecond=0):
        skew = (stored - before.replace(microsecond=0)).total_seconds()
    elif stored > after:
        skew = (stored - after).total_seconds()
    else:
        skew = 0.0
    report.clock_skew_seconds = skew
    detail = f"store clock {skew:+.1f}s from local (resolution 1s); margin {margin:g}s"
    bad = abs(skew) > margin
    report.add("clock skew", "warn" if bad else "ok", detail)
    if bad:
        report.risks.append(
            f"clock skew {skew:+.1f}s exceeds concurrency.clock_skew_margin_seconds "
            f"({margin:g}s): live leases may look expired (fix NTP or raise the margin)"
        )


async def _conditional_writes(store: Store, report: Report, strategy: str) -> bool:
    """The probe's checks, one row each; whether create-only writes are enforced."""
    probe = await probe_store(store)
    for capability in probe.capabilities:
        status = "ok" if capability.ok else "warn"
        report.add(f"conditional write: {capability.name}", status, capability.detail)
    if probe.limits_writes_per_key:
        report.add(
            "writes per key",
            "ok",
            "the store refused a rewrite of the probe's key within its second: it limits "
            "writes per key; the queue spaces such writes (docs/protocol.md, Request rates)",
        )
    if probe.strategy != strategy:  # only when the store answered differently this time
        report.add("strategy", "fail", f"the queue uses {strategy}, the probe now says "
                   f"{probe.strategy}: the store's answers are not stable")  # fmt: skip
    return probe.capabilities[-1].ok


def _server_header(config: PawnQueueConfig) -> str | None:
    """The ``Server`` header of an anonymous HEAD on the bucket (S3 only), or why not."""
    s3 = config.s3
    if config.backend != "s3" or s3 is None:
        return None
    endpoint = s3.endpoint_url or f"https://s3.{s3.region_name}.amazonaws.com"
    if "://" not in endpoint:
        endpoint = ("https://" if s3.use_ssl else "http://") + endpoint
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "unknown (not an http(s) endpoint)"
    netloc = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    # Built from scheme, host and port only: user info in the endpoint may be credentials.
    url = f"{parts.scheme}://{netloc}/{s3.bucket_name}"
    request = urllib.request.Request(url, method="HEAD")  # noqa: S310 (http/s only)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
            server = answer.headers.get("Server")
    except urllib.error.HTTPError as exc:  # 403 without a signature: it still names itself
        server = exc.headers.get("Server")
    except (OSError, ValueError) as exc:
        return f"unknown ({type(exc).__name__})"
    return str(server) if server else "not sent"


async def diagnose(pq: PawnQueue) -> Report:
    report = Report()
    started = time.perf_counter()
    await pq.setup()
    elapsed = (time.perf_counter() - started) * 1000
    report.add("store reachable", "ok", f"{pq.store!r}: list and probe in {elapsed:.0f} ms")
    server = await asyncio.to_thread(_server_header, pq.config)
    if server is not None:
        report.add("server", "ok", f"Server: {server}")
    report.strategy = pq.strategy
    configured = pq.config.concurrency.strategy
    store = pq.store
    create_only = False
    try:
        create_only = await _conditional_writes(store, report, pq.strategy)
    except StoreError as exc:
        report.add("conditional writes", "fail", str(exc))
    if pq.strategy == "csprng_verify":
        report.risks.append(
            "csprng_verify is probabilistic: a message can be delivered twice at once"
        )
    if configured != "auto" and configured != pq.strategy:
        report.risks.append(f"configured strategy {configured} differs from the probe's")
    steps = [_read_after_write, _latency]
    if create_only:
        steps.insert(0, _race)
    else:
        report.add("create-only race", "ok", "not run: create-only writes are not enforced")
    for step in steps:
        try:
            await step(store, report)
        except StoreError as exc:
            report.add(step.__name__.strip("_").replace("_", " "), "fail", str(exc))
    try:
        await _clock_skew(store, report, pq.config.concurrency.clock_skew_margin_seconds)
    except StoreError as exc:
        report.add("clock skew", "fail", str(exc))
    _request_rate(store, report)
    return report


def _request_rate(store: Store, report: Report) -> None:
    """Whether the store refused any of these checks' requests for its request rate."""
    backoff = throttle_backoff_of(store)
    if backoff is None:
        return
    if backoff.throttled:
        report.add(
            "request rate",
            "warn",
            f"the store refused {backoff.throttled} request(s) of these checks for its "
            "request rate (HTTP 429 or 503 SlowDown); each was sent again after a pause "
            "(docs/protocol.md, Request rates)",
        )
    else:
        report.add("request rate", "ok", "no request refused for the store's request rate")


def doctor(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """Check the store: access, its Server header, each conditional write the queue relies
    on (tested, not assumed), a create-only race, read-after-write, latency, clock skew; print
    the strategy the queue uses there and any risk. Exit 1 on a failure.

    A local directory must exist: doctor checks a store, it does not create one."""
    opts = options(ctx, json_output)

    async def main() -> Report:
        # Its probes write: on a mistyped path they would create a new, empty store.
        pq = open_queue(opts, must_exist=True)
        try:
            return await diagnose(pq)
        finally:
            await pq.teardown()

    report = run(ctx, main)
    if opts.json:
        print_json(
            {
                "ok": report.ok,
                "strategy": report.strategy,
                "checks": [_check(c) for c in report.checks],
                "risks": report.risks,
                "latency_ms": report.latency_ms,
                "clock_skew_seconds": report.clock_skew_seconds,
            }
        )
    else:
        table = Table(title="pawn-queue doctor")
        for column in ("check", "status", "detail"):
            table.add_column(column)
        style = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in report.checks:
            table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail)
        console = stdout_console()
        console.print(table)
        console.print(f"strategy: {report.strategy}", markup=False)
        for risk in report.risks or ["none found"]:
            console.print(f"risk: {risk}", markup=False)
    if not report.ok:
        raise typer.Exit(1)


def _check(c: Check) -> dict[str, Any]:
    return {"name": c.name, "status": c.status, "detail": c.detail}


def metrics(
    ctx: typer.Context,
    topics: Annotated[list[str], typer.Argument(metavar="TOPIC...", help="Topics to watch.")],
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="HTTP port for /metrics (0: any free port).")
    ] = 9464,
    addr: Annotated[
        str,
        typer.Option(help="Address to bind (0.0.0.0: every interface, for a scraper elsewhere)."),
    ] = "127.0.0.1",
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between stats.")] = 15.0,
    duration: Annotated[
        float | None,
        typer.Option(min=0, help="Stop after this many seconds (default: run forever)."),
    ] = None,
) -> None:
    """Serve Prometheus metrics on --addr (this host only by default): topic gauges every
    --interval (three LISTs per topic per 1,000 objects), and store request counters.

    Needs the metrics extra (pip install 'pawn-queue\\[metrics]').
    """
    opts = options(ctx)
    finite_seconds(interval, "--interval")
    finite_seconds(duration, "--duration")
    require_extra("prometheus_client", "metrics", "pawn-queue metrics")

    async def main() -> None:
        from pawn_queue.metrics import default_metrics, start_exporter

        config = build_config(opts)
        queue_metrics = default_metrics()
        async with open_queue(opts, queue_metrics, config) as pq:
            for topic in topics:
                await pq.topic_settings(topic)  # TopicNotFoundError before serving anything
            try:
                server, _ = start_exporter(port, addr)
            except OSError as exc:
                raise CliError(f"cannot listen on {addr}:{port}: {exc}") from None
            host = f"[{addr}]" if ":" in addr else addr
            # The port bound, which --port 0 leaves to the system.
            bound = f"http://{host}:{server.server_port}/metrics"
            typer.echo(f"serving metrics on {bound}", err=True)
            deadline = None if duration is None else time.monotonic() + duration
            while True:
                for topic in topics:
                    with contextlib.suppress(StoreError):
                        queue_metrics.set_topic_stats(topic, await pq.topic_stats(topic))
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                await asyncio.sleep(interval if remaining is None else min(interval, remaining))

    run(ctx, main)


def demo(
    orders: Annotated[int, typer.Option(min=1, help="Orders to publish.")] = 3000,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Consumer workers.")] = 4,
    directory: Annotated[
        Path,
        typer.Option(
            "--dir", help="Queue directory: new, empty, or an earlier demo's (then cleared)."
        ),
    ] = Path("queue-demo"),
    fail_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fraction of orders that fail (0 to 1).")
    ] = 0.05,
) -> None:
    """Run the queue demo on a local directory: orders published, processed by concurrent
    workers, a fraction dead-lettered, then a summary. This is examples/demo.py (make
    demo-queue); make demo then runs a Spark pipeline, which this command does not."""
    from pawn_queue.cli.demo import run_demo

    run_demo(orders, workers, directory, fail_rate)
