"""``pawn-queue subscriptions ...`` and ``--subscription`` on consume, dlq, topics stats and
worker: through Typer's CliRunner on every store, and the worker as real processes (an
App's subscription subscribers, and a module:function with --subscription)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from pawn_queue.cli import app
from pawn_queue.sync import PawnQueue
from tests.helpers.stores import queue_config_dict

MISSING = "error: subscription 'nope' of topic 'orders' does not exist\n"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PAWNQUEUE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def config(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, quick_subscription_changes: None
) -> Path:
    """A config file for ``backend`` (a memory store is shared by the commands of a test:
    they run in this process, so subscription changes wait as little as the producers'
    cache lasts)."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(queue_config_dict(backend, request, tmp_path)))
    return path


def cli(config: Path | None, *args: str, input: str | None = None, code: int = 0) -> Result:
    argv = (["--config", str(config)] if config else []) + list(args)
    result = CliRunner().invoke(app, argv, input=input)
    assert result.exit_code == code, (argv, result.stdout, result.stderr, result.exception)
    return result


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


# -- help -----------------------------------------------------------------------------------


def test_help_shows_subscriptions_and_the_subscription_options() -> None:
    assert "subscriptions" in cli(None, "--help").stdout
    group = cli(None, "subscriptions", "--help").stdout
    for command in ("create", "list", "show", "update", "delete", "seek"):
        assert command in group
        assert "Usage" in cli(None, "subscriptions", command, "--help").stdout
    assert "--filter" in cli(None, "subscriptions", "create", "--help").stdout
    for command in (
        ["consume"],
        ["dlq", "list"],
        ["dlq", "show"],
        ["dlq", "redrive"],
        ["dlq", "purge"],
        ["topics", "stats"],
        ["worker"],
    ):
        assert "--subscription" in cli(None, *command, "--help").stdout, command


# -- subscriptions --------------------------------------------------------------------------


