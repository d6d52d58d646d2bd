"""The command line at its edges, as real processes: where every command finds the store, a
missing extra, ports and durations refused, a mistyped directory for ``doctor``, counts of
batch messages, and help texts in plain words."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import typer

from pawn_queue.cli import app
from tests.cli.test_cli import Proc, _env

NO_STORE = "error: no store given: use --url (e.g. file://./queue), --config FILE or set "
EVERY_COMMAND = [
    ["topics", "list"],
    ["publish", "images", "{}"],
    ["consume", "images"],
    ["doctor"],
    ["worker", "tasks:resize", "--topic", "images"],
]


def project(tmp_path: Path) -> Path:
    """A directory with a ``config.yaml`` (a local store in ``queue/``, not created) and the
    ``tasks.resize`` handler of the worker's docs."""
    (tmp_path / "config.yaml").write_text(
        f"backend: filesystem\nfilesystem:\n  path: {tmp_path / 'queue'}\n"
    )
    (tmp_path / "tasks.py").write_text("def resize(payload):\n    return None\n")
    return tmp_path


def test_every_command_finds_the_store_by_one_rule(tmp_path: Path) -> None:
    """The worker read neither config.yaml nor a "no store" rule: it said 'worker failed to
    start: invalid pawn-queue configuration: s3: ...' and exited 1."""
    here = project(tmp_path)
    run = Proc(None, _env(), cwd=here)
    for command in EVERY_COMMAND:  # config.yaml is there, but only --config names a file
        done = run(*command, code=2)
        assert done.stderr == NO_STORE + "PAWNQUEUE_URL\n", command
    # Given with --config, every command that must not create the store refuses the
    # directory config.yaml names, the same way.
    missing = f"store root {here / 'queue'} does not exist"
    for command in EVERY_COMMAND:
        if command[0] != "publish":  # publishing creates the directory
            done = run("--config", "config.yaml", *command, code=1)
            assert done.stderr.splitlines()[-1].endswith(missing), command
    assert not (here / "queue").exists()


def test_doctor_refuses_a_mistyped_directory(tmp_path: Path) -> None:
    """doctor created it (with _probe/ and .pawnqueue/ in it) and reported everything ok."""
    typo = tmp_path / "typo"
    run = Proc(f"file://{typo}", _env())
    done = run("doctor", code=1)
    assert done.stderr.splitlines()[-1] == f"error: store root {typo} does not exist"
    assert not typo.exists()
    typo.mkdir()
    assert json.loads(run("doctor", "--json").stdout)["ok"] is True


