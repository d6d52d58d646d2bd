"""Lanes: competing consumers claim in different lanes, and no lane is left behind."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.lanes import lane_of
from pawn_queue.config import load_config
from pawn_queue.consumer import Consumer
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore


@pytest.fixture
async def two_queues(
    queue_config: dict[str, Any],
) -> AsyncIterator[tuple[PawnQueue, CountingStore, PawnQueue, CountingStore]]:
    """Two processes' worth of queue on one store, each counting its own requests."""
    queue_config["polling"]["visibility_timeout_seconds"] = 60
    queue_config["polling"]["lease_refresh_interval_seconds"] = 20
    queue_config["notify"] = {"enabled": False}
    config = load_config(queue_config)
    store_a, store_b = CountingStore(open_store(config)), CountingStore(open_store(config))
    async with PawnQueue(config, store=store_a) as a, PawnQueue(config, store=store_b) as b:
        await a.create_topic("t", claims="message")
        yield a, store_a, b, store_b


def _lanes_of(ids: list[str]) -> list[int]:
    return [lane_of(i) for i in ids]


def _work_in_lane(consumer: Consumer, lane: int) -> None:
    """Put a consumer in the state a lost claim race leaves: contended, working ``lane``."""
    consumer._claimer.lanes.work_in("t", lane)


async def test_competing_consumers_in_different_lanes_never_race(
    two_queues: tuple[PawnQueue, CountingStore, PawnQueue, CountingStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # However slowly the messages were published, no lane counts as left behind here.
    monkeypatch.setattr("pawn_queue._protocol.lanes._LANE_LAG", timedelta(hours=1))
    a, store_a, b, store_b = two_queues
    producer = await a.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(40)]
    lanes = _lanes_of(ids)
    lane_a, lane_b = (lane for lane, _ in Counter(lanes).most_common(2))
    first = await a.register_consumer("a", topics=["t"])
    second = await b.register_consumer("b", topics=["t"])
    _work_in_lane(first, lane_a)
    _work_in_lane(second, lane_b)
    store_a.reset(), store_b.reset()
    got_a, got_b = await first.poll(), await second.poll()
    # Each claimed only in its lane, oldest first, and lost no claim to the other.
    assert [m.id for m in got_a] == [i for i, n in zip(ids, lanes, strict=True) if n == lane_a][:10]
    assert [m.id for m in got_b] == [i for i, n in zip(ids, lanes, strict=True) if n == lane_b][:10]
    assert store_a.reset()["PUT create"] == len(got_a)
    assert store_b.reset()["PUT create"] == len(got_b)


async def test_a_lane_nobody_works_is_not_left_behind(
    two_queues: tuple[PawnQueue, CountingStore, PawnQueue, CountingStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Any wait counts as too long: the oldest message's lane must be taken up at once.
    monkeypatch.setattr("pawn_queue._protocol.lanes._LANE_LAG", timedelta(0))
    a = two_queues[0]
    producer = await a.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(40)]
    lanes = _lanes_of(ids)
    own = next(lane for lane in lanes if lane != lanes[0])
    consumer = await a.register_consumer("c", topics=["t"])
    _work_in_lane(consumer, own)
    got = [m.id for m in await consumer.poll()]
    assert got[0] == ids[0]
    assert got == [i for i, n in zip(ids, lanes, strict=True) if n == lanes[0]][:10]


async def test_a_higher_priority_in_another_lane_draws_a_competing_consumer(
    two_queues: tuple[PawnQueue, CountingStore, PawnQueue, CountingStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However recent, a message of a higher priority than the first of a consumer's lane
    takes it to that message's lane (docs/concepts/priorities.md)."""
    monkeypatch.setattr("pawn_queue._protocol.lanes._LANE_LAG", timedelta(hours=1))
    a = two_queues[0]
    producer = await a.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(20)]
    urgent = await producer.publish("t", "urgent", priority=9)
    own = next(lane for lane in _lanes_of(ids) if lane != lane_of(urgent))
    consumer = await a.register_consumer("c", topics=["t"])
    _work_in_lane(consumer, own)
    got = await consumer.poll()
    assert got[0].id == urgent
    assert all(lane_of(m.id) == lane_of(urgent) for m in got)


async def test_consumers_that_start_together_lose_one_claim_between_them(
    two_queues: tuple[PawnQueue, CountingStore, PawnQueue, CountingStore],
) -> None:
    """Both claim the head message alone first: one wins it and then the rest of its poll;
    the other loses that one claim and stops there, rather than racing for ten."""
    a, store_a, b, store_b = two_queues
    producer = await a.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(20)]
    first = await a.register_consumer("a", topics=["t"])
    second = await b.register_consumer("b", topics=["t"])
    store_a.reset(), store_b.reset()
    got_a, got_b = await asyncio.gather(first.poll(), second.poll())
    claims = store_a.reset()["PUT create"] + store_b.reset()["PUT create"]
    assert sorted([len(got_a), len(got_b)]) == [0, 10]
    assert [m.id for m in got_a or got_b] == ids[:10]
    assert claims == 10 + 1


async def test_a_competing_consumer_claims_no_more_batch_objects_than_its_poll_needs(
    two_queues: tuple[PawnQueue, CountingStore, PawnQueue, CountingStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One batch object of 20 fills a poll of 10: claiming the others of its lane too would
    take 20 messages each from the competitors, and lose races for them."""
    monkeypatch.setattr("pawn_queue._protocol.lanes._LANE_LAG", timedelta(hours=1))
    a, store_a, _, _ = two_queues
    producer = await a.register_producer("p")
    batches = {tuple(await producer.publish_batch("t", list(range(20)))) for _ in range(16)}
    pending = [layout.parse_pending_key(m.key) for m in await a.store.list("t/messages/")]
    lanes = Counter(lane_of(p.lease_id()) for p in pending if p is not None)
    lane, count = lanes.most_common(1)[0]
    assert count >= 2 and sum(lanes.values()) == 16  # 16 objects in 8 lanes
    consumer = await a.register_consumer("a", topics=["t"])
    _work_in_lane(consumer, lane)
    store_a.reset()
    got = [m.id for m in await consumer.poll()]
    assert store_a.reset()["PUT create"] == 1
    got += [m.id for m in await consumer.poll()]  # the rest of that object, kept
    assert store_a.reset()["PUT create"] == 0
    assert tuple(got) in batches
