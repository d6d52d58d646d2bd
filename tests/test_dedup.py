"""Deduplication by dedup_id on every store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pawn_queue import ArgumentError, PawnQueue, PublishError, layout
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore


async def message_keys(pq: PawnQueue, topic: str) -> list[str]:
    return [m.key for m in await pq.store.list(layout.messages_prefix(topic))]


async def test_repeat_returns_the_first_id_and_writes_nothing(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    first = await producer.publish("t", {"order": 1}, dedup_id="order-1")
    again = await producer.publish("t", {"order": 1}, dedup_id="order-1")
    other = await producer.publish("t", {"order": 2}, dedup_id="order-2")
    assert first == again != other
    assert len(await message_keys(pq, "t")) == 2
    [m1, m2] = await (await pq.register_consumer("c", topics=["t"])).poll()
    assert (m1.id, m2.id) == (first, other)
    with pytest.raises(ArgumentError):
        await producer.publish("t", 1, dedup_id="")


async def test_concurrent_repeats_from_several_producers(queue_config: dict[str, Any]) -> None:
    queues = [await PawnQueue.from_config(queue_config) for _ in range(6)]
    for q in queues:
        await q.setup()
    try:
        await queues[0].create_topic("t")
        producers = [await q.register_producer(f"p{i}") for i, q in enumerate(queues)]
        for round_ in range(3):
            ids = await asyncio.gather(
                *(p.publish("t", {"r": round_}, dedup_id=f"same-{round_}") for p in producers)
            )
            assert len(set(ids)) == 1
        assert len(await message_keys(queues[0], "t")) == 3
    finally:
        for q in queues:
            await q.teardown()


async def test_id_is_free_again_after_the_window(pq: PawnQueue) -> None:
    await pq.create_topic("t", dedup_window_seconds=0.3)
    producer = await pq.register_producer("p")
    first = await producer.publish("t", 1, dedup_id="x")
    await asyncio.sleep(0.4)  # let the window pass
    assert await producer.publish("t", 1, dedup_id="x") != first
    assert len(await message_keys(pq, "t")) == 2


async def test_retry_after_a_failed_publish_writes_the_message(
    queue_config: dict[str, Any],
) -> None:
    config = load_config(queue_config)
    faulty = FaultyStore(open_store(config))

    async def lose_message_write(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            raise StoreUnavailable("injected")

    async with PawnQueue(config, store=faulty) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        faulty.hooks.append(lose_message_write)
        with pytest.raises(PublishError):
            await producer.publish("t", {"n": 1}, dedup_id="retry-me")
        assert await message_keys(pq, "t") == []
        faulty.hooks.clear()
        mid = await producer.publish("t", {"n": 1}, dedup_id="retry-me")
        [key] = await message_keys(pq, "t")
        assert mid in key
        assert await producer.publish("t", {"n": 1}, dedup_id="retry-me") == mid
        assert len(await message_keys(pq, "t")) == 1
