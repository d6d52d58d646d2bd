"""Message priorities: ``publish(..., priority=0..9)``; consumers take the ready messages of
a higher priority first, FIFO within a priority, in a topic and in a subscription; the order
inside a group wins (docs/concepts/priorities.md). On memory, a local directory and S3."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pawn_queue import ArgumentError, Message, PawnQueue
from tests.helpers.support import keys_under, poll_count


def one_at_a_time(queue_config: dict[str, Any]) -> dict[str, Any]:
    """``queue_config`` whose polls return one message each: the order is the queue's."""
    polling = {**queue_config["polling"], "max_messages_per_poll": 1}  # type: ignore[dict-item]
    return {**queue_config, "polling": polling}


async def drain_in_order(pq: PawnQueue, count: int, **consumer: Any) -> list[Message]:
    """``count`` messages, one poll at a time, each acked before the next poll."""
    receiver = await pq.register_consumer("c", **{"topics": ["t"], **consumer})
    got: list[Message] = []
    async with asyncio.timeout(60):
        while len(got) < count:
            for message in await receiver.poll(wait=1):
                got.append(message)
                await message.ack()
    return got


async def test_default_priority_is_zero_and_keeps_the_key(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", "plain")
        await producer.publish("t", "banded", priority=3)
        names = [k.rsplit("/", 1)[-1] for k in await keys_under(pq, "t/messages/")]
        # Priority 0 is named as before (and as pawn-queue 0.1.x names it); 3 is in band !6.
        assert names[0].startswith("!6") and names[1][:8].isdigit()
        [banded, plain] = await drain_in_order(pq, 2)
        assert (banded.payload, banded.priority) == ("banded", 3)
        assert (plain.payload, plain.priority) == ("plain", 0)


@pytest.mark.alone  # a strict order: failed beside the other workers, passed alone
async def test_higher_priority_first_and_fifo_within_a_priority(
    queue_config: dict[str, Any],
) -> None:
    priorities = [0, 5, 9, 1, 9, 0, 5, 1, 0, 9, 3, 0]
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        for n, priority in enumerate(priorities):
            await producer.publish("t", n, priority=priority)
        # One batch object of priority 7: its messages together, in their band.
        await producer.publish_batch("t", ["b0", "b1"], priority=7)
        got = await drain_in_order(pq, len(priorities) + 2)
    expected = sorted(range(len(priorities)), key=lambda n: (-priorities[n], n))
    assert [m.payload for m in got] == [
        *[n for n in expected if priorities[n] == 9],
        "b0",
        "b1",
        *[n for n in expected if priorities[n] < 9],
    ]
    assert [m.priority for m in got] == sorted([*priorities, 7, 7], reverse=True)


async def test_concurrent_publishes_share_objects_of_one_priority_only(
    queue_config: dict[str, Any],
) -> None:
    """Group commit puts concurrent publishes in one object only if their priority is one."""
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await asyncio.gather(*(producer.publish("t", n, priority=n % 2 * 9) for n in range(40)))
        got = await drain_in_order(pq, 40)
    assert [m.priority for m in got] == [9] * 20 + [0] * 20
    assert all(m.payload % 2 == 1 for m in got[:20])


@pytest.mark.alone  # a strict order: failed beside the other workers, passed alone
async def test_priority_messages_overtake_a_backlog(queue_config: dict[str, Any]) -> None:
    """1,000 priority-0 messages queued, the consumer at work on them, then 20 of priority
    9: the 20 are handled before half of the 1,000 (an order, not a time)."""
    backlog, urgent = 1000, 20
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        for start in range(0, backlog, 50):  # concurrent: group commit makes batch objects
            await asyncio.gather(
                *(producer.publish("t", {"n": n}) for n in range(start, start + 50))
            )
        handled: list[int] = []
        published_at: list[int] = []  # how many were handled once the 20 were published
        done = asyncio.Event()

        async def handler(message: Message) -> None:
            handled.append(message.priority)
            if len(handled) == 50:  # published while the consumer works through the backlog
                await asyncio.gather(
                    *(producer.publish("t", {"urgent": n}, priority=9) for n in range(urgent))
                )
                published_at.append(len(handled))
            if len(handled) == backlog + urgent:
                done.set()

        consumer = await pq.register_consumer("c", topics=["t"])
        task = asyncio.create_task(consumer.listen(handler))
        try:
            async with asyncio.timeout(240):
                await done.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    positions = [i for i, priority in enumerate(handled) if priority == 9]
    assert len(positions) == urgent
    # What was handled while they were being published is this machine's speed: counted
    # from there, fewer than half of the backlog went before the last of them.
    [since] = published_at
    assert handled[since : positions[-1]].count(0) < backlog // 2, (since, positions)


async def test_delayed_priority_message_is_not_taken_early_then_comes_first(
    queue_config: dict[str, Any],
) -> None:
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        due = datetime.now(UTC) + timedelta(seconds=1.5)
        await producer.publish("t", "late-urgent", priority=9, delay=1.5)
        for n in range(6):
            await producer.publish("t", n)
        consumer = await pq.register_consumer("c", topics=["t"])
        first = await poll_count(consumer, 1)
        assert [m.payload for m in first] == [0]  # not the delayed one
        await consumer.ack_all(first)
        await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 0.1)
        got: list[Message] = []
        while len(got) < 6:
            batch = await consumer.poll(wait=1)
            await consumer.ack_all(batch)
            got += batch
    assert [m.payload for m in got] == ["late-urgent", 1, 2, 3, 4, 5]
    assert got[0].priority == 9


