"""Every kind of key that layout.py builds appears in docs/protocol.md's bucket layout."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from pawn_queue._protocol import layout

PROTOCOL = Path(__file__).parents[2] / "docs" / "protocol.md"
ID = "0b7e5a52-2d1c-4c39-9a62-6d2f2d0e5a11"
AT = datetime(2026, 11, 27, 5, 30, tzinfo=UTC)
SUBSCRIPTION = layout.subscription_queue("orders", "billing")

# One key of each kind, named by the function that builds it (and a variant after a space).
EXAMPLES = {
    "topic_marker_key": layout.topic_marker_key("orders"),
    "message_key": layout.message_key("orders", ID, AT),
    "message_key delayed": layout.message_key("orders", ID, AT, delayed=True),
    "message_key batch": layout.message_key("orders", ID, AT, batch=True),
    "message_key priority": layout.message_key("orders", ID, AT, priority=9),
    "message_key priority delayed": layout.message_key("orders", ID, AT, delayed=True, priority=1),
    "group_message_key": layout.group_message_key("orders", ID, AT, "customer-7"),
    "lease_key": layout.lease_key("orders", ID),
    "lease_key group": layout.lease_key("orders", f"g{layout.group_hash('customer-7')}"),
    "dead_letter_key": layout.dead_letter_key("orders", ID),
    "dedup_key": layout.dedup_key("orders", "order-42"),
    "registry_key": layout.registry_key("consumers", ID),
    "registry_name_key": layout.registry_name_key("producers", "order-service"),
    "instance_key": layout.instance_key(ID),
    "probe_key": layout.probe_key(ID),
    "notify_ring_key": layout.notify_ring_key(19),
    "notify_slot_key": layout.notify_slot_key("orders"),
    "notify_slot_key root": layout.NOTIFY_ROOT,
    "spark_manifest_key": layout.spark_manifest_key("revenue", 7),
    "spark_sink_key": layout.spark_sink_key("revenue", 7),
    "subscription_index_key": layout.subscription_index_key("orders"),
    "schedule_key": layout.schedule_key("nightly-report"),
    "schedule_tick_key": layout.schedule_tick_key("nightly-report", AT),
    "limit_slot_key": layout.limit_slot_key("partner-api", 2),
    "rate_chunk_key": layout.rate_chunk_key("partner-api", 7),
    "pause_key": layout.pause_key(layout.subscriber_limit_name(["orders"], None)),
    "limit_slot_key subscriber": layout.limit_slot_key(
        layout.subscriber_limit_name(["orders"], None), 0
    ),
    "limit_slot_key subscription": layout.limit_slot_key(
        layout.subscriber_limit_name(["orders"], "billing"), 0
    ),
    "topic_marker_key subscription": layout.topic_marker_key(SUBSCRIPTION),
    "message_key subscription": layout.message_key(SUBSCRIPTION, ID, AT, batch=True),
    "lease_key subscription": layout.lease_key(SUBSCRIPTION, ID),
    "dead_letter_key subscription": layout.dead_letter_key(SUBSCRIPTION, ID),
    "message_key replay log": layout.message_key(layout.retained_log("orders"), ID, AT),
    "replayed_key": layout.replayed_key(
        layout.message_key(layout.retained_log("orders"), ID, AT),
        SUBSCRIPTION,
        AT,
        delayed=False,
        object_id=ID,
    ),
}


def layout_patterns() -> list[re.Pattern[str]]:
    """The first column of the layout block, each placeholder ``{...}`` as a key segment
    part, ``{a|b}`` as either, ``{000..999}`` as three digits."""
    block = PROTOCOL.read_text().split("## Bucket layout", 1)[1].split("```")[1]
    patterns = []
    for line in block.strip().splitlines():
        column = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        regex = ""
        for literal, placeholder in re.findall(r"([^{]*)(\{[^}]*\})?", column):
            regex += re.escape(literal)
            inner = placeholder[1:-1]
            if "|" in inner:
                regex += "(?:" + "|".join(map(re.escape, inner.split("|"))) + ")"
            elif inner == "000..999":
                regex += "[0-9]{3}"
            elif inner:
                regex += "[^/]+"
        patterns.append(re.compile(regex))
    return patterns


def test_every_key_builder_has_an_example() -> None:
    builders = {
        name
        for name, value in vars(layout).items()
        if name.endswith("_key")
        and callable(value)
        # Those that read a key rather than build one:
        and not name.startswith(("_", "parse_", "is_", "due_from_", "topic_from_"))
    }
    assert builders == {name.split()[0] for name in EXAMPLES}


def test_every_kind_of_key_is_in_the_protocols_layout_table() -> None:
    patterns = layout_patterns()
    missing = [
        (name, key)
        for name, key in EXAMPLES.items()
        if not any(pattern.fullmatch(key) for pattern in patterns)
    ]
    assert missing == []
