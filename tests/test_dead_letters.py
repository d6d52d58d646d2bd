"""Dead letters (list, redrive, purge) and topic stats on every store."""

from __future__ import annotations

import pytest

from pawn_queue import ArgumentError, PawnQueue, TopicNotFoundError
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.support import poll_count


async def test_dead_letters_carry_why_and_redrive_restores_them(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    ids = [await producer.publish("t", {"n": n}, attributes={"k": str(n)}) for n in range(3)]
    consumer = await pq.register_consumer("c", topics=["t"])
    messages = await consumer.poll()
    await messages[0].nack()
    await messages[1].dead_letter("handler_error", "ValueError('bad')")
    await messages[2].nack()
    letters = await pq.dead_letters("t")
    assert [d.id for d in letters] == ids  # oldest first: in the order they were written
    by_id = {d.id: d for d in letters}
    assert by_id[ids[1]].reason == "handler_error"
    assert by_id[ids[1]].error == "ValueError('bad')"
    assert by_id[ids[0]].reason == "nack" and by_id[ids[0]].receive_count == 1
    assert by_id[ids[0]].topic == "t" and by_id[ids[0]].dead_lettered_at

    assert await pq.redrive("t", ids=[ids[1]]) == 1
    [back] = await poll_count(consumer, 1)
    assert (back.id, back.payload, back.attributes) == (ids[1], {"n": 1}, {"k": "1"})
    assert back.producer_id == producer.id
    await back.ack()
    assert {d.id for d in await pq.dead_letters("t")} == {ids[0], ids[2]}

    assert await pq.redrive("t", limit=1, per_second=100) == 1
    assert len(await pq.dead_letters("t")) == 1
    assert await pq.purge_dead_letters("t") == 1
    assert await pq.dead_letters("t") == []
    with pytest.raises(ArgumentError):
        await pq.redrive("t", per_second=0)
    with pytest.raises(TopicNotFoundError):
        await pq.dead_letters("nope")


async def test_corrupt_dead_letters_are_listed_but_not_redriven(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    bad = "00000000-0000-4000-8000-0000000000aa"
    await pq.store.put(f"t/messages/20000101T000000_000000-{bad}.json", b"\x00garbage")
    consumer = await pq.register_consumer("c", topics=["t"])
    assert await consumer.poll() == []
    [letter] = await pq.dead_letters("t")
    assert (letter.id, letter.reason, letter.redrivable) == (bad, "corrupt", False)
    assert await pq.redrive("t") == 0


async def test_topic_stats(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    for n in range(5):
        await producer.publish("t", n)
    await producer.publish("t", "later", delay=3600)
    consumer = await pq.register_consumer("c", topics=["t"])
    held = await poll_count(consumer, 5)
    assert len(held) == 5  # the delayed one is not due
    await held[0].nack()
    stats = await pq.topic_stats("t")
    assert (stats.pending, stats.in_flight, stats.delayed, stats.dead_letter) == (0, 4, 1, 1)
    await consumer.release_all()
    stats = await pq.topic_stats("t")
    assert (stats.pending, stats.in_flight) == (4, 0)
    assert stats.oldest_age_seconds is not None and stats.oldest_age_seconds >= 0


async def test_redrive_cut_short_and_run_again_leaves_one_copy(
    queue_config: dict[str, object],
) -> None:
    """A redrive that died between writing the message and deleting its dead letter, run
    again, rewrites the same message object: one pending copy, no dead letter."""
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")
        message_id = await (await pq.register_producer("p")).publish("t", {"n": 1})
        [message] = await (await pq.register_consumer("c", topics=["t"])).poll()
        await message.nack()

        async def fail_dead_letter_delete(operation: str, key: str) -> None:
            if operation == "delete" and "/dead-letter/" in key:
                raise StoreUnavailable("injected: the process died here")

        store.hooks.append(fail_dead_letter_delete)
        with pytest.raises(StoreUnavailable):
            await pq.redrive("t")
        store.hooks.clear()
        assert [d.id for d in await pq.dead_letters("t")] == [message_id]  # both exist now
        assert len(await pq.store.list("t/messages/")) == 1

        assert await pq.redrive("t") == 1
        assert await pq.dead_letters("t") == []
        [pending] = await pq.store.list("t/messages/")
        assert message_id in pending.key
        consumer = await pq.register_consumer("c2", topics=["t"])
        [again] = await poll_count(consumer, 1)
        assert again.id == message_id
        await again.ack()
        assert await consumer.poll() == []
