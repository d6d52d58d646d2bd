"""Retention and backpressure on every store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pawn_queue import PawnQueue, QueueFullError
from tests.helpers.storage import dead_letter_ids, message_keys, write_message


async def plant_old_message(pq: PawnQueue, topic: str, age: timedelta) -> str:
    """A message as a producer would have written it ``age`` ago."""
    return await write_message(pq.store, topic, {"old": True}, at=datetime.now(UTC) - age)


@pytest.mark.parametrize("action", ["delete", "dead_letter"])
async def test_retention_expires_old_messages(pq: PawnQueue, action: str) -> None:
    await pq.create_topic("t", retention_seconds=60, retention_action=action)
    old = await plant_old_message(pq, "t", timedelta(minutes=5))
    fresh = await (await pq.register_producer("p")).publish("t", {"old": False})
    consumer = await pq.register_consumer("c", topics=["t"])
    assert [m.id for m in await consumer.poll()] == [fresh]
    assert await message_keys(pq.store, "t") != []
    dead = await dead_letter_ids(pq.store, "t")
    if action == "dead_letter":
        assert dead == [old]
        letter = await pq.dead_letter("t", old)
        assert letter is not None and letter.reason == "retention"
    else:
        assert dead == []
    remaining = await message_keys(pq.store, "t")
    assert all(old not in key for key in remaining)


async def test_max_pending_blocks_then_raises(pq: PawnQueue) -> None:
    await pq.create_topic("t", max_pending=3)
    producer = await pq.register_producer("p")
    for n in range(3):
        await producer.publish("t", n)
    with pytest.raises(QueueFullError):
        await producer.publish("t", 3, wait_for_room=0.5)
    assert len(await message_keys(pq.store, "t")) == 3

    # Room made while a publish waits lets it through.
    consumer = await pq.register_consumer("c", topics=["t"])
    waiting = asyncio.create_task(producer.publish("t", 4, wait_for_room=10))
    first = (await consumer.poll())[0]
    await first.ack()
    mid = await asyncio.wait_for(waiting, 15)
    keys = await message_keys(pq.store, "t")
    assert len(keys) == 3 and any(mid in key for key in keys)
