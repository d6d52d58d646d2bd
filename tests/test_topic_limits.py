"""Retention and backpressure on every store."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from pawn_queue import PawnQueue, QueueFullError
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import Envelope


async def plant_old_message(pq: PawnQueue, topic: str, age: timedelta) -> str:
    """A message as a producer would have written it ``age`` ago."""
    message_id = "00000000-0000-4000-8000-0000000000b1"
    at = datetime.now(UTC) - age
    envelope = Envelope(message_id, topic, "p", at.isoformat(), {"old": True})
    await pq.store.put(layout.message_key(topic, message_id, at), envelope.encode())
    return message_id


@pytest.mark.parametrize("action", ["delete", "dead_letter"])
async def test_retention_expires_old_messages(pq: PawnQueue, action: str) -> None:
    await pq.create_topic("t", retention_seconds=60, retention_action=action)
    old = await plant_old_message(pq, "t", timedelta(minutes=5))
    fresh = await (await pq.register_producer("p")).publish("t", {"old": False})
    consumer = await pq.register_consumer("c", topics=["t"])
    assert [m.id for m in await consumer.poll()] == [fresh]
    assert [m.key for m in await pq.store.list(layout.messages_prefix("t"))] != []
    dead = await pq.store.list(layout.dead_letter_prefix("t"))
    if action == "dead_letter":
        assert [m.key for m in dead] == [layout.dead_letter_key("t", old)]
        body = json.loads((await pq.store.get(dead[0].key)).data)
        assert body["dead_letter"]["reason"] == "retention"
    else:
        assert dead == []
    remaining = [m.key for m in await pq.store.list(layout.messages_prefix("t"))]
    assert all(old not in key for key in remaining)


async def test_max_pending_blocks_then_raises(pq: PawnQueue) -> None:
    await pq.create_topic("t", max_pending=3)
    producer = await pq.register_producer("p")
    for n in range(3):
        await producer.publish("t", n)
    with pytest.raises(QueueFullError):
        await producer.publish("t", 3, wait_for_room=0.5)
    assert len(await pq.store.list(layout.messages_prefix("t"))) == 3

    # Room made while a publish waits lets it through.
    consumer = await pq.register_consumer("c", topics=["t"])
    waiting = asyncio.create_task(producer.publish("t", 4, wait_for_room=10))
    first = (await consumer.poll())[0]
    await first.ack()
    mid = await asyncio.wait_for(waiting, 15)
    keys = [m.key for m in await pq.store.list(layout.messages_prefix("t"))]
    assert len(keys) == 3 and any(mid in key for key in keys)