def test_create_list_show_update_delete(config: Path) -> None:
    cli(config, "topics", "create", "orders")
    made = cli(
        config,
        "subscriptions",
        "create",
        "orders",
        "billing",
        "--filter",
        '{"region": ["eu", "uk"]}',
        "--max-receive-count",
        "3",
        "--linger-seconds",
        "0.05",
    )
    assert made.stderr == (
        'subscription billing of topic orders ready: filter={"region":["eu","uk"]} '
        "max_receive_count=3 retention_seconds=none retention_action=delete "
        "linger_seconds=0.05\n"
    )
    audit = as_json(cli(config, "subscriptions", "create", "orders", "audit", "--json"))
    assert (audit["topic"], audit["subscription"], audit["filter"]) == ("orders", "audit", None)
    conflict = cli(
        config,
        "subscriptions",
        "create",
        "orders",
        "billing",
        "--filter",
        '{"region": "us"}',
        code=1,
    )
    assert conflict.stderr == (
        "error: subscription billing of topic orders exists with other settings: "
        'filter is {"region":["eu","uk"]}, asked {"region":"us"} '
        "(change them with 'pawn-queue subscriptions update')\n"
    )

    listed = as_json(cli(config, "subscriptions", "list", "orders", "--json"))
    assert [(s["subscription"], s["filter"]) for s in listed] == [
        ("audit", None),
        ("billing", {"region": ["eu", "uk"]}),
    ]
    assert listed[1]["settings"]["max_receive_count"] == 3
    assert (listed[0]["settings"]["linger_seconds"], listed[1]["settings"]["linger_seconds"]) == (
        0.0,
        0.05,
    )
    table = cli(config, "subscriptions", "list", "orders").stdout
    assert "audit" in table and "every message" in table and '{"region":["eu","uk"]}' in table

    cli(config, "publish", "orders", '{"n": 1}', "--attribute", "region=eu")
    cli(config, "publish", "orders", '{"n": 2}', "--attribute", "region=us")
    shown = as_json(cli(config, "subscriptions", "show", "orders", "billing", "--json"))
    assert shown["filter"] == {"region": ["eu", "uk"]}
    assert (shown["stats"]["pending"], shown["stats"]["dead_letter"]) == (1, 0)
    shown_table = cli(config, "subscriptions", "show", "orders", "billing").stdout
    for text in ("subscription billing of topic orders", "max_receive_count", "pending"):
        assert text in shown_table
    topic = as_json(cli(config, "topics", "show", "orders", "--json"))
    assert topic["subscriptions"] == ["audit", "billing"]
    assert topic["stats"]["pending"] == 0  # the copies went to the subscriptions only
    one = as_json(cli(config, "topics", "stats", "orders", "--subscription", "audit", "--json"))
    assert (one["subscription"], one["pending"]) == ("audit", 2)
    rows = as_json(cli(config, "topics", "stats", "--json"))
    assert [(r["topic"], r.get("subscription"), r["pending"]) for r in rows] == [
        ("orders", None, 0),
        ("orders", "audit", 2),
        ("orders", "billing", 1),
    ]
    assert "subscription" in cli(config, "topics", "stats").stdout

    consumed = cli(config, "consume", "orders", "--subscription", "billing").stdout
    [message] = [json.loads(line) for line in consumed.splitlines()]
    assert (message["subscription"], message["payload"]) == ("billing", {"n": 1})
    assert message["attributes"] == {"region": "eu"}

    updated = cli(
        config,
        "subscriptions",
        "update",
        "orders",
        "billing",
        "--filter",
        "none",
        "--max-receive-count",
        "none",
    )
    assert "filter=every message max_receive_count=none" in updated.stderr
    again = as_json(
        cli(
            config,
            "subscriptions",
            "update",
            "orders",
            "billing",
            "--retention-seconds",
            "60",
            "--linger-seconds",
            "0",
            "--json",
        )
    )
    assert again["filter"] is None and again["settings"]["retention_seconds"] == 60
    assert again["settings"]["linger_seconds"] == 0.0
    for bad in ("1.5", "-1", "nan"):
        cli(config, "subscriptions", "update", "orders", "billing", "--linger-seconds", bad, code=2)
    cli(config, "publish", "orders", '{"n": 3}')  # no attributes: billing takes it now
    consumed = cli(config, "consume", "orders", "--subscription", "billing").stdout
    assert [json.loads(line)["payload"] for line in consumed.splitlines()] == [{"n": 3}]

    refused = cli(config, "subscriptions", "delete", "orders", "audit", input="n\n", code=1)
    assert "not confirmed" in refused.stderr
    deleted = cli(config, "subscriptions", "delete", "orders", "audit", "--yes")
    assert deleted.stderr == "subscription audit of topic orders deleted\n"
    listed = as_json(cli(config, "subscriptions", "list", "orders", "--json"))
    assert [s["subscription"] for s in listed] == ["billing"]


def test_replay_window_start_and_seek(config: Path) -> None:
    cli(config, "topics", "create", "orders", "--replay-window-seconds", "3600")
    for n in range(3):
        cli(config, "publish", "orders", f'{{"n": {n}}}')
    created = cli(config, "subscriptions", "create", "orders", "late", "--start", "earliest")
    assert "ready" in created.stderr
    assert (
        as_json(cli(config, "subscriptions", "show", "orders", "late", "--json"))["stats"][
            "pending"
        ]
        == 3
    )  # what the window kept
    cli(config, "subscriptions", "seek", "orders", "late", "latest", "--yes")
    shown = as_json(cli(config, "subscriptions", "show", "orders", "late", "--json"))
    assert shown["stats"]["pending"] == 0
    # Before the window: refused, saying why, unless --drop.
    long_ago = ("subscriptions", "seek", "orders", "late", "2000-01-01T00:00:00Z", "--yes")
    refused = cli(config, *long_ago, code=2)
    assert "keeps messages 3600 s" in refused.stderr and "--drop" in refused.stderr
    cli(config, *long_ago, "--drop")
    shown = as_json(cli(config, "subscriptions", "show", "orders", "late", "--json"))
    assert shown["stats"]["pending"] == 3
    # A time without its zone, or any other word, is a usage error that changes nothing.
    for bad in ("2000-01-01T00:00:00", "yesterday"):
        cli(config, "subscriptions", "seek", "orders", "late", bad, "--yes", code=2)
        cli(config, "subscriptions", "create", "orders", "x", "--start", bad, code=2)
    shown = as_json(cli(config, "subscriptions", "show", "orders", "late", "--json"))
    assert shown["stats"]["pending"] == 3
    assert [
        s["subscription"] for s in as_json(cli(config, "subscriptions", "list", "orders", "--json"))
    ] == ["late"]


