"""Topic administration on every store: create never changes settings, update changes them,
purge empties a topic, and dead letters are read oldest first or one at a time."""

from __future__ import annotations

import json
import math
import random
import uuid
from typing import Any

import pytest

from pawn_queue import (
    ConfigError,
    PawnQueue,
    PawnQueueError,
    TopicNotFoundError,
    TopicSettings,
    TopicSettingsConflictError,
)
from pawn_queue.config import load_config
from pawn_queue.exceptions import LeaseLostError
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from tests.helpers.faults import FaultyStore
from tests.helpers.storage import group_lease_key
from tests.helpers.support import keys_under, poll_count, settled


async def marker(pq: PawnQueue, topic: str) -> dict[str, Any]:
    return dict(json.loads((await pq.store.get(f"{topic}/.topic")).data))


# -- create_topic never changes stored settings ---------------------------------------------


# s3rver ignores create-only writes: create reads the marker first, or it would reset it.
@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3", "s3-s3rver"], indirect=True)
async def test_create_topic_without_settings_keeps_the_stored_ones(pq: PawnQueue) -> None:
    await pq.create_topic("orders", max_receive_count=3, max_pending=100)
    before = await marker(pq, "orders")
    await pq.create_topic("orders")  # what a service runs at every start
    after = await marker(pq, "orders")
    assert after == before
    assert after["settings"]["max_receive_count"] == 3
    assert after["settings"]["max_pending"] == 100


async def test_create_topic_with_other_settings_raises_and_writes_nothing(pq: PawnQueue) -> None:
    await pq.create_topic("t", max_receive_count=3, retention_seconds=60)
    before = (await pq.store.get("t/.topic")).data
    # The same settings (given as other number types too) are fine, like SQS CreateQueue.
    await pq.create_topic("t", max_receive_count=3)
    await pq.create_topic("t", retention_seconds=60.0, dedup_window_seconds=300, max_pending=None)
    with pytest.raises(TopicSettingsConflictError) as info:
        await pq.create_topic("t", max_receive_count=5, retention_seconds=60, max_pending=None)
    assert info.value.topic == "t"
    assert info.value.differences == {"max_receive_count": (3, 5)}  # only what was passed
    assert "max_receive_count is 3, asked 5" in str(info.value)
    assert "update_topic" in str(info.value)
    assert isinstance(info.value, PawnQueueError) and isinstance(info.value, ValueError)
    with pytest.raises(TopicSettingsConflictError) as cleared:
        await pq.create_topic("t", max_receive_count=None, retention_action="dead_letter")
    assert cleared.value.differences == {
        "max_receive_count": (3, None),
        "retention_action": ("delete", "dead_letter"),
    }
    assert (await pq.store.get("t/.topic")).data == before
    with pytest.raises(ConfigError):
        await pq.create_topic("t", max_pending=0)  # invalid: refused before any request


async def test_create_topic_defaults_show_as_the_documented_ones() -> None:
    import inspect

    signature = str(inspect.signature(PawnQueue.create_topic))
    assert "max_receive_count: 'int | NotGiven | None' = None" in signature
    assert "dedup_window_seconds: 'float | NotGiven' = 300.0" in signature
    assert "retention_action: 'str | NotGiven' = 'delete'" in signature


# -- update_topic ---------------------------------------------------------------------------


async def test_update_topic_changes_only_what_is_passed(pq: PawnQueue) -> None:
    await pq.create_topic("t", max_receive_count=3, max_pending=100)
    created_at = (await marker(pq, "t"))["created_at"]
    new = await pq.update_topic("t", max_pending=None, dedup_window_seconds=10)
    expected = TopicSettings(max_receive_count=3, max_pending=None, dedup_window_seconds=10)
    assert new == expected
    assert await pq.topic_settings("t") == expected
    stored = await marker(pq, "t")
    assert stored["created_at"] == created_at
    assert stored["settings"]["max_pending"] is None
    assert stored["settings"]["max_receive_count"] == 3
    await pq.create_topic("t", max_receive_count=3, dedup_window_seconds=10)  # now the same
    assert await pq.update_topic("t") == expected  # nothing passed: nothing changes
    with pytest.raises(ConfigError):
        await pq.update_topic("t", max_pending=-1)
    assert await pq.topic_settings("t") == expected
    with pytest.raises(TopicNotFoundError):
        await pq.update_topic("nope", max_pending=1)
    with pytest.raises(TopicNotFoundError):
        await pq.topic_settings("nope")


