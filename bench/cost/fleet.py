"""A fleet on one topic through a proxy that acts like a provider's request limits.

``--producers`` processes (4) each await ``publish()`` at ``--rate`` messages a second (10)
for ``--seconds`` (60), staggered evenly; N consumer processes (``--consumers``, 8 and 24 by
default, one point each) run ``listen()`` on the same topic at default settings and ack in
their handler. Every request goes through ``tests.servers.limit_proxy.LimitProxy`` before one
SeaweedFS on loopback: by default counting only (nothing refused; it counts the writes per
key and what the limits below would have refused), with ``--limits`` enforcing one write a
second per key (429 ``SlowDown``, as Google Cloud Storage, Cloudflare R2 and Storj) and 750
requests a second per bucket (503 ``SlowDown``, as Hetzner), both with ``Retry-After: 1``.

Reported per consumer count, from just before the first publish to when every published
message was acked (or ``--drain-seconds`` after the last publish): requests per message, as
SeaweedFS counted them (what was forwarded) and as the proxy did (refused ones too); mean and
peak requests a second at the proxy; the hottest keys and the most writes each got in one
wall-clock second; refusals (429, 503) and, counting only, what would have been refused;
the requests a message to each kind of key (``get _notify/*``: a key's folder, as the
proxy forwarded them); messages lost (a publish returned and no handler acked it), duplicate
deliveries, exceptions raised to producers (each counted, then it goes on) and to consumers (an ack
raising, ``listen()`` raising); publish-to-handler latency p50 and p99 (one host, one clock).

The processes are ``bench.cost.curve``'s children, started and stopped by this bench (end of
input, then SIGTERM, then SIGKILL); each point's bucket is fresh. Run from the repository
root::

    .venv/bin/python -m bench.cost.fleet                    # 8 and 24 consumers, ~3 min
    .venv/bin/python -m bench.cost.fleet --limits           # the same, limits enforced
    .venv/bin/python -m bench.cost.fleet --consumers 2 --seconds 5

Prints a table; writes ``bench/results/fleet.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.servers.limit_proxy import LimitProxy, LimitReport, Limits
from tests.servers.seaweedfs import SeaweedFS

from bench.common import (
    RESULTS,
    git_state,
    host_report,
    merged,
    parse_sets,
    s3_settings,
    write_results,
)
from bench.cost.curve import Point, run_point, server_counts

logger = logging.getLogger("bench.cost.fleet")


async def fleet_point(
    server: SeaweedFS, proxy: LimitProxy, consumers: int, args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    bucket = f"fleet-{consumers}-{uuid.uuid4().hex[:10]}"
    server.create_bucket(bucket)
    s3 = {**s3_settings(proxy.endpoint), "bucket_name": bucket}
    queue = merged({"backend": "s3", "s3": s3}, parse_sets(args.set))
    count = max(1, round(args.rate * args.seconds))
    stagger = 1.0 / (args.rate * args.producers)  # the producers' publishes interleave
    producers = [
        {"rate": args.rate, "count": count, "offset": k * stagger} for k in range(args.producers)
    ]
    reports: list[LimitReport] = []
    point = Point(
        queue,
        producers,
        consumers,
        count=server_counts(server, bucket),
        drain_seconds=args.drain_seconds,
        on_go=proxy.reset_counts,
        on_end=lambda: reports.append(proxy.report(hottest=5)),
        claims=args.claims,
    )
    row = await run_point(point, logs)
    report = reports[-1]
    prefix = f"{bucket}/"
    messages = max(row["messages"], 1)
    counts = report.counts
    row.update(
        consumers=consumers,
        producers=args.producers,
        rate_per_producer=args.rate,
        store_requests_per_message=round(row["per_message"]["total"], 2),
        proxy_requests_per_message=round(counts.get("requests", 0) / messages, 2),
        mean_requests_per_s=round(counts.get("requests", 0) / max(report.seconds, 1e-9), 1),
        peak_requests_per_s=report.peak_requests_per_second,
        requests_each_second=[n for _, n in sorted(report.arrived_per_second.items())],
        hottest=row_keys(report, prefix),
        keys_written=report.keys_written,
        refused_429=counts.get("per_key_429", 0),
        refused_503=counts.get("bucket_503", 0),
        over_key_interval=counts.get("over_key_interval", 0),
        over_bucket_rate=counts.get("over_bucket_rate", 0),
        over_key_by_family=families(report.over_key, prefix),
        requests_per_message_by_family={
            family: round(n / messages, 3) for family, n in report.by_family.items()
        },
        proxy={k: v for k, v in report.as_dict().items() if k != "hottest"},
    )
    return row


def families(per_key: dict[str, int], prefix: str) -> dict[str, int]:
    """Counts by key with its last part starred (``work/leases/*``, ``_notify/*``)."""
    out: Counter[str] = Counter()
    for key, n in per_key.items():
        head, _, _ = key.removeprefix(prefix).rpartition("/")
        out[f"{head}/*" if head else "*"] += n
    return dict(out.most_common())


def row_keys(report: LimitReport, prefix: str) -> list[dict[str, Any]]:
    return [{**asdict(k), "key": k.key.removeprefix(prefix)} for k in report.hottest]


async def run_all(
    server: SeaweedFS, proxy: LimitProxy, args: argparse.Namespace, logs: Path
) -> list[dict[str, Any]]:
    rows = []
    for consumers in args.consumers:
        row = await fleet_point(server, proxy, consumers, args, logs)
        shown = ("messages", "proxy_requests_per_message", "peak_requests_per_s", "lost")
        logger.info("%d consumers: %s", consumers, {k: row[k] for k in shown})
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace, limits: Limits) -> str:
    mode = "limits enforced" if limits.enforce else "counting only"
    lines = [
        f"{args.producers} producers x {args.rate:g} msg/s (awaited publish) -> N listen() "
        f"processes, one topic, {args.seconds:g} s, SeaweedFS behind the limit proxy "
        f"({mode}: {limits.per_key_write_interval_seconds:g} s per key write, "
        f"{limits.bucket_requests_per_second:g} req/s per bucket) ({git_state()['commit']})",
        "req/msg: SeaweedFS's count (forwarded) / the proxy's (refused too); over key / over "
        "bucket: requests beyond each limit (refused or not)",
        "",
    ]
    head = (
        f"{'cons':>5}{'msgs':>6}{'req/msg':>14}{'mean/s':>8}{'peak/s':>8}{'429':>6}{'503':>6}"
        f"{'over key':>9}{'over bkt':>9}{'lost':>5}{'dup':>5}{'exc P/C':>9}{'p50 ms':>8}"
        f"{'p99 ms':>8}"
    )
    lines += [head, "-" * len(head)]
    for r in rows:
        exc = r["exceptions"]
        raised = f"{sum(exc.get('producer', {}).values())}/{sum(exc.get('consumer', {}).values())}"
        per = f"{r['store_requests_per_message']:.1f}/{r['proxy_requests_per_message']:.1f}"
        lines.append(
            f"{r['consumers']:>5}{r['messages']:>6}{per:>14}{r['mean_requests_per_s']:>8.0f}"
            f"{r['peak_requests_per_s']:>8}{r['refused_429']:>6}{r['refused_503']:>6}"
            f"{r['over_key_interval']:>9}{r['over_bucket_rate']:>9}{r['lost']:>5}"
            f"{r['duplicates']:>5}{raised:>9}{r['p50_ms']:>8.0f}{r['p99_ms']:>8.0f}"
        )
    for r in rows:
        hot = ", ".join(
            f"{k['key']} {k['peak_per_second']}/s ({k['writes']})" for k in r["hottest"][:3]
        )
        lines.append(
            f"{r['consumers']:>3} consumers, hottest keys (most writes in 1 s, all): {hot}"
        )
        kinds = ", ".join(
            f"{k} {n:.2f}" for k, n in list(r["requests_per_message_by_family"].items())[:6]
        )
        lines.append(f"    requests a message by kind of key (forwarded): {kinds}")
        if r["over_key_by_family"]:
            over = ", ".join(f"{k} {n}" for k, n in r["over_key_by_family"].items())
            lines.append(f"    writes within 1 s of the key's last: {over}")
        if r["exceptions"]:
            lines.append(f"    exceptions: {r['exceptions']}")
        if r["timed_out"]:
            lines.append(f"    not drained within {args.drain_seconds:g} s of the last publish")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=10.0, help="messages a second each")
    parser.add_argument("--consumers", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--seconds", type=float, default=60.0, help="publishing, per point")
    parser.add_argument("--drain-seconds", type=float, default=120.0, help="at most, after")
    parser.add_argument(
        "--limits", action="store_true", help="enforce 1 write/s per key, 750 req/s per bucket"
    )
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument(
        "--claims", choices=("message", "second"), default="second", help="the topic's setting"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "fleet.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pawn_queue").setLevel(logging.WARNING)
    limits = Limits.provider(enforce=args.limits)
    load = os.getloadavg()
    lifetime = len(args.consumers) * (args.seconds + args.drain_seconds + 300) + 120
    with tempfile.TemporaryDirectory(prefix="pq-bench-fleet-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            with LimitProxy(server.endpoint, limits, max_lifetime_seconds=lifetime) as proxy:
                rows = asyncio.run(run_all(server, proxy, args, Path(tmp)))
        finally:
            server.stop()
    text = table(rows, args, limits)
    print(text)
    write_results(
        args.out,
        {
            "results": rows,
            "limits": asdict(limits),
            "settings": vars(args) | {"out": str(args.out)},
            "host": host_report(load),
            "git": git_state(),
            "table": text,
        },
    )


if __name__ == "__main__":
    main()