def without_prometheus(tmp_path: Path) -> dict[str, str]:
    """An environment where ``import prometheus_client`` fails, as without the extra."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "prometheus_client.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'prometheus_client'\")\n"
    )
    paths = [str(blocker), *filter(None, [os.environ.get("PYTHONPATH")])]
    return _env(PYTHONPATH=os.pathsep.join(paths))


def test_metrics_without_the_extra_names_it(tmp_path: Path) -> None:
    """Both said 'unexpected ModuleNotFoundError: No module named 'prometheus_client''."""
    url = f"file://{tmp_path / 'queue'}"
    Proc(url, _env())("topics", "create", "orders")
    run = Proc(url, without_prometheus(tmp_path))
    for command in (
        ["metrics", "orders", "--duration", "0"],
        ["consume", "orders", "--metrics-port", "0"],
        ["worker", "tests.workers.service_app:app", "--metrics-port", "0"],
    ):
        done = run(*command, code=2)
        assert "needs the metrics extra: pip install 'pawn-queue[metrics]'" in done.stderr
        assert "unexpected" not in done.stderr


def test_metrics_ports_and_durations_are_checked(tmp_path: Path) -> None:
    """--port 99999 was 'unexpected OverflowError' (exit 1); --duration -5 ran and exited 0."""
    url = f"file://{tmp_path / 'queue'}"
    run = Proc(url, _env())
    run("topics", "create", "orders")
    for args, says in (
        (["metrics", "orders", "--port", "99999"], "--port"),
        (["metrics", "orders", "--port", "-1"], "--port"),
        (["metrics", "orders", "--duration", "-5"], "--duration"),
        (["metrics", "orders", "--duration", "inf"], "--duration"),
        (["metrics", "orders", "--duration", "nan"], "--duration"),
        (["metrics", "orders", "--interval", "inf", "--duration", "1"], "--interval"),
        (["consume", "orders", "--metrics-port", "70000"], "--metrics-port"),
    ):
        done = run(*args, code=2)
        [line] = done.stderr.splitlines()
        assert line.startswith("error: ") and says in line, (args, line)


@contextlib.contextmanager
def serving(url: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``pawn-queue metrics ARGS`` running, with the port it says it serves on."""
    argv = [sys.executable, "-m", "pawn_queue", "--url", url, "metrics", *args]
    proc = subprocess.Popen(argv, env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the server listens
        found = re.fullmatch(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics\n", line)
        assert found, line
        yield proc, int(found[1])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_metrics_on_port_0_says_the_port_it_bound(tmp_path: Path) -> None:
    """It said port 0."""
    url = f"file://{tmp_path / 'queue'}"
    run = Proc(url, _env())
    run("topics", "create", "orders")
    with serving(url, "orders", "--port", "0", "--duration", "60") as (_, port):
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            # Its requests to the store so far (the topic gauges may not be set yet).
            assert "pawnqueue_store_requests_total" in answer.read().decode()


def test_counts_are_of_messages_and_objects_are_labelled_so(tmp_path: Path) -> None:
    """250 lines published with --batch 100 showed 'pending 3' (objects), where the
    dashboard showed 250."""
    run = Proc(f"file://{tmp_path / 'queue'}", _env())
    run("topics", "create", "events")
    lines = "".join(f'{{"n": {i}}}\n' for i in range(250))
    run("publish", "events", "--batch", "100", input=lines)
    for stats in (
        json.loads(run("--json", "topics", "stats", "events").stdout),
        json.loads(run("--json", "topics", "show", "events").stdout)["stats"],
    ):
        assert stats["pending"] == 250
        assert stats["pending_objects"] == 3
    [row] = [line for line in run("topics", "stats").stdout.splitlines() if "events" in line]
    assert row.split("│")[2].strip() == "250"
    table = run("topics", "show", "events").stdout
    assert re.search(r"│ pending +│ +250 │", table)
    assert re.search(r"│ pending_objects +│ +3 │", table)

    run("subscriptions", "create", "events", "audit")
    run("publish", "events", "--batch", "10", input="".join(f"{i}\n" for i in range(30)))
    for stats in (
        json.loads(run("--json", "topics", "stats", "events", "--subscription", "audit").stdout),
        json.loads(run("--json", "subscriptions", "show", "events", "audit").stdout)["stats"],
    ):
        assert stats["pending"] == 30
        assert stats["pending_objects"] == 3


def command_paths() -> list[list[str]]:
    """Every command and subcommand, as its words (``[]``: the root)."""
    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def test_every_help_is_plain_text(tmp_path: Path) -> None:
    """pawn-queue --help showed ``consumers``: the docstrings' reStructuredText."""
    run = Proc(None, _env())
    paths = command_paths()
    assert ["worker"] in paths and ["topics", "stats"] in paths
    markup = re.compile(r"``|:[a-z]+:`|\\\[")  # ``literal``, :meth:`x`, an escaped [
    raw = {}
    for path in paths:
        text = run(*path, "--help").stdout
        if markup.search(text):
            raw[" ".join(path) or "pawn-queue"] = markup.findall(text)
    assert raw == {}
    demo = " ".join(run("demo", "--help").stdout.split())
    assert "same as make demo" not in demo and "make demo-queue" in demo
