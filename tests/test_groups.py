"""Message groups: strict order within a group, one in flight per group, groups in parallel."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import pytest

from pawn_queue import ArgumentError, Message, PawnQueue
from tests.helpers.support import poll_count


async def test_group_order_under_competing_consumers(queue_config: dict[str, Any]) -> None:
    groups = ["customer-1", "customer-2", "customer-3"]
    per_group = 8
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        for seq in range(per_group):
            for group in groups:
                await producer.publish("t", {"g": group, "seq": seq}, group=group)

    processed: dict[str, list[int]] = defaultdict(list)
    in_flight: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    done = asyncio.Event()
    rng = random.Random(5)

    async def handler(message: Message) -> None:
        group = message.payload["g"]
        assert message.group == group
        if in_flight[group]:
            overlaps.append(group)
        in_flight[group] += 1
        await asyncio.sleep(rng.uniform(0, 0.03))
        processed[group].append(message.payload["seq"])
        in_flight[group] -= 1
        await message.ack()
        if sum(len(v) for v in processed.values()) == len(groups) * per_group:
            done.set()

    queues = [await PawnQueue.from_config(queue_config) for _ in range(4)]
    tasks = []
    try:
        for i, q in enumerate(queues):
            await q.setup()
            consumer = await q.register_consumer(f"c{i}", topics=["t"])
            tasks.append(asyncio.create_task(consumer.listen(handler)))
        await asyncio.wait_for(done.wait(), 60)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for q in queues:
            await q.teardown()
    assert overlaps == [], "two messages of one group were in flight at once"
    for group in groups:
        assert processed[group] == list(range(per_group)), group


async def test_groups_run_in_parallel_and_block_only_themselves(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    a1 = await producer.publish("t", "a1", group="a")
    a2 = await producer.publish("t", "a2", group="a")
    b1 = await producer.publish("t", "b1", group="b")
    plain = await producer.publish("t", "plain")
    consumer = await pq.register_consumer("c", topics=["t"])
    first = await consumer.poll()
    assert sorted(m.id for m in first) == sorted([a1, b1, plain])  # a2 waits for a1
    assert await consumer.poll() == []
    by_id = {m.id: m for m in first}
    await by_id[a1].ack()
    [second] = await poll_count(consumer, 1)
    assert second.id == a2
    with pytest.raises(ArgumentError):
        await producer.publish("t", 1, group="")
