"""``pawn-queue schedules ...``: each command through Typer's CliRunner on memory and a local
directory, its errors (one line, the right exit code, nothing written), and ``schedules
run`` as a real process that fires ticks, serves their metrics and exits 0 when stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
import yaml
from typer.testing import CliRunner, Result

from pawn_queue.cli import app
from pawn_queue.sync import PawnQueue
from tests.helpers.stores import queue_config_dict

T = TypeVar("T")
COMMANDS = ("list", "show", "create", "pause", "resume", "trigger", "delete", "run")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PAWNQUEUE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def config(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A config file for ``backend`` (a memory store is shared by the commands of a test:
    they run in this process)."""
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


def test_help_shows_every_schedules_command() -> None:
    assert "schedules" in cli(None, "--help").stdout
    group = cli(None, "schedules", "--help").stdout
    for command in COMMANDS:
        assert command in group
        assert "Usage" in cli(None, "schedules", command, "--help").stdout
    create = cli(None, "schedules", "create", "--help").stdout
    for option in ("--topic", "--cron", "--every", "--payload", "--attribute", "--timezone"):
        assert option in create
    assert "--priority" in create and "--expires-in" in create


# -- the commands ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "filesystem"], indirect=True)
def test_create_list_show_pause_resume_trigger_delete(config: Path) -> None:
    cli(config, "topics", "create", "reports")
    made = cli(
        config,
        "schedules",
        "create",
        "nightly",
        "--topic",
        "reports",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--payload",
        '{"report": "sales"}',
        "--attribute",
        "team=ops",
        "--jitter-seconds",
        "5",
        "--catch-up-seconds",
        "120",
        "--start",
        "2026-01-01T00:00:00Z",
    )
    assert made.stderr == (
        "schedule nightly created: publishes to reports cron '0 2 * * *' in Europe/Berlin\n"
    )
    beat = as_json(
        cli(config, "schedules", "create", "beat", "--topic", "reports", "--every", "60", "--json")
    )
    assert (beat["schedule"], beat["every"], beat["cron"], beat["payload"]) == (
        "beat",
        60.0,
        None,
        None,
    )
    assert (beat["timezone"], beat["jitter_seconds"], beat["catch_up_seconds"]) == ("UTC", 0, 60)
    assert (beat["priority"], beat["expires_in"]) == (0, None)

    listed = as_json(cli(config, "schedules", "list", "--json"))
    assert [s["schedule"] for s in listed] == ["beat", "nightly"]
    nightly = listed[1]
    assert (nightly["topic"], nightly["cron"], nightly["timezone"]) == (
        "reports",
        "0 2 * * *",
        "Europe/Berlin",
    )
    assert (nightly["payload"], nightly["attributes"]) == ({"report": "sales"}, {"team": "ops"})
    assert (nightly["jitter_seconds"], nightly["catch_up_seconds"]) == (5, 120)
    assert nightly["start"] == "2026-01-01T00:00:00+00:00" and nightly["end"] is None
    table = cli(config, "schedules", "list").stdout
    assert "schedules (2)" in table
    assert "cron '0 2 * * *' in Europe/Berlin" in table and "every 60s" in table

    shown = as_json(cli(config, "schedules", "show", "nightly", "--json"))
    stats = shown["stats"]
    assert (stats["fired"], stats["missed"], stats["paused"], stats["last_fire_time"]) == (
        0,
        0,
        False,
        None,
    )
    upcoming = datetime.fromisoformat(stats["next_fire_time"]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (upcoming.hour, upcoming.minute) == (2, 0)
    text = cli(config, "schedules", "show", "nightly").stdout
    for row in ("schedule nightly", "Europe/Berlin", "next_fire_time", "fired", "missed"):
        assert row in text

    assert cli(config, "schedules", "pause", "nightly").stderr == "schedule nightly paused\n"
    paused = as_json(cli(config, "schedules", "show", "nightly", "--json"))
    assert paused["paused"] and paused["stats"]["next_fire_time"] is None
    assert re.search(r"nightly .* yes ", cli(config, "schedules", "list").stdout)
    assert cli(config, "schedules", "resume", "nightly").stderr == "schedule nightly resumed\n"
    assert not as_json(cli(config, "schedules", "show", "nightly", "--json"))["paused"]

    # A tick now, whatever the cron says: its message id on stdout.
    message_id = cli(config, "schedules", "trigger", "nightly").stdout.strip()
    [message] = [json.loads(line) for line in cli(config, "consume", "reports").stdout.splitlines()]
    assert (message["id"], message["payload"]) == (message_id, {"report": "sales"})
    attributes = message["attributes"]
    assert (attributes["schedule"], attributes["team"]) == ("nightly", "ops")
    assert datetime.fromisoformat(attributes["schedule_time"]).tzinfo is not None

    refused = cli(config, "schedules", "delete", "nightly", input="n\n", code=1)
    assert "not confirmed" in refused.stderr
    assert cli(config, "schedules", "delete", "nightly", "--yes").stderr == (
        "schedule nightly deleted\n"
    )
    assert [s["schedule"] for s in as_json(cli(config, "schedules", "list", "--json"))] == ["beat"]


@pytest.mark.parametrize("backend", ["memory", "filesystem"], indirect=True)
def test_ticks_published_with_priority_and_expiry(config: Path) -> None:
    cli(config, "topics", "create", "reports")
    made = cli(
        config,
        *("schedules", "create", "urgent", "--topic", "reports", "--every", "60"),
        *("--priority", "9", "--expires-in", "30"),
    )
    assert made.stderr == (
        "schedule urgent created: publishes to reports every 60s, priority 9, expiring after 30s\n"
    )
    cli(config, "schedules", "create", "plain", "--topic", "reports", "--every", "60")
    listed = as_json(cli(config, "schedules", "list", "--json"))
    assert [(s["schedule"], s["priority"], s["expires_in"]) for s in listed] == [
        ("plain", 0, None),
        ("urgent", 9, 30.0),
    ]
    table = cli(config, "schedules", "list").stdout
    assert "priority" in table and "expires_in" in table
    assert re.search(r"urgent .* every 60s .* 9 .* 30 ", table), table
    assert re.search(r"plain .* every 60s .* 0 .* none ", table), table
    shown = as_json(cli(config, "schedules", "show", "urgent", "--json"))
    assert (shown["priority"], shown["expires_in"]) == (9, 30.0)
    text = cli(config, "schedules", "show", "urgent").stdout
    assert re.search(r"priority +│ 9 ", text) and re.search(r"expires_in +│ 30 ", text), text

    message_id = cli(config, "schedules", "trigger", "urgent").stdout.strip()
    [message] = [json.loads(line) for line in cli(config, "consume", "reports").stdout.splitlines()]
    assert (message["id"], message["priority"]) == (message_id, 9)
    expires_at = datetime.fromisoformat(message["expires_at"])
    assert expires_at == datetime.fromisoformat(message["created_at"]) + timedelta(seconds=30)


# -- errors ----------------------------------------------------------------------------------

CREATE = ("schedules", "create", "s", "--topic", "reports")


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ([*CREATE, "--cron", "61 * * * *"], 2, "cron: '61 * * * *' is not a cron expression"),
        ([*CREATE, "--cron", "* * *"], 2, "cron: '* * *' is not a cron expression"),
        (
            [*CREATE, "--every", "60", "--timezone", "Mars/Olympus"],
            2,
            "timezone: 'Mars/Olympus' is not a known time zone",
        ),
        (["schedules", "create", "s", "--topic", "nope", "--every", "60"], 1, "topic 'nope' "),
        (["schedules", "create", "s", "--every", "60"], 2, "Missing option '--topic'"),
        (
            ["schedules", "create", "a/b", "--topic", "reports", "--every", "60"],
            2,
            "schedule name 'a/b' is invalid",
        ),
        (
            ["schedules", "create", "s", "--topic", "a/b", "--every", "60"],
            2,
            "topic name 'a/b' is invalid",
        ),
        (list(CREATE), 2, "give exactly one of --cron and --every"),
        ([*CREATE, "--cron", "* * * * *", "--every", "60"], 2, "give exactly one of --cron"),
        ([*CREATE, "--every", "0.5"], 2, "every: got 0.5, must be a finite number of seconds >= 1"),
        ([*CREATE, "--every", "inf"], 2, "every: got inf"),
        ([*CREATE, "--every", "soon"], 2, "Invalid value for '--every'"),
        ([*CREATE, "--every", "60", "--payload", "{oops"], 2, "--payload: invalid JSON"),
        ([*CREATE, "--every", "60", "--payload", "NaN"], 2, "--payload: invalid JSON (NaN"),
        (
            [*CREATE, "--every", "60", "--attribute", "schedule=x"],
            2,
            "attributes: ['schedule'] are set by the schedule on each tick",
        ),
        ([*CREATE, "--every", "60", "--attribute", "x"], 2, "--attribute: expected KEY=VALUE"),
        ([*CREATE, "--every", "60", "--start", "2026-01-01T00:00"], 2, "--start: got"),
        ([*CREATE, "--every", "60", "--end", "tomorrow"], 2, "--end: got 'tomorrow'"),
        (
            [
                *CREATE,
                "--every",
                "60",
                "--start",
                "2026-02-01T00:00Z",
                "--end",
                "2026-01-01T00:00Z",
            ],
            2,
            "--end: got '2026-01-01T00:00Z', must be after --start",
        ),
        ([*CREATE, "--every", "60", "--jitter-seconds", "-1"], 2, "jitter_seconds: got -1.0"),
        ([*CREATE, "--every", "60", "--catch-up-seconds", "inf"], 2, "catch_up_seconds: got inf"),
        # The topic's dedup window (300 s) is too short for 10 minutes of catch-up.
        (
            [*CREATE, "--every", "60", "--catch-up-seconds", "600"],
            2,
            "schedule 's': topic 'reports' has dedup_window_seconds 300, under the 620",
        ),
        # As publish --priority and --expires-in refuse them.
        *(
            ([*CREATE, "--every", "60", "--priority", value], 2, "Invalid value for '--priority'")
            for value in ("10", "-1", "1.5", "true")
        ),
        *(
            ([*CREATE, "--every", "60", "--expires-in", value], 2, says)
            for value, says in [
                ("0", "expires_in: got 0.0, must be a number of seconds > 0"),
                ("inf", "expires_in: got inf"),
                ("-1", "Invalid value for '--expires-in'"),
                ("nan", "Invalid value for '--expires-in'"),
            ]
        ),
        (["schedules", "show", "nope"], 1, "schedule 'nope' does not exist"),
        (["schedules", "pause", "nope"], 1, "schedule 'nope' does not exist"),
        (["schedules", "resume", "nope"], 1, "schedule 'nope' does not exist"),
        (["schedules", "trigger", "nope"], 1, "schedule 'nope' does not exist"),
        (["schedules", "delete", "nope", "--yes"], 1, "schedule 'nope' does not exist"),
        (["schedules", "show", "a/b"], 2, "schedule name 'a/b' is invalid"),
        (["schedules", "trigger", "_x"], 2, "schedule name '_x' starts with '_'"),
    ],
)
def test_errors_are_one_line_with_the_usage_or_error_code(
    tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    url = f"file://{tmp_path / 'queue'}"
    cli(None, "--url", url, "topics", "create", "reports")
    result = cli(None, "--url", url, *argv, code=code)
    assert result.stderr.startswith(f"error: {says}"), result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert as_json(cli(None, "--url", url, "schedules", "list", "--json")) == []  # none written


def test_a_name_taken_is_an_error_that_changes_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'queue'}"
    cli(None, "--url", url, "topics", "create", "reports")
    cli(None, "--url", url, *CREATE, "--every", "60")
    again = cli(None, "--url", url, *CREATE, "--cron", "* * * * *", code=1)
    assert again.stderr == "error: schedule 's' exists (delete it first to create it anew)\n"
    [kept] = as_json(cli(None, "--url", url, "schedules", "list", "--json"))
    assert (kept["every"], kept["cron"]) == (60.0, None)


