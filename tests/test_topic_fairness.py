"""A consumer of several topics keeps serving each while a big batch object drains."""

from __future__ import annotations

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
