"""Subscriptions through the blocking API (pawn_queue.sync) on every store: create, list,
read, consume, dead letters, update and delete, with the core's errors."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pawn_queue import (
    ArgumentError,
    Subscription,
    SubscriptionConflictError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from pawn_queue.sync import Consumer, PawnQueue

pytestmark = pytest.mark.usefixtures("quick_subscription_changes")  # all in this process


def poll_all(consumer: Consumer, count: int) -> list[Any]:
    """Poll until ``count`` messages came (each poll waits for a publish)."""
    messages: list[Any] = []
    for _ in range(20):
        messages += consumer.poll(wait=5)
        if len(messages) >= count:
            break
    return messages


def test_subscriptions_round_trip(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders")
        created: dict[str, Subscription] = {}

        def create(name: str, **options: Any) -> None:
            created[name] = pq.create_subscription("orders", name, **options)

        # Two threads share the queue: the two creations wait for the producers together.
        threads = [
            threading.Thread(
                target=create,
                args=("billing",),
                kwargs={"filter": {"region": ["eu", "uk"]}, "max_receive_count": 2},
            ),
            threading.Thread(target=create, args=("audit",)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        billing = created["billing"]
        assert (billing.topic, billing.name, billing.queue) == (
            "orders",
            "billing",
            "orders/subscriptions/billing",
        )
        assert billing.filter == {"region": ["eu", "uk"]}
        assert billing.settings.max_receive_count == 2
        assert created["audit"].filter is None
        assert [s.name for s in pq.list_subscriptions("orders")] == ["audit", "billing"]
        assert pq.subscription("orders", "billing") == billing

        producer = pq.register_producer("shop")
        eu = producer.publish("orders", {"n": 1}, attributes={"region": "eu"})
        us = producer.publish("orders", {"n": 2}, attributes={"region": "us"})
        billing_reader = pq.register_consumer("bill", ["orders"], subscription="billing")
        audit_reader = pq.register_consumer("audit", ["orders"], subscription="audit")
        assert (billing_reader.subscription, billing_reader.topics) == ("billing", ["orders"])
        assert audit_reader.subscription == "audit"
        assert pq.subscription_stats("orders", "billing").pending == 1
        assert pq.topic_stats("orders", subscription="audit").pending == 2
        assert pq.topic_stats("orders").pending == 0  # copies went to the subscriptions only

        audited = poll_all(audit_reader, 2)
        assert sorted(m.id for m in audited) == sorted([eu, us])
        for message in audited:
            assert (message.topic, message.subscription) == ("orders", "audit")
            message.ack()
        [billed] = poll_all(billing_reader, 1)
        assert (billed.id, billed.payload) == (eu, {"n": 1})
        billed.nack()  # a dead letter of billing only

        [letter] = pq.dead_letters("orders", subscription="billing")
        assert (letter.id, letter.topic, letter.subscription) == (eu, "orders", "billing")
        assert pq.dead_letters("orders") == []
        assert pq.dead_letters("orders", subscription="audit") == []
        found = pq.dead_letter("orders", eu, subscription="billing")
        assert found is not None and found.reason == "nack"
        assert pq.dead_letter("orders", eu) is None
        assert pq.redrive("orders", subscription="billing") == 1
        [again] = poll_all(billing_reader, 1)  # back in billing, not in the topic
        assert again.id == eu
        again.nack()
        assert pq.purge_dead_letters("orders", subscription="billing") == 1
        assert pq.subscription_stats("orders", "billing").dead_letter == 0

        updated = pq.update_subscription("orders", "billing", filter=None)
        assert updated.filter is None and updated.settings.max_receive_count == 2
        cleared = pq.update_subscription(
            "orders", "billing", max_receive_count=None, linger_seconds=0.01
        )
        assert cleared.filter is None and cleared.settings.max_receive_count is None
        assert cleared.linger_seconds == 0.01
        everything = producer.publish("orders", {"n": 3})  # no attributes: taken now
        [taken] = poll_all(billing_reader, 1)
        assert taken.id == everything
        taken.ack()

        pq.delete_subscription("orders", "audit")
        assert [s.name for s in pq.list_subscriptions("orders")] == ["billing"]
        with pytest.raises(SubscriptionNotFoundError, match="subscription 'audit'"):
            pq.subscription("orders", "audit")


def test_errors_keep_their_types(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders")
        with pytest.raises(TopicNotFoundError, match="topic 'nope'"):
            pq.create_subscription("nope", "billing")
        with pytest.raises(SubscriptionNotFoundError) as missing:
            pq.register_consumer("c", ["orders"], subscription="billing")
        assert isinstance(missing.value, TopicNotFoundError)  # one except clause takes both
        with pytest.raises(SubscriptionNotFoundError):
            pq.subscription_stats("orders", "billing")
        with pytest.raises(ArgumentError, match="filter"):
            pq.create_subscription("orders", "billing", filter={"region": 5})
        pq.create_subscription("orders", "billing", filter={"region": "eu"})
        with pytest.raises(SubscriptionConflictError) as conflict:
            pq.create_subscription("orders", "billing", filter={"region": "us"})
        assert set(conflict.value.differences) == {"filter"}
        assert pq.subscription("orders", "billing").filter == {"region": "eu"}


def test_replay_seek_peek_and_purge_of_a_subscription(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders", replay_window_seconds=3600)
        assert pq.topic_settings("orders").replay_window_seconds == 3600
        producer = pq.register_producer("shop")
        ids = [producer.publish("orders", {"n": n}) for n in range(2)]
        pq.create_subscription("orders", "late", start="earliest")
        assert [p.id for p in pq.peek("orders", subscription="late")] == ids
        assert pq.purge_topic("orders", subscription="late") == 2
        assert pq.peek("orders", subscription="late") == []
        pq.seek("orders", "late", "earliest")
        reader = pq.register_consumer("late-reader", ["orders"], subscription="late")
        assert sorted(m.id for m in poll_all(reader, 2)) == sorted(ids)
        with pytest.raises(ArgumentError):
            pq.seek("orders", "late", "yesterday")