async def test_a_requeued_message_keeps_its_priority(queue_config: dict[str, Any]) -> None:
    """A message given back (its lease released) and a batch member requeued (moved to an
    object of its own) come back in their band: ahead of the priority-0 messages."""
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t", max_receive_count=5)
        producer = await pq.register_producer("p")
        await producer.publish_batch("t", ["b0", "b1"], priority=4)
        await producer.publish("t", "m", priority=6)
        for n in range(3):
            await producer.publish("t", n)
        first = await pq.register_consumer("first", topics=["t"])
        taken = [m for _ in range(3) for m in await poll_count(first, 1)]
        assert [(m.payload, m.priority) for m in taken] == [("m", 6), ("b0", 4), ("b1", 4)]
        for message in taken[:2]:
            await message.nack(requeue=True)  # m: given back; b0: moved out of its batch
        await taken[2].ack()
        got = await drain_in_order(pq, 5)  # another consumer: a listing of its own
    assert [(m.payload, m.priority) for m in got] == [("m", 6), ("b0", 4), (0, 0), (1, 0), (2, 0)]
    assert [m.receive_count for m in got[:2]] == [2, 2]


@pytest.mark.alone  # a strict order: failed beside the other workers (S3, twice), passed alone
async def test_a_redriven_dead_letter_keeps_its_priority(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", "urgent", priority=7)
        nacker = await pq.register_consumer("nacker", topics=["t"])
        [message] = await poll_count(nacker, 1)
        await message.nack()  # dead-lettered
        for n in range(2):
            await producer.publish("t", n)
        assert await pq.redrive("t") == 1
        got = await drain_in_order(pq, 3)
    assert [(m.payload, m.priority) for m in got] == [("urgent", 7), (0, 0), (1, 0)]


async def test_a_subscription_keeps_the_priorities(
    queue_config: dict[str, Any], quick_subscription_changes: None
) -> None:
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t")
        await pq.create_subscription("t", "s")
        producer = await pq.register_producer("p")
        for n, priority in enumerate([0, 2, 8, 0, 8]):
            await producer.publish("t", n, priority=priority)
        got = await drain_in_order(pq, 5, subscription="s")
    assert [(m.payload, m.priority) for m in got] == [(2, 8), (4, 8), (1, 2), (0, 0), (3, 0)]
    assert {m.subscription for m in got} == {"s"}


async def test_order_inside_a_group_wins(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(one_at_a_time(queue_config)) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", "g0", group="g")
        await producer.publish("t", "g1", group="g", priority=9)
        await producer.publish("t", "g2", group="g")
        await producer.publish("t", "x", priority=5)
        got = await drain_in_order(pq, 4)
    payloads = [m.payload for m in got]
    assert payloads[0] == "x"  # priority 5 first: the group's head has priority 0
    assert [p for p in payloads if p.startswith("g")] == ["g0", "g1", "g2"]
    assert {m.payload: m.priority for m in got} == {"g0": 0, "g1": 9, "g2": 0, "x": 5}


async def test_peek_shows_the_priorities_in_delivery_order(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", "low")
        await producer.publish("t", "high", priority=8)
        peeked = await pq.peek("t", 10)
    assert [(m.payload, m.priority) for m in peeked] == [("high", 8), ("low", 0)]


@pytest.mark.parametrize("bad", [10, -1, 1.5, True, "9", math.nan, None])
async def test_bad_priorities_are_refused_before_anything_is_written(
    queue_config: dict[str, Any], bad: Any
) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        with pytest.raises(ArgumentError, match="priority: got") as raised:
            await producer.publish("t", 1, priority=bad)
        assert isinstance(raised.value, ValueError)
        with pytest.raises(ArgumentError, match="priority: got"):
            await producer.publish_batch("t", [1, 2], priority=bad)
        assert await keys_under(pq, "t/messages/") == []


def test_the_blocking_api_takes_priorities(queue_config: dict[str, Any]) -> None:
    from pawn_queue import sync

    with sync.PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        producer.publish("t", "low")
        producer.publish_batch("t", ["mid-0", "mid-1"], priority=4)
        producer.publish("t", "high", priority=9)
        with pytest.raises(ArgumentError):
            producer.publish("t", "bad", priority=10)
        consumer = pq.register_consumer("c", topics=["t"])
        got = []
        while len(got) < 4:
            for message in consumer.poll(wait=1):
                got.append((message.payload, message.priority))
                message.ack()
    assert got == [("high", 9), ("mid-0", 4), ("mid-1", 4), ("low", 0)]
