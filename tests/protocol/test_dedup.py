"""Deduplication by dedup_id on every store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from pawn_queue import ArgumentError, PawnQueue, PublishError
from pawn_queue._internal.aio import Background
from pawn_queue._protocol import dedup, layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.stores import FAST_CONCURRENCY
from tests.helpers.support import settled


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


async def test_markers_past_their_window_are_swept(
    pq: PawnQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic that deduplicates every message kept one marker per message forever."""
    monkeypatch.setattr(dedup, "SWEEP_MIN_SECONDS", 0.0)  # a sweep per window (3 s)
    # 3 s: the 20 publishes and the drain fit in it (1 s did not once, on a loaded machine:
    # the first markers were swept before they were counted).
    await pq.create_topic("t", dedup_window_seconds=3)
    producer = await pq.register_producer("p")
    for n in range(20):
        await producer.publish("t", {"n": n}, dedup_id=f"order-{n}")
    consumer = await pq.register_consumer("c", topics=["t"])
    while messages := await consumer.poll():
        for message in messages:
            await message.ack()
    await settled(pq)
    prefix = layout.dedup_prefix("t")
    assert len(await pq.store.list(prefix)) == 20
    # The window (and the clock-skew margin) passes: nothing but time can tell it did.
    await asyncio.sleep(3.0 + FAST_CONCURRENCY["clock_skew_margin_seconds"] + 0.3)
    fresh = await producer.publish("t", {"n": 20}, dedup_id="order-20")
    await pq.runtime.background.done()
    assert [m.key for m in await pq.store.list(prefix)] == [layout.dedup_key("t", "order-20")]
    # Inside the window a repeat still returns the first id.
    assert await producer.publish("t", {"n": 20}, dedup_id="order-20") == fresh


async def test_first_sweep_is_left_to_chance_then_runs_on_schedule(pq: PawnQueue) -> None:
    """A one-shot publisher (one publish per process) sweeps with FIRST_SWEEP_CHANCE."""
    await pq.create_topic("t")
    sweeps: list[str] = []

    async def sweep(topic: str, window: float) -> None:
        sweeps.append(topic)

    sweeper = dedup.MarkerSweeper(pq.store, Background(), now_utc, timedelta(0), first_chance=1.0)
    sweeper._sweep = sweep  # type: ignore[method-assign]
    sweeper.published("t", 300)
    sweeper.published("t", 300)  # within the interval: no second sweep
    never = dedup.MarkerSweeper(pq.store, Background(), now_utc, timedelta(0), first_chance=0)
    never._sweep = sweep  # type: ignore[method-assign]
    never.published("t", 300)
    await asyncio.sleep(0)
    assert sweeps == ["t"]
