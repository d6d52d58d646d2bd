"""layout's queues: a topic's own, or a subscription's under ``{topic}/subscriptions/{name}/``;
every key of one is told apart from the other's (queue_of, split_queue, in_queue,
validate_queue, parse_pending_key)."""

from __future__ import annotations

import uuid

import pytest

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.exceptions import ConfigError

MESSAGE_ID = str(uuid.uuid4())
SUB = layout.subscription_queue("orders.eu", "billing")


def keys_of(queue: str) -> list[str]:
    now = now_utc()
    return [
        layout.topic_marker_key(queue),
        layout.message_key(queue, MESSAGE_ID, now),
        layout.message_key(queue, MESSAGE_ID, now, batch=True, delayed=True),
        layout.group_message_key(queue, MESSAGE_ID, now, "a/b"),
        layout.lease_key(queue, MESSAGE_ID),
        layout.lease_key(queue, "g" + layout.group_hash("a/b")),
        layout.dead_letter_key(queue, MESSAGE_ID),
    ]


def test_a_subscription_queue_lies_under_its_topic() -> None:
    assert SUB == "orders.eu/subscriptions/billing"
    assert layout.subscription_index_key("orders.eu") == "orders.eu/.subscriptions"
    assert layout.subscriptions_prefix("orders.eu") == "orders.eu/subscriptions/"
    assert layout.messages_prefix(SUB) == "orders.eu/subscriptions/billing/messages/"
    for key in keys_of(SUB):
        assert key.startswith(f"{SUB}/")
        assert layout.topic_of(key) == "orders.eu"  # the topic's subtree holds it all


@pytest.mark.parametrize("queue", ["orders.eu", SUB])
def test_queue_of_every_key_of_a_queue(queue: str) -> None:
    assert {layout.queue_of(key) for key in keys_of(queue)} == {queue}


def test_queue_of_the_topic_s_own_keys_and_index() -> None:
    assert layout.queue_of(layout.subscription_index_key("t")) == "t"
    assert layout.queue_of(layout.dedup_key("t", "x/y")) == "t"
    assert layout.queue_of(layout.registry_key("consumers", MESSAGE_ID)) == "_registry"


@pytest.mark.parametrize(
    ("topic", "name"),
    [
        ("t", "a"),
        ("subscriptions", "a"),  # a topic named like the folder
        ("t", "subscriptions"),  # a subscription named like the folder
        ("t", "messages"),  # ... or like a queue's folders
        ("t", "leases"),
        ("t", "dead-letter"),
        ("t", "a.b-c_d"),
        ("заказы", "注文"),
    ],
)
def test_names_that_look_like_folders_stay_apart(topic: str, name: str) -> None:
    queue = layout.subscription_queue(topic, name)
    assert layout.split_queue(queue) == (topic, name)
    assert layout.split_queue(topic) == (topic, None)
    assert layout.validate_queue(queue) == queue
    for key in keys_of(queue):
        assert layout.queue_of(key) == queue, key
    for key in keys_of(topic):
        assert layout.queue_of(key) == topic, key
    message = layout.message_key(queue, MESSAGE_ID, now_utc())
    assert layout.parse_pending_key(message) == layout.PendingKey(MESSAGE_ID, "message")
    own = layout.message_key(topic, MESSAGE_ID, now_utc())
    assert layout.parse_pending_key(own) == layout.PendingKey(MESSAGE_ID, "message")


def test_in_queue_moves_a_key_between_queues_keeping_its_name() -> None:
    now = now_utc()
    own = layout.message_key("t", MESSAGE_ID, now)
    copy = layout.in_queue(own, layout.subscription_queue("t", "a"))
    assert copy == layout.message_key(layout.subscription_queue("t", "a"), MESSAGE_ID, now)
    assert layout.in_queue(copy, "t") == own
    other = layout.in_queue(copy, layout.subscription_queue("t", "b"))
    assert other == layout.message_key(layout.subscription_queue("t", "b"), MESSAGE_ID, now)
    assert layout.in_queue(own, "t") == own
    group = layout.group_message_key("t", MESSAGE_ID, now, "g", delayed=True)
    moved = layout.in_queue(group, SUB)
    assert moved == layout.group_message_key(SUB, MESSAGE_ID, now, "g", delayed=True)
    assert layout.is_delayed_key(moved) and layout.due_from_key(moved) == layout.due_from_key(group)


def test_parse_pending_key_of_subscription_messages() -> None:
    now = now_utc()
    assert layout.parse_pending_key(layout.message_key(SUB, MESSAGE_ID, now)) == (
        layout.PendingKey(MESSAGE_ID, "message")
    )
    assert layout.parse_pending_key(
        layout.message_key(SUB, MESSAGE_ID, now, batch=True, delayed=True)
    ) == layout.PendingKey(MESSAGE_ID, "batch")
    parsed = layout.parse_pending_key(layout.group_message_key(SUB, MESSAGE_ID, now, "g"))
    assert parsed == layout.PendingKey(MESSAGE_ID, "group", layout.group_hash("g"))
    assert parsed.lease_id() == "g" + layout.group_hash("g")


def test_keys_that_are_not_a_queue_s_messages_are_not_parsed() -> None:
    now = now_utc()
    name = layout.message_key("t", MESSAGE_ID, now).rsplit("/", 1)[-1]
    not_messages = [
        # Nested deeper under a queue's messages/ (listings return those too).
        f"{SUB}/messages/x/{name}",
        f"{SUB}/messages/subscriptions/a/messages/{name}",
        f"t/messages/x/{name}",
        f"t/messages/subscriptions/a/{name}",
        # A subscription's own message, seen from the topic's messages/ folder.
        f"t/messages/{SUB}/messages/{name}",
        # Not under messages/ at all.
        f"{SUB}/{name}",
        f"{SUB}/leases/{name}",
        f"{SUB}/dead-letter/{name}",
        f"t/subscriptions/{name}",
        f"t/subscriptions/a/b/messages/{name}",
        f"t/subscriptions/messages/{name}",
        f"/messages/{name}",
        f"messages/{name}",
        layout.subscription_index_key("t"),
        layout.topic_marker_key(SUB),
    ]
    for key in not_messages:
        assert layout.parse_pending_key(key) is None, key


def test_split_queue_and_validate_queue() -> None:
    assert layout.split_queue("t") == ("t", None)
    assert layout.split_queue("t/subscriptions/a") == ("t", "a")
    assert layout.validate_queue("t") == "t"
    assert layout.validate_queue("t/subscriptions/a") == "t/subscriptions/a"


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("t/subscriptions/", "subscription name must not be empty"),
        ("t/subscriptions/a/b", "subscription name 'a/b' is invalid"),
        ("t/subscriptions/_a", "subscription name '_a' starts with '_'"),
        ("/subscriptions/a", "topic name must not be empty"),
        ("_t/subscriptions/a", "topic name '_t' starts with '_'"),
        ("t/other/a", "topic name 't/other/a' is invalid"),
        ("t/subscriptions", "topic name 't/subscriptions' is invalid"),
        ("a b/subscriptions/c", "topic name 'a b' is invalid"),
        (7, "topic name must be a string, got int 7"),
        (None, "topic name must be a string, got NoneType None"),
    ],
)
def test_validate_queue_refuses(queue: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        layout.validate_queue(queue)
    assert str(caught.value).startswith(message), str(caught.value)
