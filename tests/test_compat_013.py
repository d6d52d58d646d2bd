"""Bucket-layout compatibility with pawn-queue 0.1.3 (from PyPI, in its own venv), both ways."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue.config import S3Config
from tests.helpers.support import keys_under

AGENT = Path(__file__).parent / "workers" / "pq013_agent.py"
ROOT = Path(__file__).parent.parent


def compat_python() -> str:
    path = os.environ.get("PAWNQUEUE_COMPAT_PYTHON") or str(ROOT / ".venv-pq013" / "bin" / "python")
    if not Path(path).exists():
        pytest.fail("pawn-queue 0.1.3 venv missing: run `make test` (it builds .venv-pq013)")
    return path


async def run_013(config: dict[str, Any], *args: str) -> Any:
    process = await asyncio.create_subprocess_exec(
        compat_python(),
        str(AGENT),
        json.dumps(config),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.fixture
def configs(s3_config: S3Config) -> tuple[dict[str, Any], dict[str, Any]]:
    s3 = {
        "endpoint_url": s3_config.endpoint_url,
        "bucket_name": s3_config.bucket_name,
        "aws_access_key_id": "test-access-key",
        "aws_secret_access_key": "test-secret-key",
        "use_ssl": False,
    }
    legacy = {"s3": s3, "concurrency": {"strategy": "conditional_write"}}
    ours = {"backend": "s3", "s3": s3, "polling": {"interval_seconds": 0.05}}
    return legacy, ours


async def test_013_publishes_we_consume(configs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    legacy, ours = configs
    ids = await run_013(legacy, "publish", "orders", "5")
    async with await PawnQueue.from_config(ours) as pq:
        consumer = await pq.register_consumer("ours", topics=["orders"])
        got = []
        while len(got) < 5:
            batch = await consumer.poll()
            for message in batch:
                got.append((message.id, message.payload))
                await message.ack()
        assert [g[0] for g in got] == ids
        assert [g[1] for g in got] == [{"n": n, "from": "0.1.3"} for n in range(5)]
        assert await keys_under(pq, "orders/messages/") == []
        assert await keys_under(pq, "orders/leases/") == []


async def test_we_publish_013_consumes(configs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    legacy, ours = configs
    async with await PawnQueue.from_config(ours) as pq:
        await pq.create_topic("events", max_receive_count=3)
        producer = await pq.register_producer("ours")
        ids = [await producer.publish("events", {"n": n}) for n in range(5)]
        # A delayed message's key marks its timestamp; 0.1.3 still reads its id.
        ids.append(await producer.publish("events", {"n": 5}, delay=0.01))
        got = await run_013(legacy, "consume", "events", "6")
        assert [g["id"] for g in got] == ids
        assert [g["payload"] for g in got] == [{"n": n} for n in range(6)]
        assert {g["producer_id"] for g in got} == {producer.id}
        assert await pq.store.list("events/messages/") == []
        assert await pq.list_topics() == ["events"]


async def test_013_registration_keeps_its_id(
    configs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    legacy, ours = configs
    legacy_id = await run_013(legacy, "register", "shared-service")
    async with await PawnQueue.from_config(ours) as pq:
        assert (await pq.register_producer("shared-service")).id == legacy_id
    assert await run_013(legacy, "register", "shared-service") == legacy_id
