"""The README's quick start and its listen() program run as written on every store of the
matrix (memory, a local directory, SeaweedFS, Ceph RGW, moto, s3rver and Azurite).
tests/docs/test_docs_code.py runs every Python block of the README and the docs on a local
directory."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pawn_queue import PawnQueue
from tests.helpers.stores import STORE_MATRIX

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


def test_push_mode_runs_as_written(
    queue_config: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The listen() program runs until it is stopped: its main() runs here until the message
    published to it is acked, then it is cancelled (as Ctrl-C would)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(queue_config))
    program = python_blocks()[1].rstrip()
    assert "await consumer.listen(handler)" in program
    assert program.endswith("\nasyncio.run(main())")
    scope: dict[str, Any] = {"__name__": "readme_push_mode"}
    body = program.removesuffix("asyncio.run(main())")
    exec(compile(body, "README push mode", "exec"), scope)

    async def run() -> None:
        async with await PawnQueue.from_config(queue_config) as pq:
            await pq.create_topic("orders")
            await (await pq.register_producer("p")).publish("orders", {"order_id": 7})
            task = asyncio.create_task(scope["main"]())
            while await pq.store.list("orders/messages/"):  # until the handler acked it
                assert not task.done(), task
                await asyncio.sleep(0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(run(), 30))
    assert "{'order_id': 7}" in capsys.readouterr().out