def test_commands_that_read_refuse_a_missing_directory(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'nowhere'}"
    for command in (["list"], ["show", "s"], ["trigger", "s"], ["delete", "s", "--yes"]):
        result = cli(None, "--url", url, "schedules", *command, code=1)
        assert result.stderr == f"error: store root {tmp_path / 'nowhere'} does not exist\n"
    assert not (tmp_path / "nowhere").exists()


# -- schedules run -----------------------------------------------------------------------------


def eventually(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    """``check()`` once it is not None, asked again every 0.1 s (AssertionError after
    ``timeout`` s, naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Runner:
    """``pawn-queue schedules run`` as a process, its stderr in a file."""

    def __init__(self, url: str, tmp_path: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
        self.log = tmp_path / "run.stderr"
        argv = [sys.executable, "-m", "pawn_queue", "--url", url, "schedules", "run", *args]
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)

    def said(self, pattern: str) -> re.Match[str] | None:
        return re.search(pattern, self.log.read_text())

    def stop(self, signum: signal.Signals) -> tuple[int, str]:
        self.process.send_signal(signum)
        self.process.communicate(timeout=60)
        return self.process.returncode, self.log.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def fired(port: int, schedule: str) -> float | None:
    """The runner's ``pawnqueue_schedule_ticks_fired_total`` of ``schedule``, once exported."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    sample = f'pawnqueue_schedule_ticks_fired_total{{schedule="{schedule}"}} '
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line.removeprefix(sample))
    return None


