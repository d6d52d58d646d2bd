"""A consumer of several topics keeps serving each while a big batch object drains."""

from __future__ import annotations

import asyncio
from typing import Any

from pawn_queue import PawnQueue


async def test_a_big_batch_does_not_hold_back_another_topic(pq: PawnQueue) -> None:
    await pq.create_topic("bulk")
    await pq.create_topic("urgent")
    producer = await pq.register_producer("p")
    await producer.publish_batch("bulk", [{"n": n} for n in range(300)])
    consumer = await pq.register_consumer("c", ["bulk", "urgent"])
    first = await consumer.poll(wait=5)
    assert first and {m.topic for m in first} == {"bulk"}  # the rest of the batch is kept
    urgent = {await producer.publish("urgent", {"n": n}) for n in range(5)}
    seen: list[str] = []
    bulk = len(first)
    for message in first:
        await message.ack()
    polls = 0
    while not urgent <= set(seen):
        polls += 1
        assert polls <= 3, f"urgent messages still waiting after {bulk} bulk ones"
        for message in await consumer.poll(wait=5):
            seen.append(message.id)
            bulk += message.topic == "bulk"
            await message.ack()
    # Interleaved: the batch goes on at the same time, at the pace of a poll.
    assert bulk - len(first) > 0 and bulk < 300


async def test_a_consumer_that_loses_a_claim_race_polls_again_at_once(
    queue_config: dict[str, Any],
) -> None:
    # The loser must not wait for the winner's lease to expire (60 s), for the backfill
    # (60 s) or for a change signal: the consumers look at the signals every 30 s only.
    polling = {**queue_config["polling"], "visibility_timeout_seconds": 60}
    notify = {"check_interval_seconds": 30, "idle_check_interval_seconds": 30}
    config = {**queue_config, "polling": polling, "notify": notify}
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t", claims="message")
        queues = [await PawnQueue.from_config(config) for _ in range(2)]
        try:
            consumers = []
            for i, queue in enumerate(queues):
                await queue.setup()
                consumers.append(await queue.register_consumer(f"c{i}", ["t"]))
            # Published before their first poll: a later publish from another process reaches
            # them only through a signal, which they would see within a check (30 s here).
            producer = await pq.register_producer("p")
            for n in range(20):
                await producer.publish("t", {"n": n})
            # Both start at the head: one of them loses that first claim, and tries again at
            # once. (Before, it waited out its poll's wait, 30 s here, and polled once more.)
            async with asyncio.timeout(15):
                first, second = await asyncio.gather(*(c.poll(wait=30) for c in consumers))
            assert first and second
            assert not {m.id for m in first} & {m.id for m in second}
        finally:
            for queue in queues:
                await queue.teardown()
