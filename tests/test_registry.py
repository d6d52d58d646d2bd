"""Registry liveness: one record per process, one write per heartbeat, a clean stop shown at
once, and nothing written by a one-shot publisher past its name's first entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore

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
        key = layout.instance_key(gone["instance_id"])
        await pq.store.put(key, json.dumps(gone).encode())
        await pq.register_consumer("c", ["t"])  # the first record this process writes
        assert key not in [m.key for m in await pq.store.list(layout.INSTANCES)]
