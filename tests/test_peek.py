"""Peek: the oldest messages of a topic with their state, read without claiming them."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pawn_queue import PawnQueue, TopicNotFoundError
from pawn_queue import sync as pq_sync
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from tests.helpers.support import keys_under


async def test_peek_shows_each_state_and_claims_nothing(pq: PawnQueue) -> None:
    await pq.create_topic("t", claims="message")
    producer = await pq.register_producer("p")
    a0 = await producer.publish("t", {"n": 0}, attributes={"k": "v"})
    g0 = await producer.publish("t", {"g": 0}, group="g")
    g1 = await producer.publish("t", {"g": 1}, group="g")
    consumer = await pq.register_consumer("c", topics=["t"])
    held: list[Any] = []
    while len(held) < 2:  # a0 and the group's head: g1 waits behind g0
        held += await consumer.poll(wait=2)
    assert {m.id for m in held} == {a0, g0}
    a1 = await producer.publish("t", {"n": 1})
    b0, b1 = await producer.publish_batch("t", ["b0", "b1"])
    later = await producer.publish("t", "later", delay=3600)

    leases = await keys_under(pq, "t/leases/")
    messages = await keys_under(pq, "t/messages/")
    rows = await pq.peek("t", limit=10)
    assert [(r.id, r.state) for r in rows] == [
        (a0, "in_flight"),
        (g0, "in_flight"),
        (g1, "pending"),  # its group's lease covers only the group's oldest message
        (a1, "pending"),
        (b0, "pending"),
        (b1, "pending"),
        (later, "delayed"),
    ]
    assert await keys_under(pq, "t/leases/") == leases  # nothing claimed
    assert await keys_under(pq, "t/messages/") == messages
    first = rows[0]
    assert (first.topic, first.producer_id, first.payload, first.attributes) == (
        "t",
        producer.id,
        {"n": 0},
        {"k": "v"},
    )
    assert first.key in messages and first.group is None and first.error is None
    assert [r.group for r in rows[1:3]] == ["g", "g"]
    assert rows[-1].due > datetime.now(UTC) + timedelta(seconds=3500)
    assert rows[0].due <= datetime.now(UTC)

    # The same classification as topic_stats, which counts objects (a batch once).
    stats = await pq.topic_stats("t")
    objects = Counter(r.state for r in rows if r.id != b1)
    assert (stats.pending, stats.in_flight, stats.delayed) == (
        objects["pending"],
        objects["in_flight"],
        objects["delayed"],
    )

    # ``limit`` objects are read, and at most ``limit`` messages returned.
    assert [r.id for r in await pq.peek("t", limit=3)] == [a0, g0, g1]
    assert [r.id for r in await pq.peek("t", limit=5)] == [a0, g0, g1, a1, b0]
    assert await pq.peek("t", limit=0) == []

    for message in held:
        await message.ack()
    assert [r.state for r in await pq.peek("t", limit=2)] == ["pending", "pending"]


async def test_peek_reports_a_corrupt_object_and_an_unknown_topic(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    object_id = str(uuid.uuid4())
    key = f"t/messages/20000101T000000_000000-{object_id}.json"
    await pq.store.put(key, b"not a message")
    [row] = await pq.peek("t")
    assert (row.id, row.key, row.state) == (object_id, key, "pending")
    assert row.error and row.payload is None
    with pytest.raises(TopicNotFoundError, match="topic 'nope' does not exist"):
        await pq.peek("nope")


async def test_peek_costs_two_lists_and_a_get_per_object(queue_config: dict[str, Any]) -> None:
    queue_config["notify"] = {"enabled": False}  # no change signals after the publishes
    config = load_config(queue_config)
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")  # the marker is cached from here
        producer = await pq.register_producer("p")
        for n in range(3):
            await producer.publish("t", n)
        await producer.publish_batch("t", ["a", "b"])
        store.reset()
        assert len(await pq.peek("t", limit=10)) == 5
        assert store.reset() == Counter({"LIST": 2, "GET": 4})  # and nothing written


def test_blocking_peek(queue_config: dict[str, Any]) -> None:
    with pq_sync.PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        message_id = pq.register_producer("p").publish("t", b"\x00raw")
        [row] = pq.peek("t")
        assert (row.id, row.state, row.payload) == (message_id, "pending", b"\x00raw")
