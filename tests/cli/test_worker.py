"""``pawn-queue worker`` as a service manager runs it: real processes, SIGTERM, ``kill -9``,
``--processes``, the health and metrics endpoints, the JSON log, the exit codes.

The app is ``tests/workers/service_app.py``: its handler prints ``start``/``done`` lines,
which the tests read as they come (no polling of files, no sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pawn_queue import PawnQueue as AsyncPawnQueue
from pawn_queue import Retry
from pawn_queue.config import PawnQueueConfig
from pawn_queue.observe import Observer
from pawn_queue.service.logs import JsonFormatter, TextFormatter
from pawn_queue.sync import PawnQueue
from tests.helpers.stores import queue_config_dict
from tests.helpers.support import poll_count
from tests.servers.fault_proxy import FaultProxy, FaultRule
from tests.servers.seaweedfs import SeaweedFS

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.workers.service_app:app"
STORES = ["filesystem", "s3"]


@dataclass(frozen=True)
class Event:
    kind: str  # start | done
    id: str
    seq: int
    receive_count: int
    pid: int


class Worker:
    """``pawn-queue worker`` in a process; its handler's lines arrive on :attr:`events`."""

    def __init__(self, config: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
        argv = [sys.executable, "-m", "pawn_queue", "--config", str(config), "worker", APP]
        self.process = subprocess.Popen(
            [*argv, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[Event] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_events(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            kind, mid, seq, count, pid = line.split()
            self.events.put(Event(kind, mid, int(seq), int(count), int(pid)))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr.extend(self.process.stderr)

    def take(self, count: int, kind: str | None = None, timeout: float = 60) -> list[Event]:
        """The next ``count`` events (of ``kind``), waiting at most ``timeout`` in all."""
        deadline, taken = time.monotonic() + timeout, []
        while len(taken) < count:
            event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            if kind is None or event.kind == kind:
                taken.append(event)
        return taken

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout=timeout)

    def log(self) -> list[dict[str, Any]]:
        """The JSON log lines (``--log-format json``) written so far."""
        return [json.loads(line) for line in self.stderr if line.startswith("{")]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def workers() -> Any:
    started: list[Worker] = []

    def start(config: Path, *args: str) -> Worker:
        worker = Worker(config, *args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def write_config(
    store: str, request: pytest.FixtureRequest, tmp_path: Path, **polling: float
) -> Path:
    config = queue_config_dict(store, request, tmp_path)
    config["polling"] = {**config["polling"], **polling}  # type: ignore[dict-item]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def publish(config: Path, jobs: list[dict[str, Any]]) -> list[str]:
    with PawnQueue.from_config(str(config)) as pq:
        pq.create_topic("jobs")
        producer = pq.register_producer("test")
        return [producer.publish("jobs", job) for job in jobs]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("store", STORES)
def test_sigterm_lets_running_handlers_finish_and_gives_the_rest_back_at_once(
    store: str, request: pytest.FixtureRequest, tmp_path: Path, workers: Any
) -> None:
    # A long visibility timeout: a message back within it was given back, not expired.
    config = write_config(store, request, tmp_path, visibility_timeout_seconds=60)
    short = set(publish(config, [{"seq": s, "sleep": 1.5} for s in range(4)]))
    long = set(publish(config, [{"seq": s, "sleep": 120} for s in range(4, 8)]))
    first = workers(config, "--concurrency", "8", "--grace", "5", "--log-format", "json")
    started = first.take(8, "start")
    assert {e.id for e in started} == short | long
    first.signal()
    assert first.wait() == 0, "".join(first.stderr)
    log = first.log()
    acked = Counter(e["message_id"] for e in log if e.get("outcome") == "ack")
    assert acked == Counter(short), "each finished handler's message acked exactly once"
    assert not [e for e in log if "lost" in e["message"].lower() or e["level"] == "error"]
    assert {e.id for e in first.take(4, "done", timeout=0)} == short

    second = workers(config, "--concurrency", "8", "--log-format", "json")
    again = second.take(4, "start", timeout=30)  # well inside the 60 s visibility timeout
    assert {e.id: e.receive_count for e in again} == dict.fromkeys(long, 1)
    # A second signal cuts the grace short: exit 3, the messages given back again.
    second.signal()
    second.signal(signal.SIGINT)
    assert second.wait() == 3, "".join(second.stderr)
    with PawnQueue.from_config(str(config)) as pq:
        consumer = pq.register_consumer("check", ["jobs"])
        left = consumer.poll(wait=10)
        assert {m.id: m.receive_count for m in left} == dict.fromkeys(long, 1)


def test_processes_drain_thousands_with_no_duplicate_and_no_loss(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Any
) -> None:
    config = write_config("filesystem", request, tmp_path)
    ids = publish(config, [{"seq": s} for s in range(3000)])
    worker = workers(config, "--processes", "3", "--concurrency", "8")
    done = worker.take(3000, "done", timeout=240)
    worker.signal()
    assert worker.wait() == 0, "".join(worker.stderr[-20:])
    assert sorted(e.id for e in done) == sorted(ids)
    assert len({e.pid for e in done}) == 3  # every process took a share
    assert not [e for e in list(worker.events.queue) if e.kind == "done"]  # nothing twice
    with PawnQueue.from_config(str(config)) as pq:
        assert pq.topic_stats("jobs").pending == 0


def test_max_in_flight_holds_across_processes(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Any
) -> None:
    """Issue 43's target: 4 processes of 8 handlers each, at most 3 running at once."""
    config = write_config("filesystem", request, tmp_path)
    counter = tmp_path / "counter.json"
    counter.write_text("{}")
    jobs = [{"seq": s, "sleep": 0.1, "counter": str(counter)} for s in range(60)]
    ids = publish(config, jobs)
    worker = workers(config, "--processes", "4", "--concurrency", "8", "--max-in-flight", "3")
    done = worker.take(60, "done", timeout=240)
    worker.signal()
    assert worker.wait() == 0, "".join(worker.stderr[-20:])
    assert sorted(e.id for e in done) == sorted(ids)
    assert json.loads(counter.read_text()) == {"now": 0, "most": 3, "done": 60}


def test_a_killed_child_is_restarted_and_its_messages_come_back(
    request: pytest.FixtureRequest, tmp_path: Path, workers: Any
) -> None:
    config = write_config("filesystem", request, tmp_path, visibility_timeout_seconds=3)
    ids = publish(config, [{"seq": s, "sleep": 0.1} for s in range(200)])
    worker = workers(config, "--processes", "2", "--concurrency", "4")
    events = worker.take(40)
    # The victim is killed right after a handler of its began (it sleeps 0.1 s): it holds at
    # least that message. Killed after a "done", it might have held none.
    while events[-1].kind != "start":
        events += worker.take(1)
    victim = events[-1].pid
    os.kill(victim, signal.SIGKILL)
    done: dict[str, Event] = {}
    for event in events:
        if event.kind == "done":
            done[event.id] = event
    deadline = time.monotonic() + 120
    while len(done) < len(ids):
        event = worker.events.get(timeout=max(0.0, deadline - time.monotonic()))
        events.append(event)
        if event.kind == "done" and event.pid != victim:
            done.setdefault(event.id, event)
    worker.signal()
    assert worker.wait() == 0, "".join(worker.stderr[-20:])
    assert set(done) == set(ids)
    assert [line for line in worker.stderr if f"(pid {victim}) exited with -9" in line]
    # What the victim held came back after its leases expired, received a second time.
    held = {e.id for e in events if e.pid == victim and e.kind == "start"}
    finished = {e.id for e in events if e.pid == victim and e.kind == "done"}
    back = [done[mid] for mid in held - finished]
    assert back and all(e.receive_count == 2 for e in back)


def test_health_metrics_and_readiness_follow_the_store(
    request: pytest.FixtureRequest, seaweedfs: SeaweedFS, tmp_path: Path, workers: Any
) -> None:
    with FaultProxy(seaweedfs.endpoint, max_lifetime_seconds=300) as proxy:
        config = queue_config_dict("s3", request, tmp_path)
        s3 = dict(config["s3"])  # type: ignore[call-overload]
        s3.update(endpoint_url=proxy.endpoint, max_retries=0, request_timeout_seconds=2)
        config["s3"] = s3
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        [mid] = publish(path, [{"seq": 1}])
        port = free_port()
        worker = workers(path, "--metrics-port", str(port))
        [done] = worker.take(1, "done")
        assert done.id == mid

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        def until(path: str, status: int, check: Callable[[str], bool] = bool) -> str:
            """The body of ``path`` once it answers ``status`` (and ``check`` holds): the
            worker is another process, whose state only its answers show."""
            deadline = time.monotonic() + 60
            while (answer := get(path))[0] != status or not check(answer[1]):
                assert time.monotonic() < deadline, answer
                time.sleep(0.2)
            return answer[1]

        def acked(text: str) -> list[tuple[dict[str, str], float]]:
            families = {f.name: f for f in text_string_to_metric_families(text)}
            family = families.get("pawnqueue_messages_acked")
            samples = family.samples if family is not None else []
            return [(s.labels, s.value) for s in samples if s.name.endswith("_total")]

        assert get("/healthz") == (200, "ok\n")
        until("/readyz", 200)
        # "done" is printed before the handler returns, and the ack follows it.
        assert acked(until("/metrics", 200, acked)) == [({"topic": "jobs"}, 1.0)]
        proxy.set_rules([FaultRule("error_500", 1.0)])
        assert until("/readyz", 503).startswith("not ready: store failing")
        assert get("/healthz")[0] == 200  # alive: the loop answers
        proxy.set_rules([])
        until("/readyz", 200)
        worker.signal()
        assert worker.wait() == 0


def test_exit_codes_and_errors_are_clear(tmp_path: Path, workers: Any) -> None:
    url = f"file://{tmp_path / 'queue'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pawn_queue", "--url", url, "worker", *args]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    missing = run("tests.workers.no_such_module:app")
    assert (
        missing.returncode == 2 and "cannot import 'tests.workers.no_such_module'" in missing.stderr
    )
    function = run("tests.workers.service_app:noop")
    assert function.returncode == 2 and "give its topics with --topic" in function.stderr
    # A mistyped directory is refused, not created (it was, and registered into).
    no_root = run(APP)
    assert no_root.returncode == 1 and "does not exist" in no_root.stderr
    assert str(tmp_path / "queue") in no_root.stderr
    assert not (tmp_path / "queue").exists()
    (tmp_path / "queue").mkdir()
    no_topic = run(APP)
    assert no_topic.returncode == 1 and "topic 'jobs' does not exist" in no_topic.stderr
    usage = run(APP, "--log-format", "xml")
    assert usage.returncode == 2 and "choose one of text, json" in usage.stderr
    for limit, error in [
        (["--max-in-flight", "0"], "--max-in-flight': Input should be greater than or equal to 1"),
        (["--max-in-flight", "1001"], "max_in_flight: got 1001, must be at most 1000"),
        (["--rate-limit", "fast"], "rate_limit: got 'fast', must be '<count>/<unit>'"),
    ]:
        refused = run(APP, *limit)
        assert refused.returncode == 2 and error in refused.stderr, refused.stderr


def test_message_log_lines_as_text_and_json() -> None:
    fields = {
        "message_id": "m-1",
        "topic": "jobs",
        "receive_count": 2,
        "duration": 0.25,
        "outcome": "dead_letter",
        "reason": "handler error",
    }
    record = logging.makeLogRecord(
        {"msg": "message %s", "args": ("dead_letter",), "levelname": "WARNING", **fields}
    )
    text = TextFormatter().format(record)
    assert text.endswith(
        "message dead_letter message_id=m-1 topic=jobs receive_count=2 duration=0.25 "
        "outcome=dead_letter reason='handler error'"
    )
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in fields} == fields
    assert line["message"] == "message dead_letter" and line["level"] == "warning"
    assert "ValueError: boom" in line["traceback"]


def test_library_lines_are_structured_and_a_requeue_is_no_takeover() -> None:
    """JSON lines of the library's events carried their fields inside ``message``
    (``"handler failed message=... topic=..."``), and every Retry requeue logged a
    "lease takeover" at INFO, which reads like a crash."""

    class DeadLettered(Observer):
        def settled(self, message: Any, outcome: str, reason: str | None) -> None:
            if outcome == "dead_letter":
                dead_lettered.set()

    dead_lettered = asyncio.Event()

    async def scenario() -> None:
        config = PawnQueueConfig.from_url(f"memory://logs-{os.getpid()}")
        async with AsyncPawnQueue(config, observers=[DeadLettered()]) as pq:
            await pq.create_topic("jobs")
            await (await pq.register_producer("p")).publish("jobs", {"n": 1})
            consumer = await pq.register_consumer("c", ["jobs"])
            [message] = await poll_count(consumer, 1)
            await message.nack(requeue=True)  # given back: the next claim is routine
            [again] = await poll_count(consumer, 1)

            async def fail(message: Any) -> None:
                raise RuntimeError("boom")

            await again.nack(requeue=True)
            task = asyncio.create_task(consumer.listen(fail, retry=Retry(max_receives=3)))
            await dead_lettered.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    library, consumer = logging.getLogger("pawn_queue"), logging.getLogger("pawn_queue.consumer")
    levels = library.level, consumer.level  # the demo command, run in process, quiets one
    library.addHandler(handler)
    library.setLevel(logging.DEBUG)
    consumer.setLevel(logging.NOTSET)
    try:
        asyncio.run(scenario())
    finally:
        library.removeHandler(handler)
        library.setLevel(levels[0])
        consumer.setLevel(levels[1])
    assert not [r for r in records if r.getMessage().startswith("lease takeover")]
    assert [r.levelno for r in records if r.getMessage().startswith("lease handed over")]
    lines = [json.loads(JsonFormatter().format(r)) for r in records]
    assert not [line["message"] for line in lines if "=" in line["message"]]
    [failed, *_] = [line for line in lines if line["message"] == "handler failed"]
    assert failed["topic"] == "jobs" and failed["receive_count"] == 3
    assert failed["error"] == "RuntimeError('boom')" and "message_id" in failed


def test_start_up_says_what_each_parameter_receives(tmp_path: Path) -> None:
    """An unannotated handler written for listen() gets the payload: the worker says so at
    start-up, one line per subscriber, instead of leaving it to an AttributeError per
    message."""
    url = f"file://{tmp_path / 'queue'}"
    with PawnQueue.from_url(url) as pq:
        pq.create_topic("jobs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    argv = [sys.executable, "-m", "pawn_queue", "--url", url, "worker"]
    argv += ["tests.workers.service_app:written_for_listen", "--topic", "jobs"]
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:  # the log, line by line, until the subscriber's line
            if "subscriber written_for_listen receives" in line:
                break
        else:
            raise AssertionError("no start-up line for the subscriber")
        assert "msg=the payload as decoded (unannotated" in line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait(timeout=30)
