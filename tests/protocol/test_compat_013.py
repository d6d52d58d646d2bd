"""Bucket-layout compatibility with pawn-queue 0.1.3 (from PyPI, in its own venv), both ways."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue.config import S3Config
from tests.helpers.support import keys_under

AGENT = Path(__file__).parents[1] / "workers" / "pq013_agent.py"
ROOT = Path(__file__).parents[2]


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
        # A new topic that 0.1.3 reads claims each message (0.1.3 does not read runs).
        await pq.create_topic("events", max_receive_count=3, claims="message")
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


async def test_a_topic_013_created_stays_readable_by_013(
    configs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """Upgrading producers changes nothing in a topic 0.1.3 created: its marker does not
    say how it is claimed, which means a claim a message (no .run names 0.1.3 skips)."""
    legacy, ours = configs
    first = await run_013(legacy, "publish", "legacy", "1")
    async with await PawnQueue.from_config(ours) as pq:
        await pq.create_topic("legacy")  # exists: nothing given, nothing compared
        producer = await pq.register_producer("ours")
        ids = [await producer.publish("legacy", {"n": n}) for n in range(3)]
        assert not [key for key in await keys_under(pq, "legacy/messages/") if key.endswith(".run")]
        got = await run_013(legacy, "consume", "legacy", "4")
        assert [g["id"] for g in got] == first + ids
        assert await pq.store.list("legacy/messages/") == []


async def test_013_consumes_our_priorities_highest_first(
    configs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """0.1.3 reads the id from the end of a key: a banded key is delivered like any other,
    and first, since 0.1.3 claims in listing order; it ignores the body's priority."""
    legacy, ours = configs
    async with await PawnQueue.from_config(ours) as pq:
        await pq.create_topic("jobs", claims="message")
        producer = await pq.register_producer("ours")
        ids = [
            await producer.publish("jobs", {"n": n}, priority=p) for n, p in enumerate([0, 9, 0, 4])
        ]
        got = await run_013(legacy, "consume", "jobs", "4")
        assert [g["id"] for g in got] == [ids[1], ids[3], ids[0], ids[2]]
        assert await pq.store.list("jobs/messages/") == []


# Values whose JSON the fast codec and the standard library could write or read differently.
PAYLOADS: list[Any] = [
    {"text": "naïve café 注文 \U0001f600 \u2028 </script>", "escapes": '"\\\n\t\x00\x7f'},
    {"big": [2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40], "digits": "1" * 30},
    {"floats": [0.1, 1e-05, 1e16, 1e300, -0.0, 5e-324, 1.5], "none": None, "bools": [True, False]},
    [[[[{"deep": {"k": []}}]]]],
    "a string",
    12345678901234567890123,
    None,
]


async def test_payloads_round_trip_with_013_both_ways(
    configs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    legacy, ours = configs
    async with await PawnQueue.from_config(ours) as pq:
        await pq.create_topic("to-013", claims="message")
        producer = await pq.register_producer("ours")
        ids = [await producer.publish("to-013", payload) for payload in PAYLOADS]
        got = await run_013(legacy, "consume", "to-013", str(len(PAYLOADS)))
        assert [(g["id"], g["payload"]) for g in got] == list(zip(ids, PAYLOADS, strict=True))

        # 0.1.3 writes NaN and infinity (it never refused them): they are read as before.
        sent = [*PAYLOADS, {"nan": math.nan, "inf": [math.inf, -math.inf]}]
        ids = await run_013(legacy, "publish-json", "from-013", json.dumps(sent))
        consumer = await pq.register_consumer("ours", topics=["from-013"])
        received: dict[str, Any] = {}
        while len(received) < len(sent):
            for message in await consumer.poll():
                received[message.id] = message.payload
                await message.ack()
        assert [received[i] for i in ids[:-1]] == PAYLOADS
        last = received[ids[-1]]
        assert math.isnan(last["nan"]) and last["inf"] == [math.inf, -math.inf]


async def test_013_registration_keeps_its_id(
    configs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    legacy, ours = configs
    legacy_id = await run_013(legacy, "register", "shared-service")
    async with await PawnQueue.from_config(ours) as pq:
        assert (await pq.register_producer("shared-service")).id == legacy_id
    assert await run_013(legacy, "register", "shared-service") == legacy_id
