"""layout.topic_of: the one way to tell the topic a key belongs to."""

from __future__ import annotations

import uuid

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc


def test_topic_of_every_key_of_a_topic() -> None:
    message_id = str(uuid.uuid4())
    now = now_utc()
    keys = [
        layout.topic_marker_key("orders.eu"),
        layout.message_key("orders.eu", message_id, now),
        layout.message_key("orders.eu", message_id, now, batch=True, delayed=True),
        layout.group_message_key("orders.eu", message_id, now, "a/b"),
        layout.lease_key("orders.eu", message_id),
        layout.dead_letter_key("orders.eu", message_id),
        layout.dedup_key("orders.eu", "x/y"),
    ]
    assert {layout.topic_of(key) for key in keys} == {"orders.eu"}
    assert layout.topic_of(layout.registry_key("consumers", message_id)) == "_registry"
