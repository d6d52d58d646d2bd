"""Plumbing of the queue benchmarks (``python -m bench.queue.compare``): paths, case names and
sizes, the one SeaweedFS every case measures on, the runners of the other venvs, and counting of
store calls where there are no server metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench.common import REPO
from pawn_queue import PawnQueue, PawnQueueConfig
from pawn_queue.store import counting, open_store

PQ013_PYTHON = REPO / ".venv-pq013" / "bin" / "python"
VSQS_PYTHON = REPO / ".venv-vsqs" / "bin" / "python"
PQ013_RUNNER = "bench.queue.pq013_runner"
VSQS_RUNNER = "bench.queue.vsqs_runner"
TOPIC = "bench"
IN_FLIGHT = 32
CASES = ("publish", "drain", "batch", "idle", "latency", "wake", "local", "backlog")
DEFAULT_CASES = ("publish", "drain", "batch", "idle", "latency", "wake", "local")


@dataclass(frozen=True)
class Sizes:
    runs: int = 3
    publish_serial: int = 300
    publish_concurrent: int = 1000
    publish_serial_013: int = 150
    publish_concurrent_013: int = 300
    drain_ours: int = 500  # conditional_write
    drain_csprng: int = 100  # ~0.8 s per claim round of 10: ~8 s per run
    drain_013: int = 200  # 0.1.3 drains at ~60-90 msg/s
    drain_timeout: float = 120.0
    batch_messages: int = 20000  # 200 objects: a run long enough to leave start-up behind
    batch_messages_memory: int = 100_000  # ~2 s at 50,000 msg/s
    batch_size: int = 100
    idle_seconds: float = 20.0
    idle_warmup: float = 1.5
    latency_period: float = 0.05
    latency_fast_seconds: float = 4.0  # publishing time per run, ours
    latency_slow_seconds: float = 8.0  # ... ours at the default 5 s interval
    latency_013_seconds: float = 5.0  # ... 0.1.3 (it falls behind: 10 msgs/s at most)
    wake_gaps: tuple[float, ...] = (1.0, 5.0, 10.0, 20.0, 40.0, 60.0)  # idle seconds
    wake_runs: int = 3  # consumer/producer pairs per store, all at once
    local_backlogs: tuple[int, ...] = (2000, 10000)
    local_ops: int = 150
    backlog_sizes: tuple[int, ...] = (100, 100_000)
    backlog_polls: int = 5


QUICK = Sizes(
    publish_serial=100,
    publish_concurrent=300,
    publish_serial_013=100,
    publish_concurrent_013=200,
    drain_ours=200,
    drain_csprng=60,
    drain_013=60,
    drain_timeout=60.0,
    batch_messages=500,
    batch_messages_memory=2000,
    idle_seconds=8.0,
    latency_fast_seconds=2.0,
    latency_slow_seconds=5.0,
    latency_013_seconds=3.0,
    wake_gaps=(1.0, 5.0, 12.0),
    wake_runs=1,
    local_backlogs=(500, 2000),
    local_ops=100,
    backlog_sizes=(100, 10_000),
    backlog_polls=3,
)


# -- plumbing ---------------------------------------------------------------------------------


class Bench:
    """One SeaweedFS for the whole run; every measurement gets fresh buckets."""

    def __init__(self, server: Any, sizes: Sizes, tmp: Path) -> None:
        self.server = server
        self.sizes = sizes
        self.tmp = tmp
        self._buckets = 0

    async def bucket(self, name: str) -> str:
        self._buckets += 1
        bucket = f"b{self._buckets:03d}-{name}"[:63]
        await asyncio.to_thread(self.server.create_bucket, bucket)
        return bucket

    def s3(self) -> dict[str, Any]:
        """Connection settings shared with the 0.1.3 runner (bucket added per use)."""
        return common.s3_settings(self.server.endpoint)

    def ours_s3(
        self,
        bucket: str,
        *,
        strategy: str | None = "conditional_write",
        polling: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        config: dict[str, Any] = {"backend": "s3", "s3": {**self.s3(), "bucket_name": bucket}}
        if strategy is not None:
            config["concurrency"] = {"strategy": strategy}
        if polling:
            config["polling"] = polling
        return config

    def count(self, bucket: str) -> Callable[[], dict[str, int]]:
        return lambda: common.scrape(self.server.metrics_url, bucket)

    async def counted(self, bucket: str) -> dict[str, int]:
        return await asyncio.to_thread(common.scrape, self.server.metrics_url, bucket)

    def pq013_spec(self, action: str, **spec: Any) -> dict[str, Any]:
        return {
            "action": action,
            "s3": self.s3(),
            "metrics_url": self.server.metrics_url,
            **spec,
        }


@contextlib.asynccontextmanager
async def queues(configs: Sequence[dict[str, Any]]) -> AsyncIterator[list[PawnQueue]]:
    """Set up one PawnQueue per config; tear all down at exit."""
    async with AsyncExitStack() as stack:
        out = []
        for config in configs:
            out.append(await stack.enter_async_context(await PawnQueue.from_config(config)))
        yield out


def _require(python: Path) -> None:
    if not python.exists():
        raise Skipped(f"{python.relative_to(REPO)} missing")


async def run_child(python: Path, module: str, spec: dict[str, Any], time_limit: float) -> Any:
    """Run the runner ``module`` under another venv's interpreter, as ``python -m`` from the
    repository root: ``bench.common`` imports, and ``pawn_queue`` is the venv's (src/ is not on
    its sys.path). Its last stdout line is JSON."""
    _require(python)
    process = await asyncio.create_subprocess_exec(
        str(python),
        "-m",
        module,
        json.dumps({**spec, "deadline": time_limit}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=common.scrubbed_env(),
        cwd=REPO,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), time_limit + 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"{module} exited {process.returncode}:\n{err.decode()[-3000:]}")
    return common.last_json_line(out.decode())


class Skipped(Exception):
    """A case that cannot run here (missing venv or API); reported, not failed."""


class CountingStore(counting.CountingStore):
    """Counts store calls as the S3 requests they stand for (LIST pages, DeleteObjects
    batches), for stores without server metrics: comparable with SeaweedFS' own counts."""

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


def filesystem_config(path: Path, **polling: float) -> dict[str, Any]:
    config: dict[str, Any] = {"backend": "filesystem", "filesystem": {"path": str(path)}}
    if polling:
        config["polling"] = polling
    return config


def counting_queue(config: dict[str, Any]) -> tuple[PawnQueue, CountingStore]:
    parsed = PawnQueueConfig.from_dict(config)
    store = CountingStore(open_store(parsed))
    return PawnQueue(parsed, store=store), store


def settings_of(pq: PawnQueue) -> str:
    """The consumer-side settings that decide idle cost and latency, as configured."""
    notify = pq.config.notify
    if not notify.enabled:
        return f"poll {pq.config.polling.interval_seconds:g} s"
    return (
        f"HEAD {notify.check_interval_seconds:g}->{notify.idle_check_interval_seconds:g} s, "
        f"backfill {notify.backfill_interval_seconds:g} s"
    )