def test_a_seek_that_would_lose_what_waits_is_refused(config: Path) -> None:
    cli(config, "topics", "create", "orders")  # no replay window
    cli(config, "subscriptions", "create", "orders", "billing")
    for n in range(5):
        cli(config, "publish", "orders", f'{{"n": {n}}}')
    refused = cli(config, "subscriptions", "seek", "orders", "billing", "earliest", "--yes", code=2)
    assert "keeps no history (replay_window_seconds=0)" in refused.stderr
    assert "is at" not in refused.stderr
    shown = as_json(cli(config, "subscriptions", "show", "orders", "billing", "--json"))
    assert shown["stats"]["pending"] == 5
    cli(config, "subscriptions", "seek", "orders", "billing", "earliest", "--yes", "--drop")
    shown = as_json(cli(config, "subscriptions", "show", "orders", "billing", "--json"))
    assert shown["stats"]["pending"] == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--filter", "{oops"], "error: --filter: invalid JSON"),
        (["--filter", '{"n": NaN}'], "error: --filter: invalid JSON (NaN is not valid JSON)"),
        (["--filter", "[1]"], "error: --filter: filter: got [1], must be a mapping"),
        (["--filter", '{"region": 5}'], "error: --filter: filter['region']: got 5"),
        (["--filter", '{"region": []}'], "error: --filter: filter['region']: a list must hold"),
        (["--filter", '{"r": {"prefix": ""}}'], "error: --filter: filter['r']"),
        (["--max-receive-count", "0"], "error: max_receive_count: got 0"),
        (["--retention-action", "keep"], "error: retention_action: got 'keep'"),
        (["--retention-seconds", "inf"], "error: retention_seconds: got inf"),
    ],
)
def test_bad_input_to_create_is_a_usage_error_that_writes_nothing(
    tmp_path: Path, argv: list[str], says: str
) -> None:
    root = tmp_path / "queue"
    result = cli(
        None, "--url", f"file://{root}", "subscriptions", "create", "t", "s", *argv, code=2
    )
    assert result.stderr.startswith(says), result.stderr
    assert result.stderr.count("\n") == 1
    assert not (root / "t").exists()


def test_unknown_names_and_bad_input_are_clear_errors(config: Path) -> None:
    cli(config, "topics", "create", "orders")
    for command in (
        ["subscriptions", "show", "orders", "nope"],
        ["subscriptions", "update", "orders", "nope", "--max-receive-count", "2"],
        ["subscriptions", "delete", "orders", "nope", "--yes"],
        ["consume", "orders", "--subscription", "nope"],
        ["dlq", "list", "orders", "--subscription", "nope"],
        ["dlq", "purge", "orders", "--subscription", "nope", "--yes"],
        ["topics", "stats", "orders", "--subscription", "nope"],
    ):
        assert cli(config, *command, code=1).stderr == MISSING, command
    for command in (
        ["subscriptions", "create", "nope", "billing"],
        ["subscriptions", "list", "nope"],
        ["subscriptions", "show", "nope", "billing"],
        ["consume", "nope", "--subscription", "billing"],
        ["dlq", "list", "nope", "--subscription", "billing"],
    ):
        result = cli(config, *command, code=1)
        assert result.stderr == "error: topic 'nope' does not exist\n", command
    bad_name = cli(config, "subscriptions", "create", "orders", "no/slash", code=2)
    assert bad_name.stderr.startswith("error: subscription name 'no/slash' is invalid")
    nothing = cli(config, "subscriptions", "update", "orders", "billing", code=2)
    assert nothing.stderr.startswith("error: nothing to update: give at least one of --filter")
    lots = cli(
        config, "subscriptions", "update", "orders", "b", "--max-receive-count", "lots", code=2
    )
    assert (
        lots.stderr == "error: --max-receive-count: expected a whole number or 'none', got 'lots'\n"
    )
    alone = cli(config, "topics", "stats", "--subscription", "billing", code=2)
    assert alone.stderr == "error: --subscription needs the TOPIC it belongs to\n"
    assert as_json(cli(config, "subscriptions", "list", "orders", "--json")) == []


