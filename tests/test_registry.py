"""Registry liveness: one record per process, one write per heartbeat, a clean stop shown at
once, and nothing written by a one-shot publisher past its name's first entry."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pawn_queue import PawnQueue
from pawn_queue.cli import app
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from tests.helpers.storage import instance_record_keys, write_instance_record

WINDOW = 120.0  # two default heartbeats


async def test_each_process_has_its_own_record_and_a_clean_stop_shows_at_once(
    queue_config: dict[str, Any],
) -> None:
    """The processes of ``worker --processes N`` shared one row and a stopped consumer
    stayed "alive" for up to two heartbeats."""
    first = await PawnQueue.from_config(queue_config)
    second = await PawnQueue.from_config(queue_config)  # another process, as the store sees it
    await first.setup()
    await second.setup()
    try:
        await first.create_topic("t")
        a = await first.register_consumer("shop.ship", ["t"])
        b = await second.register_consumer("shop.ship", ["t"])
        assert a.id == b.id  # one name, one id
        rows = await first.registry.liveness("consumers", WINDOW)
        assert [r.status for r in rows] == ["alive", "alive"]
        assert {r.instance.pid for r in rows if r.instance} == {os.getpid()}
        assert len({r.instance.instance_id for r in rows if r.instance}) == 2
        await second.teardown()
        rows = await first.registry.liveness("consumers", WINDOW)
        assert sorted(r.status for r in rows) == ["alive", "stopped"]
    finally:
        await first.teardown()
        await second.teardown()


async def test_a_heartbeat_is_one_write_whatever_the_number_of_consumers(
    queue_config: dict[str, Any],
) -> None:
    config = load_config(queue_config)
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")
        for n in range(3):
            await pq.register_consumer(f"c{n}", ["t"])
        rows = await pq.registry.liveness("consumers", WINDOW)
        before = {r.instance.last_seen for r in rows if r.instance}
        store.reset()
        await pq.registry.heartbeat()
        assert store.reset() == Counter({"PUT": 1})
        rows = await pq.registry.liveness("consumers", WINDOW)
        assert all(r.status == "alive" for r in rows) and len(rows) == 3
        [after] = {r.instance.last_seen for r in rows if r.instance}
        assert [after] != list(before) and after > max(before)


def test_one_shot_cli_publishes_do_not_grow_the_registry(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'queue'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}

    def cli(*args: str) -> None:
        argv = [sys.executable, "-m", "pawn_queue", "--url", url, *args]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def registry_files() -> dict[str, str]:
        root = tmp_path / "queue" / "_registry"
        return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*.json")}

    cli("topics", "create", "t")
    cli("publish", "t", json.dumps({"n": 1}))
    after_first = registry_files()
    assert not [name for name in after_first if name.startswith("instances/")]
    for n in range(3):
        cli("publish", "t", json.dumps({"n": n}))
    assert registry_files() == after_first  # not even rewritten


async def test_records_of_long_gone_processes_are_forgotten(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        gone = {
            "instance_id": "5d8e9a8c-0000-4000-8000-000000000000",
            "host": "old",
            "pid": 1,
            "started_at": "2020-01-01T00:00:00+00:00",
            "last_seen": "2020-01-01T00:00:00+00:00",
            "stopped_at": None,
            "members": [],
        }
        key = await write_instance_record(pq.store, gone)
        await pq.register_consumer("c", ["t"])  # the first record this process writes
        assert key not in await instance_record_keys(pq.store)


# Registers a consumer, says so, and runs until its input ends: then it stops cleanly.
_WORKER = """
import asyncio, json, sys
from pawn_queue import PawnQueue

async def main() -> None:
    async with await PawnQueue.from_config(json.loads(sys.argv[1])) as pq:
        await pq.register_consumer(sys.argv[2], ["t"])
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_pawn_queue_consumers_tells_a_killed_process_from_a_stopped_one(
    queue_config: dict[str, Any], tmp_path: Path
) -> None:
    """``pawn-queue consumers``, as an operator runs it, about two worker processes: both
    alive; one stopped cleanly shows stopped (not alive) at once; one killed with SIGKILL
    shows dead once the documented window (two heartbeats) passed since its last one."""
    interval = 0.5
    queue_config["registry"] = {"heartbeat_interval_seconds": interval}
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps(queue_config))  # JSON is YAML
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")

    def consumers() -> dict[str, dict[str, Any]]:
        result = CliRunner().invoke(app, ["--config", str(config_file), "consumers", "--json"])
        assert result.exit_code == 0, (result.stdout, result.exception)
        return {row["name"]: row for row in json.loads(result.stdout)}

    workers = {}
    for name in ("killed", "stopped"):
        workers[name] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WORKER,
            json.dumps(queue_config),
            name,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
    try:
        for worker in workers.values():
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 60) == b"ready\n"
        rows = await asyncio.to_thread(consumers)
        assert {n: r["status"] for n, r in rows.items()} == {"killed": "alive", "stopped": "alive"}
        assert {rows[n]["pid"] for n in workers} == {w.pid for w in workers.values()}

        workers["killed"].kill()  # SIGKILL: no teardown, no last write
        killed_at = time.monotonic()
        stopping = workers["stopped"]
        assert stopping.stdin is not None
        stopping.stdin.close()
        assert await asyncio.wait_for(stopping.wait(), 60) == 0
        rows = await asyncio.to_thread(consumers)
        assert rows["stopped"]["status"] == "stopped" and not rows["stopped"]["alive"]

        # The window is the bound under test: two heartbeats after the last one, at most
        # this long after the kill.
        await asyncio.sleep(max(0.0, killed_at + 2 * interval - time.monotonic()) + 0.05)
        rows = await asyncio.to_thread(consumers)
        assert rows["killed"]["status"] == "dead" and not rows["killed"]["alive"]
        assert rows["stopped"]["status"] == "stopped"
    finally:
        for worker in workers.values():
            if worker.returncode is None:
                worker.kill()
            await worker.wait()
