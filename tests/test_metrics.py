"""Metrics (pawn_queue.metrics) fed by the core's observer hooks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pawn_queue import Message, PawnQueue
from pawn_queue.config import load_config
from pawn_queue.metrics import QueueMetrics
from pawn_queue.observe import Observer, Outcome


class DeadLetterCount(Observer):
    """Sets ``reached`` once ``target`` messages were dead-lettered."""

    def __init__(self, target: int) -> None:
        self.count, self.target, self.reached = 0, target, asyncio.Event()

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.count += outcome == "dead_letter"
        if self.count >= self.target:
            self.reached.set()


async def test_the_observer_counts_what_the_queue_does(queue_config: dict[str, Any]) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    dead = DeadLetterCount(3)
    observers = [metrics.observer, dead]
    async with PawnQueue(load_config(queue_config), observers=observers) as pq:
        await pq.create_topic("t", max_receive_count=1)
        producer = await pq.register_producer("p")
        await producer.publish("t", "ack")
        await producer.publish("t", "requeue")
        await producer.publish_batch("t", ["nack", "ack"])
        consumer = await pq.register_consumer("c", topics=["t"])
        polled = await consumer.poll(wait=5)
        assert sorted(m.payload for m in polled) == ["ack", "ack", "nack", "requeue"]
        for message in polled:
            if message.payload == "ack":
                await message.ack()
            elif message.payload == "nack":
                await message.nack()
            else:
                await message.nack(requeue=True)
        await producer.publish("t", "fail")
        failed = asyncio.Event()

        async def handler(message: Message) -> None:
            if message.payload == "fail":
                failed.set()
                raise ValueError("boom")

        task = asyncio.create_task(consumer.listen(handler))
        await asyncio.wait_for(failed.wait(), 10)

        # "requeue" is dead-lettered for max_receive_count when claimed again, "fail" by
        # its handler.
        await asyncio.wait_for(dead.reached.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("pawnqueue_messages_published_total", topic="t") == 5
    assert value("pawnqueue_messages_acked_total", topic="t") == 2
    assert value("pawnqueue_messages_nacked_total", topic="t", requeue="false") == 1
    assert value("pawnqueue_messages_nacked_total", topic="t", requeue="true") == 1
    # nack, fail (handler_error) and requeue (max_receive_count).
    assert value("pawnqueue_messages_dead_lettered_total", topic="t") == 3
    assert value("pawnqueue_handler_seconds_count", topic="t", outcome="error") == 1
    assert value("pawnqueue_messages_delivered_total", topic="t") == 5


async def test_a_quarantined_corrupt_object_counts_as_dead_lettered(
    queue_config: dict[str, Any],
) -> None:
    """An unreadable object never becomes a message; its move to dead letter still counts."""
    from prometheus_client import CollectorRegistry

    from pawn_queue import layout
    from pawn_queue.envelope import now_utc

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    async with PawnQueue(load_config(queue_config), observers=[metrics.observer]) as pq:
        await pq.create_topic("t")
        key = layout.message_key("t", "6f1c2d0e-8b7a-4c3e-9d5f-0a1b2c3d4e5f", now_utc())
        await pq.store.put(key, b"\xff not json")
        consumer = await pq.register_consumer("c", topics=["t"])
        assert await consumer.poll() == []
        [letter] = await pq.dead_letters("t")
        assert letter.reason == "corrupt"
    dead = registry.get_sample_value("pawnqueue_messages_dead_lettered_total", {"topic": "t"})
    assert dead == 1