def test_dead_letters_of_a_subscription(config: Path) -> None:
    cli(config, "topics", "create", "orders")
    cli(config, "subscriptions", "create", "orders", "billing")
    with PawnQueue.from_config(str(config)) as pq:
        producer = pq.register_producer("shop")
        ids = [producer.publish("orders", {"n": n}) for n in range(2)]
        reader = pq.register_consumer("nacker", ["orders"], subscription="billing")
        nacked: list[str] = []
        while len(nacked) < len(ids):
            for message in reader.poll(wait=5):
                message.nack()
                nacked.append(message.id)
    listed = as_json(cli(config, "dlq", "list", "orders", "--subscription", "billing", "--json"))
    assert sorted(d["id"] for d in listed) == sorted(ids)
    assert {(d["topic"], d["subscription"]) for d in listed} == {("orders", "billing")}
    assert as_json(cli(config, "dlq", "list", "orders", "--json")) == []
    title = cli(config, "dlq", "list", "orders", "--subscription", "billing").stdout
    assert "dead letters of subscription billing of orders (2)" in title
    shown = as_json(cli(config, "dlq", "show", "orders", ids[0], "--subscription", "billing"))
    assert shown["id"] == ids[0] and shown["payload"] == {"n": 0}
    elsewhere = cli(config, "dlq", "show", "orders", ids[0], code=1)
    assert elsewhere.stderr == f"error: no dead letter '{ids[0]}' in topic 'orders'\n"

    redriven = cli(
        config, "--json", "dlq", "redrive", "orders", "--subscription", "billing", "--id", ids[0]
    )
    assert as_json(redriven) == {"topic": "orders", "subscription": "billing", "redriven": 1}
    stats = as_json(cli(config, "topics", "stats", "orders", "--subscription", "billing", "--json"))
    assert (stats["pending"], stats["dead_letter"]) == (1, 1)
    assert as_json(cli(config, "topics", "stats", "orders", "--json"))["pending"] == 0
    back = cli(config, "consume", "orders", "--subscription", "billing").stdout
    assert [json.loads(line)["id"] for line in back.splitlines()] == [ids[0]]
    purged = cli(config, "dlq", "purge", "orders", "--subscription", "billing", input="y\n")
    assert purged.stdout.endswith("purged 1 dead letters of subscription billing of orders\n")
    assert (
        as_json(cli(config, "dlq", "list", "orders", "--subscription", "billing", "--json")) == []
    )


# -- the worker, as real processes -----------------------------------------------------------

APP_MODULE = '''
"""Subscription subscribers run by pawn-queue worker: a line per message on stdout."""

import sys

from pawn_queue import App, Message

app = App(name="subs")


def say(kind: str, message: Message) -> None:
    sys.stdout.write(f"{kind} {message.id} {message.subscription}\\n")
    sys.stdout.flush()


@app.subscriber("orders", subscription="billing", retry=None)
async def bill(order: dict, message: Message) -> None:
    say("bill", message)


@app.subscriber("orders", subscription="eu", filter={"region": "eu"}, retry=None)
async def europe(order: dict, message: Message) -> None:
    say("europe", message)


async def audit(order: dict, message: Message) -> None:
    """A module:function handler, run with --topic orders --subscription audit."""
    say("audit", message)
'''


class Worker:
    """``pawn-queue --config FILE worker ARGS`` in ``cwd``; stdout lines on :attr:`lines`,
    stderr lines on :attr:`log` as they come."""

    def __init__(self, config: Path, cwd: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
        argv = [sys.executable, "-m", "pawn_queue", "--config", str(config), "worker", *args]
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[list[str]] = queue.Queue()
        self.log: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.split())

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)
            self.log.put(line)

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 60) -> list[str]:
        """The next ``count`` log lines holding ``text`` (the worker's own news)."""
        deadline, found = time.monotonic() + timeout, []
        while len(found) < count:
            line = self.log.get(timeout=max(0.0, deadline - time.monotonic()))
            if text in line:
                found.append(line)
        return found

    def take(self, count: int, timeout: float = 60) -> list[list[str]]:
        deadline = time.monotonic() + timeout
        return [self.lines.get(timeout=max(0.0, deadline - time.monotonic())) for _ in range(count)]

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def worker_dir(tmp_path: Path) -> Path:
    """A directory holding the app module ``subs_app`` (the worker imports from its cwd)."""
    directory = tmp_path / "app"
    directory.mkdir()
    (directory / "subs_app.py").write_text(textwrap.dedent(APP_MODULE))
    return directory


