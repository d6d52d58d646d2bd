"""The printed report of the queue benchmarks (``python -m bench.queue.compare``): one table per
case from the results, then the notes on how the figures were measured.
"""

from __future__ import annotations

import math
from typing import Any

from bench.queue.support import IN_FLIGHT
from bench.queue.waiting import wake_table

# -- table --------------------------------------------------------------------------------------


def _f(value: Any, spec: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def table(results: dict[str, Any]) -> str:
    out: list[str] = []

    def section(title: str, header: str, lines: list[str]) -> None:
        out.extend(["", title, header, "-" * len(header), *lines])

    def skipped(rows: list[dict[str, Any]]) -> list[str]:
        return [f"{r['lib']:<7}skipped: {r['skipped']}" for r in rows if "skipped" in r]

    if "publish" in results:
        rows = results["publish"]
        section(
            "1. Publish, msgs/s",
            f"{'lib':<7}{'store':<12}{'serial':>10}{f'{IN_FLIGHT} in flight':>14}",
            [
                f"{r['lib']:<7}{r['store']:<12}{_f(r['serial_per_s']):>10}"
                f"{_f(r['concurrent_per_s']):>14}"
                for r in rows
                if "serial_per_s" in r
            ]
            + skipped(rows),
        )
    if "drain" in results:
        rows = results["drain"]
        lines = []
        for r in rows:
            if "msgs_per_s" not in r:
                continue
            q = r["requests_per_msg"]
            lines.append(
                f"{r['lib']:<7}{r['strategy']:<19}{r['messages']:>6}{r['consumers']:>4}"
                f"{_f(r['msgs_per_s']):>8}{_f(r.get('ratio_vs_013'), '.2f'):>8}"
                f"{_f(r.get('of_store_limit'), '.0%'):>7}"
                f"{q['put_list']:>10.2f}{q['get_head']:>10.2f}{q['delete']:>8.2f}"
                f"{r['usd_per_million_msgs']:>9.2f}{r['duplicates']:>5}"
            )
        section(
            "2-3. Drain on S3: msgs/s, requests per message (publish + drain), USD",
            f"{'lib':<7}{'strategy':<19}{'N':>6}{'c':>4}{'msgs/s':>8}{'/0.1.3':>8}{'limit':>7}"
            f"{'PUT+LIST':>10}{'GET+HEAD':>10}{'DELETE':>8}{'$/M msg':>9}{'dup':>5}",
            lines + skipped(rows),
        )
    batch = results.get("batch")
    if isinstance(batch, dict) and "rows" in batch:
        out.extend(["", *batch_table(batch)])
    if "drain" in results:
        split_rows = [r for r in results["drain"] if "requests_per_msg_by_step" in r]
        section(
            "3. Requests per message by step: publish, and drain (claim + read + ack)",
            f"{'lib':<7}{'strategy':<19}{'c':>4}{'step':>9}{'PUT+LIST':>10}{'GET+HEAD':>10}"
            f"{'DELETE':>8}",
            [
                f"{r['lib']:<7}{r['strategy']:<19}{r['consumers']:>4}{step:>9}"
                f"{q['put_list']:>10.2f}{q['get_head']:>10.2f}{q['delete']:>8.2f}"
                for r in split_rows
                for step, q in r["requests_per_msg_by_step"].items()
            ],
        )
    if "idle" in results:
        rows = results["idle"]
        section(
            f"4. Idle listen(): requests per minute (over {rows[0].get('seconds', '?')} s), "
            "USD per month",
            f"{'lib':<7}{'settings':<34}{'topics':>7}{'PUT+LIST':>10}{'GET+HEAD':>10}"
            f"{'$/month':>9}",
            [
                f"{r['lib']:<7}{r['settings']:<34}{r['topics']:>7}"
                f"{r['requests_per_min']['put_list']:>10.1f}"
                f"{r['requests_per_min']['get_head']:>10.1f}{r['usd_per_month']:>9.2f}"
                for r in rows
                if "requests_per_min" in r
            ]
            + skipped(rows),
        )
    if "latency" in results:
        rows = results["latency"]
        section(
            "5. Latency publish -> handler, one publish every 50 ms",
            f"{'lib':<7}{'setup':<38}{'settings':<22}{'p50 ms':>8}{'p95 ms':>9}{'got/sent':>11}",
            [
                f"{r['lib']:<7}{r['setup']:<38}{r['settings']:<22}{_f(r['p50_ms']):>8}"
                f"{_f(r['p95_ms']):>9}{r['received']:>6}/{r['sent']}"
                for r in rows
                if "p50_ms" in r
            ]
            + skipped(rows),
        )
    if isinstance(results.get("wake"), list):
        out.extend(wake_table(results["wake"]))
    if "backlog" in results:
        rows = results["backlog"]
        section(
            "6. One poll() of 10 + acks at a backlog (fill: publish, 128 in flight)",
            f"{'store':<12}{'pending':>9}{'fill/s':>8}{'poll+ack ms':>13}{'PUT+LIST':>10}"
            f"{'GET+HEAD':>10}{'DELETE':>8}",
            [
                f"{r['store']:<12}{r['pending']:>9,}{_f(r['fill_msgs_per_s']):>8}"
                f"{r['poll_and_ack_ms']:>13.1f}{r['requests_per_poll']['put_list']:>10.0f}"
                f"{r['requests_per_poll']['get_head']:>10.0f}"
                f"{r['requests_per_poll']['delete']:>8.0f}"
                for r in rows
            ],
        )
    if "local" in results:
        rows = results["local"]
        section(
            "8. Local directory, msgs/s: publish (serial) and consume (poll/receive + ack)",
            f"{'lib':<10}{'backlog':>9}{'publish':>10}{'consume':>10}",
            [
                f"{r['lib']:<10}{r['backlog']:>9,}{_f(r['publish_per_s']):>10}"
                f"{_f(r['consume_per_s']):>10}"
                for r in rows
                if "backlog" in r
            ]
            + skipped(rows),
        )
    for name, value in results.items():
        if isinstance(value, dict) and "error" in value:
            out.extend(["", f"{name}: ERROR {value['error']}"])
        elif isinstance(value, dict) and "skipped" in value:
            out.extend(["", f"{name}: skipped: {value['skipped']}"])
    out.extend(["", *NOTES])
    return "\n".join(out).lstrip("\n")


def batch_table(batch: dict[str, Any]) -> list[str]:
    """Case 7's rows (drain msgs/s only where the objects were published first) and goals."""
    rows = batch["rows"]
    size = rows[0]["batch_size"] if rows else "?"
    header = (
        f"{'store':<8}{'mode':<9}{'c':>3}{'poll':>6}{'N':>8}{'drain/s':>9}{'e2e/s':>9}{'cpu us':>8}"
        f"{'PUT+LIST':>10}{'GET+HEAD':>10}{'DELETE':>8}{'$/M msg':>9}{'dup':>5}{'t/o':>4}"
    )
    lines = [
        f"7. publish_batch objects of {size} drained by listen() (backlog: published first; "
        "live: while listening)",
        header,
        "-" * len(header),
    ]
    for r in rows:
        q = r.get("requests_per_msg")
        requests = (
            f"{q['put_list']:>10.4f}{q['get_head']:>10.4f}{q['delete']:>8.4f}"
            f"{r['usd_per_million_msgs']:>9.3f}"
            if q
            else f"{'-':>10}{'-':>10}{'-':>8}{'-':>9}"
        )
        lines.append(
            f"{r['store']:<8}{r['mode']:<9}{r['consumers']:>3}{r['poll']:>6}{r['messages']:>8,}"
            f"{_f(r.get('msgs_per_s')):>9}{_f(r['end_to_end_msgs_per_s']):>9}"
            f"{_f(r.get('cpu_us_per_msg'), ',.1f'):>8}{requests}"
            f"{r['duplicates']:>5}{r['timed_out']:>4}"
        )
    for name, target in batch["targets"].items():
        checked = target["rows"].values()
        met = sum(c["met"] for c in checked)
        lines.append(f"goal {name} {target['goal']}: met in {met} of {len(checked)} rows")
    lines.append("cpu us: this process's CPU time per message, first publish to last ack")
    return lines


NOTES = (
    "Notes: one SeaweedFS (weed mini, loopback) for every S3 figure, a fresh bucket per",
    "measurement. Drain: N messages published 32 in flight, then c consumers, each its own",
    "PawnQueue, all in one process and event loop (0.1.3 alike, in its runner process), each",
    "looping poll() + concurrent acks, sleeping 10 ms doubling to 250 ms after empty polls.",
    "Requests: SeaweedFS_s3_request_total of the bucket over publish + drain (HEAD counts as",
    "GET; a DeleteObjects batch as one DELETE). USD at AWS list prices: PUT/COPY/POST/LIST",
    "$5 per million, GET/HEAD $0.40, DELETE free; per month = 30 days. limit: the drain's",
    "msgs/s as a share of what the server allows for the drain's own PUT, GET, HEAD and",
    "DELETE requests, at the rates bench/micro/store.py's pass measures on it (32 in flight) in",
    "the same run; LISTs left out (their cost grows with the prefix listed).",
)
