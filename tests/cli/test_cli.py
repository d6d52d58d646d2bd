"""The ``pawn-queue`` command line: every command through Typer's CliRunner, the main paths
as real subprocesses on a local directory and on SeaweedFS, errors, and secrets."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from pawn_queue import PawnQueue
from pawn_queue.cli import app
from pawn_queue.config import S3Config

SECRET = "pq-SeCrEt-7f3a9c1e-do-not-print"
ACCESS = "pq-AcCeSs-55e1b2"
SUBCOMMANDS = [
    "topics",
    "publish",
    "consume",
    "peek",
    "dlq",
    "consumers",
    "producers",
    "doctor",
    "demo",
    "metrics",
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PAWNQUEUE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'queue'}"


def cli(url: str | None, *args: str, input: str | None = None, code: int | None = 0) -> Result:
    argv = (["--url", url] if url else []) + list(args)
    result = CliRunner().invoke(app, argv, input=input)
    if code is not None:
        assert result.exit_code == code, (argv, result.stdout, result.stderr, result.exception)
    return result


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def dead_letter_some(url: str, topic: str, count: int) -> list[str]:
    """Publish ``count`` messages and nack them all (dead letters, reason nack)."""

    async def main() -> list[str]:
        async with PawnQueue.from_url(url) as pq:
            producer = await pq.register_producer("p")
            for i in range(count):
                await producer.publish(topic, {"n": i})
            consumer = await pq.register_consumer("nacker", topics=[topic])
            ids = []
            while len(ids) < count:
                for msg in await consumer.poll(wait=2):
                    await msg.nack()
                    ids.append(msg.id)
            return ids

    return asyncio.run(main())


# -- help -----------------------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    result = cli(None, "--help")
    for name in SUBCOMMANDS:
        assert name in result.stdout
    for option in ("--url", "--config", "--json", "--debug", "--log-level"):
        assert option in result.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["topics", "list"],
        ["topics", "create"],
        ["topics", "update"],
        ["topics", "show"],
        ["topics", "purge"],
        ["topics", "delete"],
        ["topics", "stats"],
        ["publish"],
        ["consume"],
        ["peek"],
        ["dlq", "list"],
        ["dlq", "show"],
        ["dlq", "redrive"],
        ["dlq", "purge"],
        ["consumers"],
        ["producers"],
        ["doctor"],
        ["demo"],
        ["metrics"],
    ],
)
def test_help_of_each_command(command: list[str]) -> None:
    result = cli(None, *command, "--help")
    assert "Usage" in result.stdout
    assert len(result.stdout.splitlines()) > 3


def test_publish_help_documents_invalid_lines() -> None:
    text = " ".join(cli(None, "publish", "--help").stdout.split())
    assert "line number" in text and "exit code is 1" in text


def test_metrics_help_shows_the_extra_to_install() -> None:
    text = " ".join(cli(None, "metrics", "--help").stdout.split())
    assert "pip install 'pawn-queue[metrics]'" in text


def test_version() -> None:
    assert "pawn-queue 0.2" in cli(None, "--version").stdout


# -- topics ---------------------------------------------------------------------------------


def test_topics_create_list_stats_delete(url: str) -> None:
    cli(url, "topics", "create", "orders", "--max-receive-count", "3")
    cli(url, "topics", "create", "jobs")
    assert cli(url, "topics", "list").stdout.split() == ["jobs", "orders"]
    assert json.loads(cli(url, "--json", "topics", "list").stdout) == ["jobs", "orders"]
    cli(url, "publish", "orders", '{"a": 1}')
    stats = json.loads(cli(url, "topics", "stats", "orders", "--json").stdout)
    assert stats["pending"] == 1 and stats["dead_letter"] == 0
    assert stats["oldest_age_seconds"] is not None
    table = cli(url, "topics", "stats").stdout
    for header in ("pending", "in flight", "delayed", "dead letters", "oldest age"):
        assert header in table
    assert "orders" in table and "jobs" in table
    everything = json.loads(cli(url, "topics", "stats", "--json").stdout)
    assert [row["topic"] for row in everything] == ["jobs", "orders"]
    # Without --yes it asks; "n" deletes nothing.
    refused = cli(url, "topics", "delete", "orders", input="n\n", code=1)
    assert "not confirmed" in refused.stderr
    cli(url, "topics", "delete", "orders", "--yes")
    assert cli(url, "topics", "list").stdout.split() == ["jobs"]


def test_topics_create_never_changes_settings_update_does(url: str) -> None:
    cli(url, "topics", "create", "orders", "--max-receive-count", "3")
    cli(url, "topics", "create", "orders")  # as a service's start-up script would
    shown = json.loads(cli(url, "topics", "show", "orders", "--json").stdout)
    assert shown["topic"] == "orders"
    assert shown["settings"]["max_receive_count"] == 3
    assert shown["stats"]["pending"] == 0
    cli(url, "topics", "create", "orders", "--max-receive-count", "3")  # the same: fine
    conflict = cli(url, "topics", "create", "orders", "--max-receive-count", "5", code=1)
    assert conflict.stderr == (
        "error: topic orders exists with other settings: max_receive_count is 3, asked 5 "
        "(change them with 'pawn-queue topics update')\n"
    )
    updated = cli(
        url, "topics", "update", "orders", "--max-receive-count", "none", "--max-pending", "10"
    )
    assert "max_receive_count=none" in updated.stderr and "max_pending=10" in updated.stderr
    settings = json.loads(cli(url, "--json", "topics", "show", "orders").stdout)["settings"]
    assert settings["max_receive_count"] is None and settings["max_pending"] == 10
    again = json.loads(
        cli(url, "topics", "update", "orders", "--retention-seconds", "60", "--json").stdout
    )
    assert again["settings"]["retention_seconds"] == 60 and again["settings"]["max_pending"] == 10
    table = cli(url, "topics", "show", "orders").stdout
    for text in ("topic orders", "max_pending", "retention_seconds", "pending", "dead_letter"):
        assert text in table
    bad = cli(url, "topics", "update", "orders", "--max-pending", "lots", code=2)
    assert bad.stderr == "error: --max-pending: expected a whole number or 'none', got 'lots'\n"
    invalid = cli(url, "topics", "update", "orders", "--max-pending", "0", code=2)
    assert invalid.stderr.startswith("error: max_pending: got 0")
    for command in (["update", "nope", "--max-pending", "1"], ["show", "nope"]):
        missing = cli(url, "topics", *command, code=1)
        assert missing.stderr == "error: topic 'nope' does not exist\n"
    runs = json.loads(cli(url, "topics", "update", "orders", "--claims", "second", "--json").stdout)
    assert runs["settings"]["claims"] == "second"
    wrong = cli(url, "topics", "create", "events", "--claims", "minute", code=2)
    assert wrong.stderr.startswith("error: claims: got 'minute'")


def test_topics_purge(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", input="1\n2\n3\n")
    cli(url, "publish", "orders", "4", "--delay", "3600")
    refused = cli(url, "topics", "purge", "orders", input="n\n", code=1)
    assert "not confirmed" in refused.stderr
    assert json.loads(cli(url, "topics", "stats", "orders", "--json").stdout)["pending"] == 3
    assert cli(url, "topics", "purge", "orders", input="y\n").stdout.endswith(
        "purged 4 message objects of orders\n"
    )
    stats = json.loads(cli(url, "topics", "stats", "orders", "--json").stdout)
    assert (stats["pending"], stats["delayed"]) == (0, 0)
    assert json.loads(cli(url, "--json", "topics", "purge", "orders", "--yes").stdout) == {
        "topic": "orders",
        "purged": 0,
    }
    missing = cli(url, "topics", "purge", "nope", "--yes", code=1)
    assert missing.stderr == "error: topic 'nope' does not exist\n"


# -- global options and usage errors --------------------------------------------------------


def test_global_options_after_the_command(url: str, tmp_path: Path) -> None:
    cli(None, "topics", "create", "orders", "--url", url)
    assert json.loads(cli(None, "topics", "list", "--url", url, "--json").stdout) == ["orders"]
    assert json.loads(cli(None, "topics", "list", "--json", f"--url={url}").stdout) == ["orders"]
    assert cli(None, "topics", "--url", url, "list").stdout.split() == ["orders"]
    logged = cli(None, "topics", "create", "jobs", "--url", url, "--log-level", "debug")
    assert "topic created topic=jobs" in logged.stderr
    debug = cli(None, "topics", "list", "--url", "ftp://nowhere", "--debug", code=2)
    assert "Traceback" in debug.stderr
    config = tmp_path / "pq.yaml"
    config.write_text(f"backend: filesystem\nfilesystem:\n  path: {tmp_path / 'q'}\n")
    cli(None, "topics", "create", "fromfile", "--config", str(config))
    assert cli(None, "topics", "list", "-c", str(config)).stdout.split() == ["fromfile"]
    # After "--", an argument that looks like a global option is left where it is.
    cli(url, "publish", "orders", "--", '"--json"')
    [msg] = json_lines(cli(url, "consume", "orders").stdout)
    assert msg["payload"] == "--json"


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "create"],
        ["topics", "list", "--bogus"],
        ["no-such-command"],
        ["topics", "list", "--url"],
        ["consume", "t", "--count", "many"],
        ["--log-level", "loud", "topics", "list"],
        ["publish", "t", "1", "--delay", "-1"],
    ],
)
def test_usage_errors_are_one_line(argv: list[str]) -> None:
    result = cli(None, *argv, code=2)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert result.stdout == ""


# -- publish / consume / peek ---------------------------------------------------------------


def test_publish_one_and_consume(url: str) -> None:
    cli(url, "topics", "create", "orders")
    message_id = cli(url, "publish", "orders", '{"order": 1}', "-a", "source=cli").stdout.strip()
    out = json_lines(cli(url, "consume", "orders", "--count", "1").stdout)
    assert len(out) == 1
    msg = out[0]
    assert msg["id"] == message_id and msg["topic"] == "orders"
    assert msg["payload"] == {"order": 1} and msg["attributes"] == {"source": "cli"}
    assert msg["receive_count"] == 1
    assert set(msg) >= {"id", "topic", "producer_id", "created_at", "receive_count"}
    # Acked: nothing left.
    assert cli(url, "consume", "orders", "--wait", "0").stdout == ""


def test_publish_with_an_expiry_shows_it_on_the_message(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", "1", "--expires-in", "600")
    cli(url, "publish", "orders", "--batch", "2", "--expires-in", "600", input="2\n3\n")
    out = json_lines(cli(url, "consume", "orders", "--count", "3").stdout)
    assert sorted(m["payload"] for m in out) == [1, 2, 3]
    assert all("expires_at" in m for m in out)


def test_publish_with_a_priority_comes_first(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", "1")
    cli(url, "publish", "orders", "2", "--priority", "9")
    cli(url, "publish", "orders", "--batch", "2", "--priority", "5", input="3\n4\n")
    out = json_lines(cli(url, "consume", "orders", "--count", "4").stdout)
    assert [(m["payload"], m.get("priority", 0)) for m in out] == [(2, 9), (3, 5), (4, 5), (1, 0)]


@pytest.mark.parametrize("bad", ["10", "-1", "1.5", "high"])
def test_publish_refuses_a_bad_priority_and_writes_nothing(url: str, bad: str) -> None:
    cli(url, "topics", "create", "orders")
    result = cli(url, "publish", "orders", "1", "--priority", bad, code=2)
    assert "--priority" in result.stderr
    assert cli(url, "consume", "orders", "--wait", "0").stdout == ""


def test_publish_stdin_reports_invalid_line_and_publishes_the_rest(url: str) -> None:
    cli(url, "topics", "create", "orders")
    lines = '{"n": 1}\n{not json\n\n[2, 3]\n"four"\n'
    result = cli(url, "publish", "orders", input=lines, code=1)
    assert "line 2: invalid JSON" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stdout.split()) == 3  # the ids
    consumed = json_lines(cli(url, "consume", "orders", "--count", "10").stdout)
    assert sorted(json.dumps(m["payload"]) for m in consumed) == sorted(
        ['{"n": 1}', "[2, 3]", '"four"']
    )


def test_publish_skips_nan_lines_with_their_number(url: str) -> None:
    cli(url, "topics", "create", "orders")
    lines = '{"n": 1}\nNaN\n{"n": 3}\n[Infinity]\n{"n": 5}\n'
    for extra in ([], ["--batch", "2"], ["--concurrency", "3"]):
        result = cli(url, "publish", "orders", *extra, input=lines, code=1)
        assert "line 2: invalid JSON (NaN is not valid JSON); skipped" in result.stderr
        assert "line 4: invalid JSON (Infinity is not valid JSON); skipped" in result.stderr
        assert "error: 2 invalid JSON lines skipped" in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stdout.split()) == 3
        consumed = json_lines(cli(url, "consume", "orders", "--count", "10").stdout)
        assert sorted(m["payload"]["n"] for m in consumed) == [1, 3, 5]
    single = cli(url, "publish", "orders", "NaN", code=2)
    assert single.stderr == "error: invalid JSON message: NaN is not valid JSON\n"


def test_publish_delay_group_dedup_id_and_attributes(url: str) -> None:
    cli(url, "topics", "create", "orders")
    once = ["publish", "orders", '{"a": 1}', "--dedup-id", "o-1", "--group", "g", "-a", "k=v"]
    first = cli(url, *once).stdout.strip()
    assert cli(url, *once).stdout.strip() == first  # a repeat within the window: same id
    cli(url, "publish", "orders", '"later"', "--delay", "3600", "--attribute", "when=later")
    cli(url, "publish", "orders", "--group", "h", input="1\n2\n3\n")
    stats = json.loads(cli(url, "topics", "stats", "orders", "--json").stdout)
    assert stats["delayed"] == 1
    consumed = json_lines(cli(url, "consume", "orders", "--count", "10").stdout)
    assert [(m["payload"], m.get("group")) for m in consumed] == [
        ({"a": 1}, "g"),
        (1, "h"),
        (2, "h"),
        (3, "h"),
    ]
    assert consumed[0]["id"] == first and consumed[0]["attributes"] == {"k": "v"}
    stdin_dedup = cli(url, "publish", "orders", "--dedup-id", "x", input="1\n", code=2)
    assert stdin_dedup.stderr.startswith("error: --dedup-id needs one message")
    batched = cli(url, "publish", "orders", "--batch", "2", "--delay", "5", input="1\n", code=2)
    assert "--batch cannot be combined" in batched.stderr


def test_publish_into_a_full_topic_says_it_waits_and_how_long(url: str) -> None:
    cli(url, "topics", "create", "small", "--max-pending", "1")
    cli(url, "publish", "small", "1")
    result = cli(url, "publish", "small", "2", "--wait-for-room", "1.5", code=1)
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "topic small is full (max_pending 1): waiting up to 1.5s for room (--wait-for-room)"
    )
    assert lines[1].startswith("error: topic 'small' holds 1 pending messages")
    assert lines[1].endswith("had no room within 1.5s") and len(lines) == 2
    piped = cli(url, "publish", "small", "--wait-for-room", "0", input="3\n4\n", code=1)
    assert piped.stderr.startswith("error: line 1: topic 'small' holds 1 pending messages")
    assert "stopped there" in piped.stderr and piped.stdout == ""
    cli(url, "topics", "update", "small", "--max-pending", "5")
    roomy = cli(url, "publish", "small", "5")
    assert roomy.stderr == ""
    assert json.loads(cli(url, "topics", "stats", "small", "--json").stdout)["pending"] == 2


def test_publish_concurrently(url: str) -> None:
    cli(url, "topics", "create", "orders")
    lines = "".join(json.dumps(i) + "\n" for i in range(40))
    assert (
        len(cli(url, "publish", "orders", "--concurrency", "8", input=lines).stdout.split()) == 40
    )
    consumed = json_lines(cli(url, "consume", "orders", "--count", "100").stdout)
    assert sorted(m["payload"] for m in consumed) == list(range(40))


def test_publish_batch_and_count(url: str) -> None:
    cli(url, "topics", "create", "orders")
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(7))
    result = cli(url, "publish", "orders", "--batch", "3", input=lines)
    assert len(result.stdout.split()) == 7
    stats = json.loads(cli(url, "--json", "topics", "stats", "orders").stdout)
    assert stats["pending"] == 7  # messages, in batch objects of 3 + 3 + 1
    assert stats["pending_objects"] == 3
    first = json_lines(cli(url, "consume", "orders", "--count", "4").stdout)
    assert [m["payload"]["n"] for m in first] == [0, 1, 2, 3]
    rest = json_lines(cli(url, "consume", "orders").stdout)
    assert sorted(m["payload"]["n"] for m in rest) == [4, 5, 6]


def test_consume_no_ack_releases(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", '"x"')
    first = json_lines(cli(url, "consume", "orders", "--no-ack").stdout)
    again = json_lines(cli(url, "consume", "orders", "--count", "1").stdout)
    assert first[0]["id"] == again[0]["id"]  # released on exit: available at once


def test_peek_does_not_claim(url: str) -> None:
    cli(url, "topics", "create", "orders")
    for i in range(3):
        cli(url, "publish", "orders", json.dumps({"n": i}))
    cli(url, "publish", "orders", "--batch", "5", input='{"b": 1}\n{"b": 2}\n')
    rows = json.loads(cli(url, "peek", "orders", "--json", "--limit", "4").stdout)
    assert [r.get("payload") for r in rows] == [{"n": 0}, {"n": 1}, {"n": 2}, {"b": 1}]
    assert {r["state"] for r in rows} == {"pending"}
    table = cli(url, "peek", "orders").stdout
    assert rows[0]["id"] in table
    assert len(json_lines(cli(url, "consume", "orders", "--count", "10").stdout)) == 5


def test_peek_shows_a_group_waiting_behind_its_head(url: str) -> None:
    cli(url, "topics", "create", "orders")
    for n in range(3):
        cli(url, "publish", "orders", json.dumps({"n": n}), "--group", "g")

    async def main() -> list[dict[str, Any]]:
        async with PawnQueue.from_url(url) as pq:
            consumer = await pq.register_consumer("holder", topics=["orders"])
            [head] = await consumer.poll(wait=2)
            shown = await asyncio.to_thread(cli, url, "peek", "orders", "--json")
            await head.ack()
            rows: list[dict[str, Any]] = json.loads(shown.stdout)
            return rows

    rows = asyncio.run(main())
    assert [(r["payload"], r["state"], r["group"]) for r in rows] == [
        ({"n": 0}, "in_flight", "g"),  # the group's lease covers its oldest message only
        ({"n": 1}, "pending", "g"),
        ({"n": 2}, "pending", "g"),
    ]


# -- dead letters ---------------------------------------------------------------------------


def test_dlq_list_show_redrive_purge(url: str) -> None:
    cli(url, "topics", "create", "orders")
    ids = dead_letter_some(url, "orders", 3)
    listed = json.loads(cli(url, "dlq", "list", "orders", "--json").stdout)
    assert sorted(d["id"] for d in listed) == sorted(ids)
    assert {d["reason"] for d in listed} == {"nack"}
    assert ids[0] in cli(url, "dlq", "list", "orders").stdout
    shown = json.loads(cli(url, "dlq", "show", "orders", ids[0]).stdout)
    assert shown["id"] == ids[0] and "payload" in shown
    missing = cli(url, "dlq", "show", "orders", "nope", code=1)
    assert "no dead letter" in missing.stderr
    redriven = cli(url, "dlq", "redrive", "orders", "--id", ids[0], "--per-second", "100")
    assert "redrove 1" in redriven.stdout
    back = json_lines(cli(url, "consume", "orders").stdout)
    assert [m["id"] for m in back] == [ids[0]]
    assert json.loads(cli(url, "--json", "dlq", "redrive", "orders", "--limit", "1").stdout) == {
        "topic": "orders",
        "redriven": 1,
    }
    assert "purged 1" in cli(url, "dlq", "purge", "orders", "--yes").stdout
    assert json.loads(cli(url, "dlq", "list", "orders", "--json").stdout) == []


def test_dlq_list_shows_each_priority(url: str) -> None:
    cli(url, "topics", "create", "orders")
    ids = [cli(url, "publish", "orders", "{}", "--priority", p).stdout.strip() for p in "70"]

    async def nack_all() -> None:
        async with PawnQueue.from_url(url) as pq:
            consumer = await pq.register_consumer("nacker", topics=["orders"])
            while messages := await consumer.poll():
                await asyncio.gather(*(message.nack() for message in messages))

    asyncio.run(nack_all())
    listed = json.loads(cli(url, "dlq", "list", "orders", "--json").stdout)
    assert {d["id"]: d["priority"] for d in listed} == {ids[0]: 7, ids[1]: 0}
    assert json.loads(cli(url, "dlq", "show", "orders", ids[0]).stdout)["priority"] == 7
    table = [cells(line) for line in cli(url, "dlq", "list", "orders").stdout.splitlines()]
    assert ["id", "reason", "priority"] in [row[:3] for row in table]
    rows = {row[0]: row[1:3] for row in table if row and row[0] in ids}
    assert rows == {ids[0]: ["nack", "7"], ids[1]: ["nack", "0"]}


def cells(line: str) -> list[str]:
    """The cells of a row of a printed table."""
    return [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]


def test_dlq_list_is_oldest_first_and_show_reads_one(url: str) -> None:
    cli(url, "topics", "create", "orders")
    ids = dead_letter_some(url, "orders", 6)  # in the order they were dead-lettered
    listed = json.loads(cli(url, "dlq", "list", "orders", "--json").stdout)
    assert [d["id"] for d in listed] == ids
    limited = json.loads(cli(url, "dlq", "list", "orders", "--limit", "2", "--json").stdout)
    assert [d["id"] for d in limited] == ids[:2]
    shown = json.loads(cli(url, "dlq", "show", "orders", ids[3]).stdout)
    assert shown == listed[3]
    unknown = "00000000-0000-4000-8000-000000000000"
    missing = cli(url, "dlq", "show", "orders", unknown, code=1)
    assert missing.stderr == f"error: no dead letter '{unknown}' in topic 'orders'\n"
    no_topic = cli(url, "dlq", "show", "nope", ids[0], code=1)
    assert no_topic.stderr == "error: topic 'nope' does not exist\n"


# -- registry, doctor, demo, metrics --------------------------------------------------------


def test_consumers_and_producers(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", "1", "--producer", "svc-a")
    cli(url, "consume", "orders", "--consumer", "worker-1")
    producers = json.loads(cli(url, "producers", "--json").stdout)
    assert [(p["name"], p["status"], p["pid"]) for p in producers] == [("svc-a", "unknown", None)]
    consumers = json.loads(cli(url, "--json", "consumers").stdout)
    # The consume command ran in this process and stopped cleanly.
    assert [(c["name"], c["status"], c["pid"]) for c in consumers] == [
        ("worker-1", "stopped", os.getpid())
    ]
    table = cli(url, "consumers").stdout
    assert "worker-1" in table and "stopped" in table


def test_doctor_on_a_local_directory(url: str) -> None:
    Path(url.removeprefix("file://")).mkdir()  # doctor checks a store, it creates none
    report = json.loads(cli(url, "doctor", "--json").stdout)
    assert report["ok"] is True
    assert report["strategy"] == "conditional_write"
    names = {c["name"]: c["status"] for c in report["checks"]}
    assert names["create-only race"] == "ok"
    assert names["read-after-write"] == "ok"
    assert set(report["latency_ms"]) == {"PUT", "GET", "HEAD"}
    assert report["clock_skew_seconds"] is not None
    text = cli(url, "doctor").stdout
    assert "strategy: conditional_write" in text
    assert names["conditional write: if-match, current ETag"] == "ok"


def test_demo(tmp_path: Path) -> None:
    result = cli(None, "demo", "--orders", "60", "--workers", "2", "--dir", str(tmp_path / "d"))
    assert "processed (acked)" in result.stdout
    assert "duplicates" in result.stdout


def test_metrics_module_observes_from_outside() -> None:
    from prometheus_client import CollectorRegistry

    from pawn_queue.config import PawnQueueConfig
    from pawn_queue.metrics import METRIC_NAMES, QueueMetrics
    from pawn_queue.store.memory import MemoryStore

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)

    async def main() -> None:
        config = PawnQueueConfig.from_url("memory://")
        async with PawnQueue(config, store=metrics.wrap_store(MemoryStore())) as pq:
            await pq.create_topic("t")
            producer = await pq.register_producer("p")
            for i in range(3):
                await producer.publish("t", i)
            metrics.published("t", 3)
            consumer = await pq.register_consumer("c", topics=["t"])
            messages = await metrics.poll(consumer, wait=1)
            assert len(messages) == 3
            await messages[0].ack()
            await messages[1].nack()
            await messages[2].nack(requeue=True)
            handled = asyncio.Event()

            async def handler(msg: Any) -> None:
                await msg.ack()
                handled.set()

            task = asyncio.create_task(consumer.listen(metrics.handler(handler)))
            await asyncio.wait_for(handled.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("pawnqueue_messages_published_total", topic="t") == 3
    assert value("pawnqueue_messages_delivered_total", topic="t") == 4
    assert value("pawnqueue_messages_acked_total", topic="t") == 2
    assert value("pawnqueue_messages_nacked_total", topic="t", requeue="false") == 1
    assert value("pawnqueue_messages_nacked_total", topic="t", requeue="true") == 1
    assert value("pawnqueue_messages_dead_lettered_total", topic="t") == 1
    assert value("pawnqueue_store_requests_total", operation="put_create", outcome="ok") >= 1
    assert value("pawnqueue_poll_seconds_count", outcome="messages") == 1
    assert value("pawnqueue_handler_seconds_count", topic="t", outcome="ok") == 1
    exported = {m.name for m in registry.collect()}
    for name in METRIC_NAMES:
        assert name.removesuffix("_total") in exported


# -- errors ---------------------------------------------------------------------------------


def test_bad_url_is_one_line_without_traceback() -> None:
    result = cli("ftp://nowhere", "topics", "list", code=None)
    assert result.exit_code != 0
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stdout + result.stderr


def test_debug_shows_the_traceback() -> None:
    result = cli("ftp://nowhere", "--debug", "topics", "list", code=2)
    assert "Traceback" in result.stderr


def test_no_store_given() -> None:
    result = cli(None, "topics", "list", code=2)
    assert "--url" in result.stderr and "PAWNQUEUE_URL" in result.stderr


def test_store_from_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAWNQUEUE_URL", url)
    cli(None, "topics", "create", "envtopic")
    assert cli(None, "topics", "list").stdout.split() == ["envtopic"]


def test_store_from_config_file(tmp_path: Path) -> None:
    config = tmp_path / "pq.yaml"
    config.write_text(f"backend: filesystem\nfilesystem:\n  path: {tmp_path / 'q'}\n")
    cli(None, "--config", str(config), "topics", "create", "fromfile")
    assert cli(None, "-c", str(config), "topics", "list").stdout.split() == ["fromfile"]
    missing = cli(None, "--config", str(tmp_path / "nope.yaml"), "topics", "list", code=2)
    assert "config file not found" in missing.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["consume", "nope"],
        ["publish", "nope", "1"],
        ["peek", "nope"],
        ["metrics", "nope", "--duration", "0"],
        ["dlq", "list", "nope"],
        ["topics", "stats", "nope"],
        ["topics", "delete", "nope", "--yes"],
    ],
)
def test_unknown_topic(url: str, command: list[str]) -> None:
    cli(url, "topics", "create", "other")  # the queue exists; only the topic does not
    result = cli(url, *command, code=1)
    assert result.stderr.strip() == "error: topic 'nope' does not exist"


def test_invalid_single_message(url: str) -> None:
    cli(url, "topics", "create", "orders")
    result = cli(url, "publish", "orders", "{oops", code=2)
    assert result.stderr.startswith("error: invalid JSON message")


def test_bad_log_level(url: str) -> None:
    result = cli(url, "--log-level", "loud", "topics", "list", code=2)
    assert "--log-level" in result.stderr


def test_log_level_debug_shows_library_events(url: str) -> None:
    result = cli(url, "--log-level", "debug", "topics", "create", "orders")
    assert "topic created topic=orders" in result.stderr


# -- real subprocesses: local directory and SeaweedFS --------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    env.update(extra)
    return env


@pytest.fixture(params=["filesystem", "s3"])
def store_target(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    if request.param == "filesystem":
        # A secret in the environment that the local store does not even use.
        yield f"file://{tmp_path / 'queue'}", _env(PAWNQUEUE_S3_SECRET_KEY=SECRET)
        return
    s3: S3Config = request.getfixturevalue("s3_config")
    yield (
        f"s3://{s3.bucket_name}/cli?endpoint_url={s3.endpoint_url}",
        _env(PAWNQUEUE_S3_ACCESS_KEY=ACCESS, PAWNQUEUE_S3_SECRET_KEY=SECRET),
    )


class Proc:
    """``python -m pawn_queue --url URL --log-level debug ARGS`` (no ``--url`` if ``url`` is
    None), in ``cwd``; asserts the exit code and keeps every output."""

    def __init__(self, url: str | None, env: dict[str, str], cwd: Path | None = None) -> None:
        self.url, self.env, self.cwd = url, env, cwd
        self.outputs: list[str] = []

    def __call__(
        self, *args: str, input: str | None = None, code: int = 0
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pawn_queue", "--log-level", "debug"]
        if self.url is not None:
            argv += ["--url", self.url]
        done = subprocess.run(
            [*argv, *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            timeout=120,
        )
        self.outputs += [done.stdout, done.stderr]
        assert done.returncode == code, (args, done.stdout, done.stderr)
        return done


def test_main_paths_as_subprocesses(store_target: tuple[str, dict[str, str]]) -> None:
    run = Proc(*store_target)
    run("topics", "create", "orders")
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(5)) + "oops\n"
    published = run("publish", "orders", input=lines, code=1)
    assert "line 6: invalid JSON" in published.stderr
    assert len(published.stdout.split()) == 5
    stats = json.loads(run("--json", "topics", "stats", "orders").stdout)
    assert stats["pending"] == 5
    assert "pending" in run("topics", "stats").stdout
    consumed = json_lines(run("consume", "orders", "--count", "3").stdout)
    assert [m["payload"]["n"] for m in consumed] == [0, 1, 2]
    assert json.loads(run("dlq", "list", "orders", "--json").stdout) == []
    report = json.loads(run("doctor", "--json").stdout)
    assert report["ok"] is True and report["strategy"] == "conditional_write"
    run("consume", "nope", code=1)
    bad = run("--url", "s3://", "topics", "list", code=2)  # the later --url wins: invalid
    assert "Traceback" not in bad.stderr
    everything = "\n".join(run.outputs)
    assert "topic created" in everything  # the debug log reached stderr
    assert SECRET not in everything
    assert ACCESS not in everything


def test_secret_never_in_output_of_a_failing_s3_connection(tmp_path: Path) -> None:
    # Nothing listens on this port: the store error must not echo the credentials.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = _env(
        PAWNQUEUE_URL=f"s3://bucket-x?endpoint_url=http://127.0.0.1:{port}&max_retries=0",
        PAWNQUEUE_S3_ACCESS_KEY=ACCESS,
        PAWNQUEUE_S3_SECRET_KEY=SECRET,
    )
    for debug in ([], ["--debug"]):
        done = subprocess.run(
            [sys.executable, "-m", "pawn_queue", *debug, "--log-level", "debug", "topics", "list"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode != 0
        assert SECRET not in done.stdout + done.stderr
        assert ACCESS not in done.stdout + done.stderr
        if not debug:
            assert done.stderr.strip().count("\n") == 0, done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_consume_with_metrics_port(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", "1")
    for _ in range(2):  # twice in one process: the metrics are registered once
        cli(url, "publish", "orders", "2")
        out = cli(url, "consume", "orders", "--count", "1", "--metrics-port", str(free_port()))
        assert len(json_lines(out.stdout)) == 1
    from prometheus_client import REGISTRY

    acked = REGISTRY.get_sample_value("pawnqueue_messages_acked_total", {"topic": "orders"})
    assert acked is not None and acked >= 2


def test_metrics_exporter_subprocess(url: str) -> None:
    cli(url, "topics", "create", "orders")
    cli(url, "publish", "orders", "1")
    port = free_port()
    argv = [sys.executable, "-m", "pawn_queue", "--url", url, "metrics", "orders"]
    argv += ["--port", str(port), "--addr", "127.0.0.1", "--interval", "0.2", "--duration", "20"]
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body = ""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                if 'pawnqueue_topic_pending{topic="orders"} 1.0' in body:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert 'pawnqueue_topic_pending{topic="orders"} 1.0' in body
        assert "pawnqueue_store_requests_total" in body
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- one rule for exit codes ------------------------------------------------------------------

# Exit 2: the command refused a value before doing anything; 1: it ran and failed, or did
# not do all it was asked (docs/operations/cli.md, "Exit codes").
REFUSED = [
    (["dlq", "list", "orders", "--limit", "-1"], 2, "--limit"),
    (["dlq", "list", "orders", "--limit", "0"], 2, "--limit"),
    (["dlq", "redrive", "orders", "--limit", "0"], 2, "--limit"),
    (["dlq", "redrive", "orders", "--id", "nope"], 1, "1 of the 1 ids given are not dead"),
    (["topics", "update", "orders"], 2, "nothing to update"),
    (["publish", "orders", "{}", "--dedup-id", ""], 2, "dedup_id"),
    (["publish", "orders", "{}", "--group", ""], 2, "--group"),
    (["publish", "orders", "{}", "--delay", "-1"], 2, "--delay"),
    (["publish", "orders", "{}", "--delay", "1e12"], 2, "delay"),
    (["publish", "orders", "{}", "--expires-in", "0"], 2, "expires_in"),
    (["publish", "orders", "{}", "--expires-in", "inf"], 2, "expires_in"),
    (["publish", "orders", "{}", "--delay", "5", "--expires-in", "5"], 2, "shorter than"),
    (["demo", "--orders", "-5"], 2, "--orders"),
    (["demo", "--workers", "0"], 2, "--workers"),
    (["demo", "--fail-rate", "7"], 2, "--fail-rate"),
]


@pytest.mark.parametrize(
    ("argv", "code", "says"), REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED]
)
def test_a_command_that_did_not_do_what_was_asked_says_so(
    url: str, tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    cli(url, "topics", "create", "orders")
    [dead] = dead_letter_some(url, "orders", 1)
    if argv[0] == "demo":
        argv = [*argv, "--dir", str(tmp_path / "demo")]
    result = cli(None if argv[0] == "demo" else url, *argv, code=code)
    assert says in result.stderr
    if argv[0] == "demo":
        assert not (tmp_path / "demo").exists()
    # Nothing changed: the dead letter is still there, no message was published.
    letters = json.loads(cli(url, "--json", "dlq", "list", "orders").stdout)
    assert [letter["id"] for letter in letters] == [dead]
    assert json.loads(cli(url, "--json", "topics", "stats", "orders").stdout)["pending"] == 0


def test_infinite_and_fractional_topic_settings_are_refused(url: str) -> None:
    """--retention-seconds inf raised "payload is not JSON-serialisable" (exit 1)."""
    for option, value in (
        ("--retention-seconds", "inf"),
        ("--retention-seconds", "nan"),
        ("--dedup-window-seconds", "inf"),
    ):
        result = cli(url, "topics", "create", "orders", option, value, code=2)
        assert result.stderr.startswith(f"error: {option[2:].replace('-', '_')}: got")
    assert not (Path(url.removeprefix("file://")) / "orders").exists()
