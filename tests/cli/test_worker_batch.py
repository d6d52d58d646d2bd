"""``pawn-queue worker`` with batch handlers, as real processes: an App's batch subscriber
(typed payloads, an invalid one dead-lettered alone, results published, SIGTERM), and a
module:function handler run with ``--batch``."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pawn_queue.sync import PawnQueue

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """``pawn-queue --url URL worker ARGS`` in a process; its stdout lines on :attr:`lines`."""

    def __init__(self, url: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pawn_queue", "--url", url, "worker", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[list[str]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.split())

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr.extend(self.process.stderr)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"file://{tmp_path / 'queue'}"
    with PawnQueue.from_url(url) as pq:
        pq.create_topic("jobs")
        pq.create_topic("done")
    return url


def test_the_worker_runs_an_apps_batch_subscriber(url: str) -> None:
    with PawnQueue.from_url(url) as pq:
        producer = pq.register_producer("test")
        ids = producer.publish_batch("jobs", [{"seq": s} for s in range(120)])
        invalid = producer.publish("jobs", {"seq": "not a number"})
    worker = Worker(url, "tests.workers.batch_app:app")
    try:
        seen: list[str] = []
        sizes: list[int] = []
        while len(seen) < len(ids):
            kind, _, *batch = worker.lines.get(timeout=60)
            assert kind == "batch"
            sizes.append(len(batch))
            seen += batch
        assert sorted(seen) == sorted(ids)  # each once, the invalid one never
        assert max(sizes) <= 50
        assert worker.stop() == 0, "".join(worker.stderr)
    finally:
        worker.kill()
    log = "".join(worker.stderr)
    assert "subscriber work receives jobs=the list of payloads, each validated as Job" in log
    with PawnQueue.from_url(url) as pq:
        stats = pq.topic_stats("jobs")
        assert stats.pending + stats.in_flight + stats.delayed == 0
        [dead] = pq.dead_letters("jobs")
        assert dead.id == invalid and dead.reason == "invalid_payload"
        done = [m.payload["seq"] for m in pq.peek("done", limit=500)]
        assert sorted(done) == list(range(120))


def test_the_worker_runs_a_function_with_batch(url: str) -> None:
    with PawnQueue.from_url(url) as pq:
        pq.register_producer("test").publish_batch("jobs", [{"seq": s} for s in range(30)])
    worker = Worker(
        url, "tests.workers.batch_app:plain", "--topic", "jobs", "--batch", "8", "--batch-wait", "0"
    )
    try:
        seqs: list[int] = []
        while len(seqs) < 30:
            kind, _, *batch = worker.lines.get(timeout=60)
            assert kind == "plain" and 1 <= len(batch) <= 8
            seqs += [int(s) for s in batch]
        assert sorted(seqs) == list(range(30))
        assert worker.stop() == 0, "".join(worker.stderr)
    finally:
        worker.kill()
    with PawnQueue.from_url(url) as pq:
        assert pq.topic_stats("jobs").pending == 0


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["tests.workers.batch_app:app", "--batch", "5"], "are for module:function"),
        (
            ["tests.workers.batch_app:plain", "--topic", "jobs", "--batch-wait", "1"],
            "needs --batch",
        ),
    ],
)
def test_batch_options_are_checked(url: str, args: list[str], error: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    result = subprocess.run(
        [sys.executable, "-m", "pawn_queue", "--url", url, "worker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert error in result.stderr
