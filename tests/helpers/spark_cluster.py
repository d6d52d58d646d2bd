"""A throwaway Spark standalone cluster on loopback: a master and one-core workers, each a
``spark-class`` process of the installed PySpark, for tests and benchmarks.

    with standalone_cluster(tmp_path) as cluster:
        SparkSession.builder.master(cluster.master_url)...

Every process runs in its own process group (the executors and Python workers a worker
starts are in the worker's group) and the whole group is stopped when the block ends,
whatever happened inside it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"
# A worker must not pick the queue's credentials or settings up from the environment: the
# executors it starts get them only from the application (spark.executorEnv.*).
_SCRUBBED_PREFIXES = ("PAWNQUEUE_", "AWS_", "PYSPARK_", "SPARK_")

_running: list[subprocess.Popen[bytes]] = []


def _stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM to the process group, then SIGKILL to whatever of the group is left
    (executors and Python workers outlive a worker JVM that exits on SIGTERM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    if process in _running:
        _running.remove(process)


@atexit.register
def _stop_all_at_exit() -> None:
    for process in list(_running):
        _stop(process, timeout=2.0)


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):  # all held open at once, so no port is handed out twice
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster: where to submit, and the web UIs' JSON."""

    master_url: str
    master_ui: str
    worker_uis: tuple[str, ...]
    log_dir: Path

    def master_state(self) -> Any:
        """The master's JSON: ``workers``, ``activeapps``, ``completedapps``, ..."""
        return get_json(f"{self.master_ui}/json/")

    def worker_state(self, index: int) -> Any:
        """A worker's JSON: its ``executors`` and ``finishedexecutors`` (with ``appid``)."""
        return get_json(f"{self.worker_uis[index]}/json/")

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(SPARK_CLASS), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopped as one, with its executors
        )
    _running.append(process)
    return process


@contextlib.contextmanager
def standalone_cluster(
    tmp: Path, *, workers: int = 2, worker_memory: str = "1g", timeout: float = 120.0
) -> Iterator[Cluster]:
    """A master and ``workers`` one-core workers on 127.0.0.1, ready when every worker has
    registered with the master; all stopped when the block ends."""
    tmp.mkdir(parents=True, exist_ok=True)
    log_dir = tmp / "logs"
    log_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(log_dir))
    port, ui, *worker_ports = _free_ports(2 + 2 * workers)
    cluster = Cluster(
        master_url=f"spark://127.0.0.1:{port}",
        master_ui=f"http://127.0.0.1:{ui}",
        worker_uis=tuple(f"http://127.0.0.1:{p}" for p in worker_ports[1::2]),
        log_dir=log_dir,
    )
    master_args = [_MASTER, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
    processes = [_spawn(master_args, env, log_dir / "master.log")]
    try:
        for i in range(workers):
            work_dir = tmp / f"worker-{i}"
            work_dir.mkdir(exist_ok=True)
            args = [
                *(_WORKER, "--host", "127.0.0.1", "--port", str(worker_ports[2 * i])),
                *("--webui-port", str(worker_ports[2 * i + 1]), "--cores", "1"),
                *("--memory", worker_memory, "--work-dir", str(work_dir), cluster.master_url),
            ]
            processes.append(
                _spawn(args, {**env, "SPARK_WORKER_DIR": str(work_dir)}, log_dir / f"w{i}.log")
            )
        _wait_registered(cluster, processes, workers, timeout)
        yield cluster
    finally:
        for process in reversed(processes):  # workers first, so the master sees them leave
            _stop(process)


def _wait_registered(
    cluster: Cluster, processes: list[subprocess.Popen[bytes]], workers: int, timeout: float
) -> None:
    """Poll the master's JSON until ``workers`` workers are ALIVE (nothing to wait on but the
    HTTP endpoint); fail with the logs when a process exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"spark-class exited with {process.returncode}:\n{cluster.log_tail()}"
                )
        with contextlib.suppress(OSError, ValueError):
            alive = [w for w in cluster.master_state()["workers"] if w.get("state") == "ALIVE"]
            if len(alive) >= workers:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{workers} workers not registered after {timeout:.0f} s:\n{cluster.log_tail()}"
            )
        time.sleep(0.2)