async def test_update_topic_applies_its_change_on_top_of_a_concurrent_one(
    queue_config: dict[str, Any],
) -> None:
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t", max_receive_count=3)
        raced = []

        async def rival_writes_first(operation: str, key: str) -> None:
            if operation == "put" and key == "t/.topic" and not raced:
                raced.append(key)
                body = await marker(pq, "t")
                body["settings"]["max_pending"] = 7
                await store.inner.put(key, json.dumps(body).encode())

        store.hooks.append(rival_writes_first)
        new = await pq.update_topic("t", retention_seconds=60)
        assert raced
        assert new == TopicSettings(max_receive_count=3, retention_seconds=60, max_pending=7)
        assert await pq.topic_settings("t") == new


# -- purge_topic ----------------------------------------------------------------------------


@pytest.fixture
def slow_refresh(queue_config: dict[str, Any]) -> dict[str, Any]:
    """Leases refreshed only when a test asks: what a holder sees after a purge is exact."""
    polling = dict(queue_config["polling"])
    polling.update(visibility_timeout_seconds=120.0, lease_refresh_interval_seconds=60.0)
    return {**queue_config, "polling": polling}


async def test_purge_topic_deletes_messages_and_their_leases(
    slow_refresh: dict[str, Any],
) -> None:
    async with await PawnQueue.from_config(slow_refresh) as pq:
        await pq.create_topic("t", claims="message")
        await pq.create_topic("other")
        producer = await pq.register_producer("p")
        for n in range(4):
            await producer.publish("t", n)
        await producer.publish("t", "later", delay=3600)
        await producer.publish_batch("t", ["b1", "b2", "b3"])
        await producer.publish("other", "kept")
        consumer = await pq.register_consumer("c", topics=["t"])
        held = await consumer.poll()
        assert len(held) == 7  # 4 messages and 3 batch members; the delayed one is not due
        await held[0].nack()
        await settled(pq)
        assert len(await keys_under(pq, "t/leases/")) == 4  # 3 messages and the batch
        # 3 messages, the delayed one and the batch object.
        assert await pq.purge_topic("t") == 5
        assert await keys_under(pq, "t/messages/") == []
        assert await keys_under(pq, "t/leases/") == []
        stats = await pq.topic_stats("t")
        assert (stats.pending, stats.in_flight, stats.delayed, stats.dead_letter) == (0, 0, 0, 1)
        assert await pq.list_topics() == ["other", "t"]
        assert await pq.purge_topic("t") == 0
        await producer.publish("t", "after")
        other = await pq.register_consumer("c2", topics=["t", "other"])
        got: list[tuple[str, Any]] = []
        while len(got) < 2:
            got += [(m.topic, m.payload) for m in await other.poll(wait=2)]
        assert sorted(got) == [("other", "kept"), ("t", "after")]
        with pytest.raises(TopicNotFoundError):
            await pq.purge_topic("nope")
        with pytest.raises(ConfigError):
            await pq.purge_topic("../x")


async def test_a_holder_of_a_purged_message(slow_refresh: dict[str, Any]) -> None:
    """What docs/protocol.md says of a consumer holding a message that a purge deleted."""
    async with await PawnQueue.from_config(slow_refresh) as pq:
        await pq.create_topic("t", claims="message")
        producer = await pq.register_producer("p")
        for n in range(3):
            await producer.publish("t", n)
        await producer.publish("t", "grouped", group="g")
        consumer = await pq.register_consumer("c", topics=["t"])
        acked, extended, nacked, grouped = await consumer.poll()
        assert grouped.group == "g"
        assert await pq.purge_topic("t") == 4
        # The group's lease stays: later messages of the group share it.
        assert await keys_under(pq, "t/leases/") == [group_lease_key("t", "g")]
        # Settled before the holder writes its lease again: the ack returns as usual.
        await acked.ack()
        await grouped.ack()
        # Writing the lease again (the background refresh, extend(), or an ack near expiry)
        # finds it gone: the lease is lost, and ack/nack raise LeaseLostError.
        with pytest.raises(LeaseLostError):
            await extended.extend(30)
        with pytest.raises(LeaseLostError):
            await extended.ack()
        assert not extended.settled and not extended.lease_held
        # A nack before that writes its dead letter: the purged message is kept there.
        await nacked.nack()
        assert [d.id for d in await pq.dead_letters("t")] == [nacked.id]
        await settled(pq)
        assert await keys_under(pq, "t/messages/") == []
        assert await keys_under(pq, "t/leases/") == []
        assert await (await pq.register_consumer("c2", topics=["t"])).poll() == []


