"""Retries, delays and visibility on every store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pawn_queue import ArgumentError, ConfigError, Message, PawnQueue, Retry
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.storage import dead_letter_ids, lease_of, message_keys, write_message
from tests.helpers.support import keys_under, poll_count

MARGIN = timedelta(seconds=0.2)  # clock_skew_margin_seconds in the test config


async def test_delayed_publish_is_invisible_until_due(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    due = datetime.now(UTC) + timedelta(seconds=2)
    delayed = await producer.publish("t", {"late": True}, delay=2)
    now_id = await producer.publish("t", {"late": False})
    assert [m.id for m in await consumer.poll()] == [now_id]  # the delayed one waits
    [message] = await consumer.poll(wait=10)
    assert message.id == delayed
    assert datetime.now(UTC) >= due  # never early (rule 9), whatever the skew margin
    await message.ack()
    with pytest.raises(ArgumentError):
        await producer.publish("t", 1, delay=-1)


async def test_requeue_with_delay_redelivers_after_the_delay(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    mid = await (await pq.register_producer("p")).publish("t", {"n": 1})
    consumer = await pq.register_consumer("c", topics=["t"])
    [first] = await poll_count(consumer, 1)
    assert first.receive_count == 1
    requeued_at = datetime.now(UTC)
    await first.nack(requeue=True, delay=1.5)
    assert await consumer.poll() == []
    [again] = await consumer.poll(wait=10)
    assert again.id == mid and again.receive_count == 2
    assert datetime.now(UTC) >= requeued_at + timedelta(seconds=1.5)
    await again.ack()
    assert await keys_under(pq, "t/") == ["t/.topic"]


async def test_delays_are_as_asked_with_the_default_skew_margin(
    queue_config: dict[str, Any],
) -> None:
    """The skew margin (2 s by default) lets undelayed messages of a fast-clocked producer
    through at once; it never makes a delay shorter (rule 9) nor a requeue delay longer."""
    queue_config["concurrency"] = {"clock_skew_margin_seconds": 2.0}
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", topics=["t"])
        published = datetime.now(UTC)
        delayed = await producer.publish("t", {"late": True}, delay=1.0)
        assert await consumer.poll() == []
        [message] = await consumer.poll(wait=10)
        arrived = datetime.now(UTC)
        assert message.id == delayed
        assert arrived >= published + timedelta(seconds=1.0)
        requeued = datetime.now(UTC)
        await message.nack(requeue=True, delay=0.5)
        [again] = await consumer.poll(wait=10)
        back = datetime.now(UTC)
        assert again.id == delayed and again.receive_count == 2
        # Before: the taker added the margin to the requeue delay (back after 2.5 s).
        assert requeued + timedelta(seconds=0.5) <= back < requeued + timedelta(seconds=2.0)
        await again.ack()

        received: list[tuple[int, datetime]] = []
        done = asyncio.Event()

        async def flaky(message: Message) -> None:
            received.append((message.receive_count, datetime.now(UTC)))
            if message.receive_count < 2:
                raise RuntimeError("not yet")
            await message.ack()
            done.set()

        await producer.publish("t", {"n": 1})
        task = asyncio.create_task(consumer.listen(flaky, retry=Retry(base_delay=0.2)))
        try:
            await asyncio.wait_for(done.wait(), 20)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert [count for count, _ in received] == [1, 2]
        first, second = (at for _, at in received)
        assert timedelta(seconds=0.2) <= second - first < timedelta(seconds=1.7)


async def test_delayed_messages_wait_while_skew_tolerant_ones_pass(
    queue_config: dict[str, Any],
) -> None:
    """Behind a delayed message that is not due, an undelayed one from a producer whose clock
    runs ahead (within the margin) is delivered at once; the delayed one, and the rest of its
    group, wait for its due time."""
    queue_config["concurrency"] = {"clock_skew_margin_seconds": 2.0}
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        consumer = await pq.register_consumer("c", topics=["t"])
        now = datetime.now(UTC)
        due = now + timedelta(seconds=1.0)
        ahead = now + timedelta(seconds=1.5)  # a producer clock 1.5 s fast
        # Written as producers would: the clock of the one that wrote it decides its key.
        delayed = await write_message(pq.store, "t", "delayed", at=due, delayed=True)
        group_head = await write_message(pq.store, "t", "head", at=due, delayed=True, group="g")
        skewed = await write_message(pq.store, "t", "skewed", at=ahead)
        group_tail = await write_message(pq.store, "t", "tail", at=ahead, group="g")
        assert [m.id for m in await consumer.poll()] == [skewed]
        later = await consumer.poll(wait=10)
        assert datetime.now(UTC) >= due
        assert {m.id for m in later} == {delayed, group_head}
        for message in later:
            await message.ack()
        [tail] = await consumer.poll(wait=10)
        assert tail.id == group_tail


async def test_retry_policy_backs_off_then_succeeds(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    mid = await (await pq.register_producer("p")).publish("t", {"n": 1})
    consumer = await pq.register_consumer("c", topics=["t"])
    counts: list[int] = []
    done = asyncio.Event()

    async def flaky(message: Message) -> None:
        counts.append(message.receive_count)
        if message.receive_count < 3:
            raise RuntimeError("not yet")
        await message.ack()
        done.set()

    task = asyncio.create_task(consumer.listen(flaky, retry=Retry(base_delay=0.1)))
    await asyncio.wait_for(done.wait(), 20)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert counts == [1, 2, 3]
    assert await dead_letter_ids(pq.store, "t") == []
    assert mid


async def test_retry_policy_dead_letters_when_exhausted(queue_config: dict[str, Any]) -> None:
    config = load_config(queue_config)
    dead_lettered = asyncio.Event()

    async def on_put(operation: str, key: str) -> None:
        if operation == "put" and "/dead-letter/" in key:
            dead_lettered.set()

    store = FaultyStore(open_store(config), observers=[on_put])
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")
        mid = await (await pq.register_producer("p")).publish("t", {"n": 1})
        consumer = await pq.register_consumer("c", topics=["t"])
        seen: list[int] = []

        async def failing(message: Message) -> None:
            seen.append(message.receive_count)
            raise RuntimeError("always")

        retry = Retry(max_receives=3, base_delay=0)
        task = asyncio.create_task(consumer.listen(failing, retry=retry))
        await asyncio.wait_for(dead_lettered.wait(), 20)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert seen == [1, 2, 3]
        dead = await pq.dead_letter("t", mid)
        assert dead is not None and dead.reason == "handler_error"
        assert dead.error is not None and "always" in dead.error


async def test_max_receive_count_dead_letters_a_message_that_keeps_failing(
    pq: PawnQueue,
) -> None:
    await pq.create_topic("t", max_receive_count=2)
    mid = await (await pq.register_producer("p")).publish("t", {"n": 1})
    consumer = await pq.register_consumer("c", topics=["t"])
    for expected in (1, 2):
        [message] = await consumer.poll(wait=5)
        assert message.receive_count == expected
        await message.nack(requeue=True)
    assert await consumer.poll(wait=0.5) == []
    dead = await pq.dead_letter("t", mid)
    assert dead is not None and dead.reason == "max_receive_count"
    assert await message_keys(pq.store, "t") == []


async def test_max_receive_count_catches_a_consumer_that_keeps_dying(
    queue_config: dict[str, Any],
) -> None:
    queue_config["polling"]["visibility_timeout_seconds"] = 1.0
    queue_config["polling"]["lease_refresh_interval_seconds"] = 0.2
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t", max_receive_count=2)
        mid = await (await pq.register_producer("p")).publish("t", {"n": 1})
    for attempt in (1, 2):
        async with await PawnQueue.from_config(queue_config) as dying:
            consumer = await dying.register_consumer(f"dies-{attempt}", topics=["t"])
            [message] = await consumer.poll(wait=10)
            assert message.receive_count == attempt
            consumer.held_leases.paused = True  # then the process "dies": its lease expires
            for lease in consumer.held_leases:  # so teardown has nothing to release
                consumer.held_leases.forget(lease)
    async with await PawnQueue.from_config(queue_config) as pq:
        consumer = await pq.register_consumer("survivor", topics=["t"])
        assert await consumer.poll(wait=3) == []
        dead = await pq.dead_letter("t", mid)
        assert dead is not None and dead.reason == "max_receive_count"


async def test_extend_and_per_consumer_visibility(pq: PawnQueue) -> None:
    await pq.create_topic("t", claims="message")
    await (await pq.register_producer("p")).publish("t", {"n": 1})
    with pytest.raises(ConfigError):
        await pq.register_consumer("c", topics=["t"], visibility_timeout=0.1)
    consumer = await pq.register_consumer("c", topics=["t"], visibility_timeout=20)
    [message] = await poll_count(consumer, 1)

    async def expires_in() -> float:
        lease = await lease_of(pq.store, "t", message.id)
        return (lease.expires - datetime.now(UTC)).total_seconds()

    assert 15 < await expires_in() <= 20
    await message.extend(120)
    assert 115 < await expires_in() <= 120
    with pytest.raises(ArgumentError):
        await message.extend(0)
    await message.ack()


async def test_requeued_batch_member_moves_and_keeps_its_count(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    ids = await (await pq.register_producer("p")).publish_batch("t", ["a", "b"])
    consumer = await pq.register_consumer("c", topics=["t"])
    first, second = await consumer.poll()
    await first.nack(requeue=True)
    await second.ack()
    [again] = await consumer.poll(wait=5)
    assert again.id == ids[0] and again.payload == "a"
    assert again.receive_count == 2
    await again.ack()
    assert await message_keys(pq.store, "t") == []