def test_run_fires_ticks_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'queue'}"
    with PawnQueue.from_url(url) as pq:
        pq.create_topic("jobs")
        pq.create_schedule("fast", "jobs", every=1, payload={"n": 1}, priority=9, expires_in=600)
        consumer = pq.register_consumer("reader", ["jobs"])
        runner = Runner(url, tmp_path, "--metrics-port", "0")
        try:
            eventually("the runner", lambda: runner.said(r"running schedules \(fast\)"))
            serving = runner.said(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics")
            assert serving is not None
            [message, *_] = eventually("a tick", lambda: consumer.poll(wait=1) or None)
            assert message.attributes["schedule"] == "fast" and message.payload == {"n": 1}
            assert message.priority == 9 and message.expires_at is not None
            message.ack()
            count = eventually("the fired counter", lambda: fired(int(serving[1]), "fast"))
            assert count >= 1
            code, log = runner.stop(signal.SIGTERM)
        finally:
            runner.kill()
    assert code == 0, log
    assert log.endswith("stopped\n") and "Traceback" not in log


def test_run_exits_0_on_sigint(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'queue'}"
    runner = Runner(url, tmp_path)
    try:
        eventually("the runner", lambda: runner.said(r"running schedules \(none yet\)"))
        code, log = runner.stop(signal.SIGINT)
    finally:
        runner.kill()
    assert code == 0, log
    assert log.endswith("stopped\n") and "Traceback" not in log
