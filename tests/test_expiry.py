"""Messages with their own deadline (``publish(expires_in=...)``): never handed to a
consumer after it, removed or dead-lettered as the topic's ``retention_action`` says, and
seen by observers (and so by metrics) as ``expired``.

The consumer's queue runs on a clock set ahead of the producer's: the messages are past
their deadline for it without the test waiting for them to be."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pawn_queue import ArgumentError, Message, PawnQueue, RateLimited
from pawn_queue.config import load_config
from pawn_queue.observe import Observer, Outcome
from pawn_queue.sync import PawnQueue as BlockingPawnQueue
from tests.helpers.support import keys_under, poll_count


class Settlements(Observer):
    def __init__(self) -> None:
        self.outcomes: dict[str, tuple[Outcome, str | None]] = {}

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.outcomes[message.id] = (outcome, reason)


class Ahead:
    """A clock ``seconds`` ahead of the wall clock (changed by the test)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.seconds)


@pytest.fixture
async def queues(
    queue_config: dict[str, Any],
) -> AsyncIterator[tuple[PawnQueue, PawnQueue, Ahead, Settlements]]:
    """A producer's queue on the wall clock, a consumer's on a clock the test moves."""
    clock, settlements = Ahead(), Settlements()
    async with (
        await PawnQueue.from_config(queue_config) as producing,
        PawnQueue(load_config(queue_config), clock=clock, observers=[settlements]) as consuming,
    ):
        yield producing, consuming, clock, settlements


async def drain(consuming: PawnQueue, topic: str = "t") -> list[Message]:
    consumer = await consuming.register_consumer("c", topics=[topic])
    received = []
    while messages := await consumer.poll():
        received += messages
    return received


async def test_a_message_past_its_expiry_is_removed_undelivered(
    queues: tuple[PawnQueue, PawnQueue, Ahead, Settlements],
) -> None:
    producing, consuming, clock, settlements = queues
    await producing.create_topic("t")
    producer = await producing.register_producer("p")
    short = await producer.publish("t", "short", expires_in=1)
    long = await producer.publish("t", "long", expires_in=60)
    forever = await producer.publish("t", "forever")
    clock.seconds = 5
    received = await drain(consuming)
    assert sorted(m.id for m in received) == sorted([long, forever])
    assert {m.id: m.expires_at is None for m in received} == {long: False, forever: True}
    assert settlements.outcomes[short] == ("expired", None)
    await asyncio.gather(*(m.ack() for m in received))
    assert await keys_under(producing, "t/messages/") == []
    assert await producing.dead_letters("t") == []


async def test_an_expired_message_is_dead_lettered_where_the_topic_says_so(
    queues: tuple[PawnQueue, PawnQueue, Ahead, Settlements],
) -> None:
    producing, consuming, clock, settlements = queues
    await producing.create_topic("t", retention_action="dead_letter")
    producer = await producing.register_producer("p")
    published = await producer.publish("t", {"n": 1}, expires_in=2, attributes={"k": "v"})
    clock.seconds = 5
    assert await drain(consuming) == []
    [letter] = await producing.dead_letters("t")
    assert (letter.id, letter.reason, letter.payload) == (published, "expired", {"n": 1})
    assert settlements.outcomes[published] == ("dead_letter", "expired")


async def test_members_of_one_object_expire_each_by_its_own_deadline(
    queues: tuple[PawnQueue, PawnQueue, Ahead, Settlements],
) -> None:
    """A batch's members share a deadline; group commit packs messages of several publishes
    (some with a deadline, some without) into one object: each member is judged alone."""
    producing, consuming, clock, settlements = queues
    await producing.create_topic("t")
    producer = await producing.register_producer("p")
    batch = await producer.publish_batch("t", [1, 2, 3], expires_in=1)
    together = await asyncio.gather(
        *(producer.publish("t", n, expires_in=1 if n % 2 else None) for n in range(10))
    )
    clock.seconds = 5
    received = await drain(consuming)
    assert sorted(m.payload for m in received) == [0, 2, 4, 6, 8]
    expired = [*batch, *(mid for n, mid in enumerate(together) if n % 2)]
    assert {settlements.outcomes[mid] for mid in expired} == {("expired", None)}
    await asyncio.gather(*(m.ack() for m in received))
    assert await keys_under(producing, "t/messages/") == []


