"""``pawn-queue worker`` runs the queue's schedules beside the handlers, in every process of
``--processes N``: an App's ``every=1`` schedule, fired by two processes at once, reaches its
handler once per tick with no tick left out; SIGTERM stops it all cleanly (exit 0);
``--no-schedules`` runs none (and passes that on to the children).

The app is ``tests/workers/schedule_app.py``: its handler prints ``tick <schedule_time>
<pid>`` on stdout, which the tests read as it comes. Processes killed while they fire:
tests/test_schedule_workers.py.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from pawn_queue.sync import PawnQueue

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.workers.schedule_app:app"


class Worker:
    """``pawn-queue --url URL worker APP ARGS``: its handler's ticks on :attr:`ticks`, its
    log lines on :attr:`log`, as they come."""

    def __init__(self, url: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
        argv = [sys.executable, "-m", "pawn_queue", "--url", url, "worker", APP, *args]
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.ticks: queue.Queue[tuple[datetime, int]] = queue.Queue()
        self.log: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            _, tick, pid = line.split()
            self.ticks.put((datetime.fromisoformat(tick), int(pid)))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)
            self.log.put(line)

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 60) -> list[str]:
        """The next ``count`` log lines holding ``text``."""
        deadline, found = time.monotonic() + timeout, []
        while len(found) < count:
            line = self.log.get(timeout=max(0.0, deadline - time.monotonic()))
            if text in line:
                found.append(line)
        return found

    def stop(self) -> int:
        """SIGTERM; the exit code, once its output is all read."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        for reader in self.readers:
            reader.join(timeout=30)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def store_with_topic(tmp_path: Path) -> str:
    url = f"file://{tmp_path / 'queue'}"
    with PawnQueue.from_url(url) as pq:  # a local directory is created when first opened
        pq.create_topic("ticks")
    return url


def test_two_processes_fire_each_tick_of_the_app_s_schedule_once(tmp_path: Path) -> None:
    url = store_with_topic(tmp_path)
    worker = Worker(url, "--processes", "2")
    try:
        started = worker.wait_for_log("worker started app=clock", 2)
        assert all("schedules=on" in line for line in started)
        # About 8 s: until the ticks handled span 8 seconds.
        seen: list[tuple[datetime, int]] = []
        deadline = time.monotonic() + 60
        while len(seen) < 2 or max(seen)[0] - min(seen)[0] < timedelta(seconds=8):
            seen.append(worker.ticks.get(timeout=max(0.0, deadline - time.monotonic())))
        last_seen = max(tick for tick, _ in seen)
        assert worker.stop() == 0, "".join(worker.stderr)
    finally:
        worker.kill()
    while not worker.ticks.empty():  # handled while it stopped
        seen.append(worker.ticks.get())
    counts = Counter(tick for tick, _ in seen)
    assert [tick for tick, n in counts.items() if n > 1] == []  # no tick twice
    first = min(counts)
    span = int((last_seen - first).total_seconds()) + 1
    expected = [first + timedelta(seconds=k) for k in range(span)]
    assert sorted(t for t in counts if t <= last_seen) == expected  # no tick left out
    log = "".join(worker.stderr)
    assert log.count("schedule runner started app=clock") == 2  # one in each process
    assert "Traceback" not in log and "schedule runner failed" not in log
    assert "schedule every-second created" in log  # by one of them, the other found it
    with PawnQueue.from_url(url) as pq:
        stats = pq.schedule_stats("every-second")
        assert stats.fired >= span and stats.missed == 0


def test_no_schedules_runs_none_in_any_process(tmp_path: Path) -> None:
    url = store_with_topic(tmp_path)
    worker = Worker(url, "--processes", "2", "--no-schedules")
    try:
        started = worker.wait_for_log("worker started app=clock", 2)
        assert all("schedules=off" in line for line in started), started
        assert worker.stop() == 0, "".join(worker.stderr)
    finally:
        worker.kill()
    assert "schedule runner started" not in "".join(worker.stderr)
    with PawnQueue.from_url(url) as pq:  # declared schedules are created all the same
        assert pq.schedule("every-second").every == 1.0