# -- dead letters ---------------------------------------------------------------------------


async def _dead_letter_in_random_order(pq: PawnQueue, count: int) -> list[str]:
    """Publish ``count`` messages and nack them in a shuffled order; return that order."""
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    for n in range(count):
        await producer.publish("t", n)
    messages = await poll_count(await pq.register_consumer("c", topics=["t"]), count)
    assert len(messages) == count
    random.Random(7).shuffle(messages)
    for message in messages:
        await message.nack()
    return [m.id for m in messages]


async def test_dead_letters_are_listed_oldest_first(pq: PawnQueue) -> None:
    order = await _dead_letter_in_random_order(pq, 8)
    assert order != sorted(order)
    assert [d.id for d in await pq.dead_letters("t")] == order
    assert [d.id for d in await pq.dead_letters("t", limit=3)] == order[:3]
    assert await pq.dead_letters("t", limit=0) == []
    assert await pq.redrive("t", limit=2) == 2  # the oldest two
    assert [d.id for d in await pq.dead_letters("t")] == order[2:]


async def test_one_dead_letter_is_one_read(queue_config: dict[str, Any]) -> None:
    config = load_config(queue_config)
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        order = await _dead_letter_in_random_order(pq, 3)
        listed = {d.id: d for d in await pq.dead_letters("t")}
        await settled(pq)
        await pq.runtime.signals.close()  # else the watch the polls started may look meanwhile
        store.reset()
        letter = await pq.dead_letter("t", order[1])
        assert store.reset() == {"GET": 1}  # the topic's marker is cached
        assert letter == listed[order[1]]
        assert await pq.dead_letter("t", str(uuid.uuid4())) is None
        for not_an_id in ("nope", "../x", f"{order[0]}/../x", order[0].upper()):
            assert await pq.dead_letter("t", not_an_id) is None
        with pytest.raises(TopicNotFoundError):
            await pq.dead_letter("nope", order[0])


# -- the blocking API -----------------------------------------------------------------------


def test_blocking_api_forwards_topic_administration(queue_config: dict[str, Any]) -> None:
    from pawn_queue.sync import PawnQueue as BlockingQueue

    with BlockingQueue.from_config(queue_config) as pq:
        pq.create_topic("t", max_receive_count=3)
        pq.create_topic("t")
        assert pq.topic_settings("t") == TopicSettings(max_receive_count=3)
        with pytest.raises(TopicSettingsConflictError):
            pq.create_topic("t", max_receive_count=4)
        assert pq.update_topic("t", max_receive_count=None, max_pending=9) == TopicSettings(
            max_pending=9
        )
        producer = pq.register_producer("p")
        first = producer.publish("t", 1)
        producer.publish("t", 2)
        consumer = pq.register_consumer("c", topics=["t"])
        [message] = [m for m in consumer.poll() if m.id == first]
        message.nack()
        letter = pq.dead_letter("t", first)
        assert letter is not None and letter.payload == 1
        assert pq.purge_topic("t") == 1
        assert pq.topic_stats("t").pending == 0


@pytest.mark.parametrize(
    "settings",
    [
        {"retention_seconds": math.inf},
        {"retention_seconds": math.nan},
        {"dedup_window_seconds": math.inf},
        {"max_receive_count": True},
        {"max_receive_count": 2.5},
        {"max_pending": math.inf},
    ],
)
async def test_topic_settings_are_finite_numbers_of_the_right_type(
    pq: PawnQueue, settings: dict[str, Any]
) -> None:
    """retention_seconds=inf reached the marker's encoder ("payload is not JSON-serialisable")
    and max_receive_count=True was taken for 1."""
    [name] = settings
    await pq.create_topic("other")  # a local directory exists from its first write on
    with pytest.raises(ConfigError, match=f"^{name}: got"):
        await pq.create_topic("t", **settings)
    assert await pq.list_topics() == ["other"]
