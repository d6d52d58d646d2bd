"""The README's code runs as written; its quick start and push mode on every store of the
matrix (memory, a local directory, SeaweedFS, Ceph RGW, moto, s3rver and Azurite)."""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from pawn_queue import PawnQueue
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from tests.conftest import STORE_MATRIX
from tests.helpers.faults import FaultyStore

README = Path(__file__).parents[2] / "README.md"


@pytest.fixture(params=STORE_MATRIX)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_quick_start_runs_as_written(
    queue_config: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(queue_config))
    quick_start = python_blocks()[0]
    assert 'PawnQueue.from_config("config.yaml")' in quick_start
    exec(compile(quick_start, "README quick start", "exec"), {})
    assert capsys.readouterr().out.strip() == "{'order_id': 42, 'item': 'widget'}"

    async def check_empty() -> list[Any]:
        async with await PawnQueue.from_config(queue_config) as pq:
            return await pq.store.list("orders/messages/")

    assert asyncio.run(check_empty()) == []


def test_push_mode_snippet_runs(
    queue_config: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    snippet = python_blocks()[1]
    assert "await consumer.listen(handler)" in snippet
    body = textwrap.indent(snippet, "        ")
    harness = f"""
async def push_mode(pawnqueue, consumer):
    try:
{body}
    except asyncio.CancelledError:
        pass
"""
    scope: dict[str, Any] = {"asyncio": asyncio}
    exec(compile(harness, "README push mode", "exec"), scope)

    async def run() -> None:
        config = load_config(queue_config)
        acked = asyncio.Event()
        store = FaultyStore(open_store(config))

        async def on_delete(operation: str, key: str) -> None:
            if operation == "delete" and key.startswith("orders/messages/"):
                acked.set()

        store.observers.append(on_delete)
        async with PawnQueue(config, store=store) as pq:
            await pq.create_topic("orders")
            await (await pq.register_producer("p")).publish("orders", {"order_id": 7})
            consumer = await pq.register_consumer("billing", topics=["orders"])
            task = asyncio.create_task(scope["push_mode"](pq, consumer))
            await acked.wait()
            task.cancel()
            await task
            assert await pq.store.list("orders/messages/") == []

    asyncio.run(asyncio.wait_for(run(), 30))
    assert "{'order_id': 7}" in capsys.readouterr().out


def test_local_directory_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    snippet = python_blocks()[2]
    assert 'PawnQueue.from_url("file://./queue")' in snippet
    exec(compile(snippet, "README local directory", "exec"), {})
    assert (tmp_path / "queue" / "orders" / ".topic").is_file()
    assert list((tmp_path / "queue" / "orders" / "messages").iterdir()) == []


def test_api_reference_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    snippet = python_blocks()[3]
    assert "async def handler(msg: Message)" in snippet
    exec(compile(snippet, "README API", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "conditional_write ['jobs', 'orders'] ['my-worker']"
    assert lines[1].startswith("True orders ")
    assert lines[1].endswith("{'key': 'value'} {'source': 'web'}")
    assert list((tmp_path / "api-demo" / "orders" / "messages").iterdir()) == []


def test_blocking_api_snippet_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    snippet = python_blocks()[4]
    assert "from pawn_queue.sync import" in snippet
    exec(compile(snippet, "README blocking API", "exec"), {})
    assert capsys.readouterr().out.strip() == "{'order_id': 42}"
    assert list((tmp_path / "queue" / "orders" / "messages").iterdir()) == []


async def test_service_snippets_run_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    app_block, test_block = python_blocks()[5:7]
    assert app_block.startswith("# shop.py") and "TestClient" in test_block
    shop = types.ModuleType("shop")
    monkeypatch.setitem(sys.modules, "shop", shop)
    exec(compile(app_block, "README shop.py", "exec"), shop.__dict__)
    scope: dict[str, Any] = {}
    exec(compile(test_block, "README testing", "exec"), scope)
    await scope["test_ship"]()
    [line] = capsys.readouterr().out.splitlines()  # the record handler saw the shipment
    assert line.endswith(" {'order_id': 1}")
    assert not (tmp_path / "queue").exists()  # a memory store, not the app's directory
