"""Batch objects: many messages in one object, one lease, settled one by one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from pawn_queue import PawnQueue, PayloadError, TopicNotFoundError, layout
from tests.support import keys_under, settled


async def test_batch_is_one_object_delivered_in_order(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    ids = await producer.publish_batch("t", [{"n": n} for n in range(25)], attributes={"a": "b"})
    assert len(ids) == len(set(ids)) == 25
    [obj] = await pq.store.list("t/messages/")
    assert obj.key.endswith(".batch")
    consumer = await pq.register_consumer("c", topics=["t"])
    sizes, got = [], []
    while len(got) < 25:
        batch = await consumer.poll()
        sizes.append(len(batch))
        for message in batch:
            got.append(message.id)
            assert message.attributes == {"a": "b"}
            assert message.producer_id == producer.id
            if len(got) < 25:
                assert len(await pq.store.list("t/messages/")) == 1
            await message.ack()
    assert sizes == [10, 10, 5]
    assert got == ids
    assert await keys_under(pq, "t/") == ["t/.topic"]


async def test_batch_member_nack_goes_alone_to_dead_letter(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    ids = await (await pq.register_producer("p")).publish_batch("t", ["a", "b", "c"])
    messages = await (await pq.register_consumer("c", topics=["t"])).poll()
    await messages[1].nack()
    await messages[0].ack()
    await messages[2].ack()
    assert [m.key for m in await pq.store.list("t/dead-letter/")] == [
        f"t/dead-letter/{ids[1]}.json"
    ]
    dead = json.loads((await pq.store.get(f"t/dead-letter/{ids[1]}.json")).data)
    assert dead["payload"] == "b"
    assert await pq.store.list("t/messages/") == []


async def test_takeover_redelivers_only_unsettled_members(queue_config: dict[str, Any]) -> None:
    queue_config["polling"]["visibility_timeout_seconds"] = 1.0
    queue_config["polling"]["lease_refresh_interval_seconds"] = 0.2
    async with (
        await PawnQueue.from_config(queue_config) as qa,
        await PawnQueue.from_config(queue_config) as qb,
    ):
        await qa.create_topic("t")
        ids = await (await qa.register_producer("p")).publish_batch("t", list(range(25)))
        a = await qa.register_consumer("a", topics=["t"])
        first = await a.poll()
        for message in first:
            await message.ack()
        [lease] = a._held.values()
        await qa._leases.refresh(lease)  # what the background refresh does
        body = json.loads((await qa.store.get(layout.lease_key("t", lease.message_id))).data)
        assert sorted(body["settled"]) == list(range(10))
        a._refresh_paused = True  # consumer a stalls, as if it crashed

        b = await qb.register_consumer("b", topics=["t"])
        got: list[str] = []
        async with asyncio.timeout(20):
            while len(got) < 15:
                for message in await b.poll():
                    got.append(message.id)
                    await message.ack()
                await asyncio.sleep(0.05)
        assert got == ids[10:]
        await settled(qb)
        assert await keys_under(qa, "t/") == ["t/.topic"]


async def test_batch_errors_write_nothing(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    assert await producer.publish_batch("t", []) == []
    with pytest.raises(PayloadError):
        await producer.publish_batch("t", [{"ok": 1}, {"bad": float("inf")}])
    with pytest.raises(TopicNotFoundError):
        await producer.publish_batch("nope", [1])
    assert await pq.store.list("t/messages/") == []