@pytest.mark.parametrize("store", ["filesystem", "s3"])
def test_the_worker_runs_an_apps_subscription_subscribers(
    store: str, request: pytest.FixtureRequest, tmp_path: Path, worker_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(queue_config_dict(store, request, tmp_path)))
    with PawnQueue.from_config(str(config)) as pq:
        pq.create_topic("orders")
    worker = Worker(config, worker_dir, "subs_app:app")
    try:
        # Once started, the subscriptions it created take every message published.
        [started] = worker.wait_for_log("worker started")
        assert "subscribers=bill.billing:orders@billing,europe.eu:orders@eu" in started
        with PawnQueue.from_config(str(config)) as pq:
            producer = pq.register_producer("shop")
            regions = ["eu", "us", "eu", "apac"]
            ids = [
                producer.publish("orders", {"n": n}, attributes={"region": region})
                for n, region in enumerate(regions)
            ]
        eu = {i for i, region in zip(ids, regions, strict=True) if region == "eu"}
        lines = worker.take(len(ids) + len(eu))
        assert sorted(mid for kind, mid, _ in lines if kind == "bill") == sorted(ids)
        assert {mid for kind, mid, _ in lines if kind == "europe"} == eu
        assert {(kind, sub) for kind, _, sub in lines} == {("bill", "billing"), ("europe", "eu")}
        assert worker.stop() == 0, "".join(worker.stderr)
    finally:
        worker.kill()
    log = "".join(worker.stderr)
    assert "subscription=billing" in log and "subscription=eu" in log  # the message lines
    with PawnQueue.from_config(str(config)) as pq:
        assert {s.name: s.filter for s in pq.list_subscriptions("orders")} == {
            "billing": None,
            "eu": {"region": "eu"},
        }
        for name in ("billing", "eu"):
            stats = pq.subscription_stats("orders", name)
            assert stats.pending + stats.in_flight + stats.delayed + stats.dead_letter == 0


def test_the_worker_runs_a_function_on_a_subscription_in_processes(
    request: pytest.FixtureRequest, tmp_path: Path, worker_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(queue_config_dict("filesystem", request, tmp_path)))
    with PawnQueue.from_config(str(config)) as pq:
        pq.create_topic("orders")
    worker = Worker(
        config,
        worker_dir,
        "subs_app:audit",
        "--topic",
        "orders",
        "--subscription",
        "audit",
        "--processes",
        "2",
    )
    try:
        # Each child says it started once its subscription exists.
        worker.wait_for_log("worker started app=worker subscribers=audit.audit:orders@audit", 2)
        with PawnQueue.from_config(str(config)) as pq:
            producer = pq.register_producer("shop")
            ids = [producer.publish("orders", {"n": n}) for n in range(20)]
        lines = worker.take(len(ids))
        assert sorted(mid for _, mid, _ in lines) == sorted(ids)  # each once, in one child
        assert {(kind, sub) for kind, _, sub in lines} == {("audit", "audit")}
        assert worker.stop() == 0, "".join(worker.stderr)
    finally:
        worker.kill()
    assert worker.lines.empty()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["subs_app:app", "--subscription", "billing"], "are for module:function"),
        (["subs_app:audit", "--subscription", "billing"], "give its topics with --topic"),
        (
            ["subs_app:audit", "--topic", "orders", "--subscription", "no/slash"],
            "subscription name 'no/slash' is invalid",
        ),
    ],
)
def test_the_workers_subscription_option_is_checked(
    tmp_path: Path, worker_dir: Path, args: list[str], error: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    url = f"file://{tmp_path / 'queue'}"
    result = subprocess.run(
        [sys.executable, "-m", "pawn_queue", "--url", url, "worker", *args],
        cwd=worker_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert error in result.stderr