async def test_a_retry_does_not_revive_an_expired_message(
    queues: tuple[PawnQueue, PawnQueue, Ahead, Settlements],
) -> None:
    producing, consuming, clock, settlements = queues
    await producing.create_topic("t")
    published = await (await producing.register_producer("p")).publish("t", 1, expires_in=10)
    consumer = await consuming.register_consumer("c", topics=["t"])
    [message] = await poll_count(consumer, 1)
    await message.nack(requeue=True)
    clock.seconds = 20
    assert await drain(consuming) == []
    assert settlements.outcomes[published] == ("expired", None)


@pytest.mark.parametrize("batch", [None, 10])
async def test_messages_that_expire_while_their_subscriber_is_paused_are_never_handled(
    queue_config: dict[str, Any], batch: int | None
) -> None:
    """On the wall clock: a handler pauses its subscriber for 5 s (``RateLimited``, as an
    upstream's 429 does); 20 messages with ``expires_in=1`` published meanwhile are never
    handled and are all counted as expired, while one with no expiry published after them
    is handled once the pause is over. The same with a batch handler."""
    put_back, twenty = asyncio.Event(), asyncio.Event()

    class Expiries(Settlements):
        def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
            super().settled(message, outcome, reason)
            if outcome == "nack_requeue":  # the paused one, once the pause is in effect
                put_back.set()
            if sum(o == ("expired", None) for o in self.outcomes.values()) == 20:
                twenty.set()

    settlements = Expiries()
    handled: list[object] = []
    both = asyncio.Event()  # the paused one and the last are handled, in either order

    async def handle(message: Message) -> None:
        if message.payload == "pause" and not put_back.is_set():
            raise RateLimited(retry_after=5)  # comes back after the pause, uncounted
        handled.append(message.payload)
        await message.ack()
        if {"pause", "last"} <= set(map(str, handled)):
            both.set()

    async def handle_batch(messages: list[Message]) -> None:
        if any(m.payload == "pause" for m in messages) and not put_back.is_set():
            raise RateLimited(retry_after=5)
        for message in messages:
            await handle(message)

    async with PawnQueue(load_config(queue_config), observers=[settlements]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", "pause")
        consumer = await pq.register_consumer("c", ["t"])
        listening = consumer.listen(handle_batch, batch=batch) if batch else consumer.listen(handle)
        listener = asyncio.create_task(listening)
        try:
            async with asyncio.timeout(60):
                await put_back.wait()
                short = [await producer.publish("t", n, expires_in=1) for n in range(20)]
                await producer.publish("t", "last")
                await both.wait()
                await twenty.wait()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
    assert sorted(map(str, handled)) == ["last", "pause"]
    assert {settlements.outcomes[mid] for mid in short} == {("expired", None)}


async def test_expires_in_is_checked_against_the_delay() -> None:
    async with PawnQueue.from_url("memory://") as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        for delay in (5, 6):
            with pytest.raises(ArgumentError, match="shorter than expires_in"):
                await producer.publish("t", 1, delay=delay, expires_in=5)
        with pytest.raises(ArgumentError, match="expires_in"):
            await producer.publish_batch("t", [1], expires_in=0)
        assert await keys_under(pq, "t/messages/") == []
        await producer.publish("t", 1, delay=4, expires_in=5)


def test_the_blocking_api_publishes_with_an_expiry() -> None:
    with BlockingPawnQueue.from_url("memory://") as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        before = datetime.now(UTC)
        producer.publish("t", 1, expires_in=30)
        producer.publish_batch("t", [2], expires_in=30)
        messages = pq.register_consumer("c", topics=["t"]).poll()
        assert len(messages) == 2
        for message in messages:
            assert message.expires_at is not None
            deadline = datetime.fromisoformat(message.expires_at)
            assert (
                before + timedelta(seconds=30)
                <= deadline
                <= datetime.now(UTC) + timedelta(seconds=30)
            )


async def test_metrics_count_expired_messages_apart_from_dead_letters() -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")
    from prometheus_client import CollectorRegistry

    from pawn_queue.metrics import QueueMetrics

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    clock = Ahead()
    config = load_config({"backend": "memory", "memory": {"name": "expiry-metrics"}})
    async with (
        PawnQueue(config) as producing,
        PawnQueue(config, clock=clock, observers=[metrics.observer]) as consuming,
    ):
        await producing.create_topic("t")
        producer = await producing.register_producer("p")
        await producer.publish_batch("t", [1, 2], expires_in=1)
        await producer.publish("t", 3, expires_in=1)
        clock.seconds = 5
        assert await drain(consuming) == []

    def sample(name: str) -> float:
        return registry.get_sample_value(name, {"topic": "t"}) or 0.0

    assert sample("pawnqueue_messages_expired_total") == 3
    assert sample("pawnqueue_messages_dead_lettered_total") == 0
