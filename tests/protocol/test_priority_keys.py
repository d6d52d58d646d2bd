"""Priority bands in message keys (docs/protocol.md, rule 18): the names, a scan that meets a
band's key beyond every due time, and replay (whose log keeps no band)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.scanning import scan_page
from pawn_queue.config import load_config
from pawn_queue.consumer import Consumer
from pawn_queue.exceptions import ReplayUnavailableError
from pawn_queue.store.base import ObjectMeta

ID = "0b7e5a52-2d1c-4c39-9a62-6d2f2d0e5a11"
AT = datetime(2026, 11, 27, 5, 30, tzinfo=UTC)


def meta(key: str) -> ObjectMeta:
    return ObjectMeta(key=key, size=1, etag="e", last_modified=AT)


def test_priority_zero_keys_are_unchanged_and_bands_sort_first_highest_first() -> None:
    plain = layout.message_key("t", ID, AT)
    assert plain == f"t/messages/20261127T053000_000000-{ID}.json"
    assert layout.message_key("t", ID, AT, priority=0) == plain
    keys = {p: layout.message_key("t", ID, AT + timedelta(hours=p), priority=p) for p in range(10)}
    assert sorted(keys.values()) == [keys[p] for p in range(9, -1, -1)]
    assert keys[9] == f"t/messages/!020261127T143000_000000-{ID}.json"
    for priority, key in keys.items():
        assert layout.priority_of(key) == priority
        assert layout.due_from_key(key) == AT + timedelta(hours=priority)
        assert layout.parse_pending_key(key) == layout.PendingKey(ID, "message")
    delayed = layout.message_key("t", ID, AT, delayed=True, priority=4)
    assert layout.is_delayed_key(delayed) and layout.due_from_key(delayed) == AT
    batch = layout.message_key("t", ID, AT, batch=True, priority=2)
    assert layout.parse_pending_key(batch) == layout.PendingKey(ID, "batch")
    # A group's message has no band (the order inside a group wins).
    assert layout.priority_of(layout.group_message_key("t", ID, AT, "g")) == 0


def test_the_replay_log_keeps_publish_order_and_a_replayed_copy_its_band() -> None:
    key = layout.message_key("t", ID, AT, priority=7)
    logged = layout.in_queue(key, layout.retained_log("t"))
    assert logged == layout.message_key(layout.retained_log("t"), ID, AT)  # no band
    assert layout.in_queue(key, "t/subscriptions/s") == f"t/subscriptions/s/{key[2:]}"
    sub = layout.subscription_queue("t", "s")
    copy = layout.replayed_key(logged, sub, AT, delayed=False, object_id=ID, priority=7)
    assert copy == layout.message_key(sub, ID, AT, priority=7)
    group = layout.group_message_key(layout.retained_log("t"), ID, AT, "g")
    assert not layout.priority_of(
        layout.replayed_key(group, sub, AT, delayed=False, object_id=ID, priority=7)
    )


def test_band_cursors() -> None:
    since = AT + timedelta(minutes=1)
    old = layout.message_key("t", ID, AT, priority=3)
    new = layout.message_key("t", ID, since + timedelta(seconds=1), priority=3)
    lower = layout.message_key("t", ID, AT, priority=2)
    start = layout.band_from(old, since)
    assert old < start < new < lower
    after = layout.after_band(old)
    assert after is not None and new < after < lower
    assert layout.after_band(layout.message_key("t", ID, AT)) is None
    # From ``since`` on in the highest band: the lower bands follow, whole.
    cursor = layout.messages_from("t", since)
    assert layout.message_key("t", ID, AT, priority=9) < cursor
    assert cursor < layout.message_key("t", ID, since, priority=9) < lower


def test_a_band_key_past_every_due_time_ends_its_band_not_the_listing() -> None:
    """A producer whose clock runs ahead published priority 7: the rest of that band is
    skipped, the lower bands and priority 0 are still found (one LIST: no paging past it)."""
    margin = timedelta(seconds=2)
    ahead = layout.message_key("t", ID, AT + timedelta(minutes=5), priority=7)
    same_band = layout.message_key("t", ID.replace("0", "1"), AT + timedelta(minutes=6), priority=7)
    lower = layout.message_key("t", ID.replace("0", "2"), AT, priority=3)
    plain = layout.message_key("t", ID.replace("0", "3"), AT)
    page = [meta(k) for k in sorted([ahead, same_band, lower, plain])]
    scanned = scan_page(page, AT, margin, set())
    assert [m.key for _, m in scanned.found] == [lower, plain]
    assert not scanned.ends and scanned.next_due == AT + timedelta(minutes=5) - margin
    # A page that ends inside the skipped band goes on past the band, not key by key.
    first = scan_page(page[:2], AT, margin, set())
    assert first.found == [] and first.next_start(page[:2]) == layout.after_band(ahead)
    # Priority 0's band is last: a key beyond every due time there ends the listing.
    late = layout.message_key("t", ID, AT + timedelta(minutes=5))
    assert scan_page([meta(plain), meta(late)], AT, margin, set()).ends


async def drain(consumer: Consumer) -> list[tuple[object, int]]:
    got: list[tuple[object, int]] = []
    while messages := await consumer.poll(wait=1.0):
        for message in messages:
            got.append((message.payload, message.priority))
            await message.ack()
    return got


@pytest.mark.usefixtures("quick_subscription_changes")
async def test_seek_redelivers_with_the_priorities(pq: PawnQueue) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    await producer.publish("t", "before", priority=9)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.01)
    for n, priority in enumerate([0, 6, 0, 6]):
        await producer.publish("t", n, priority=priority)
    await producer.publish_batch("t", ["b0", "b1"], priority=8)
    consumer = await pq.register_consumer("c", ["t"], subscription="s")
    assert len(await drain(consumer)) == 7
    logged = await pq.store.list(layout.messages_prefix(layout.retained_log("t")))
    assert {layout.priority_of(m.key) for m in logged} == {0}  # the log: publish order
    await pq.seek("t", "s", middle)
    assert await drain(consumer) == [("b0", 8), ("b1", 8), (1, 6), (3, 6), (0, 0), (2, 0)]


@pytest.mark.usefixtures("quick_subscription_changes")
async def test_seek_sees_a_priority_message_the_log_cannot_bring_back(pq: PawnQueue) -> None:
    """The subscription holds a priority message published before the topic kept a replay
    log: seeking to a time before it would drop it, and is refused (its band is looked at
    from that time on too, not only priority 0's)."""
    await pq.create_topic("t")
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    since = datetime.now(UTC)
    await asyncio.sleep(0.01)
    await producer.publish("t", "urgent", priority=5)
    await pq.update_topic("t", replay_window_seconds=3600)
    await asyncio.sleep(0.01)
    await producer.publish("t", "later")
    with pytest.raises(ReplayUnavailableError, match="holds 1 message published before"):
        await pq.seek("t", "s", since)


async def test_a_producer_clock_ahead_does_not_hide_priority_zero(
    queue_config: dict[str, object],
) -> None:
    ahead = datetime.now(UTC) + timedelta(minutes=10)
    async with PawnQueue(load_config(queue_config), clock=lambda: ahead) as early:
        await early.create_topic("t")
        await (await early.register_producer("ahead")).publish("t", "ahead", priority=9)
    async with await PawnQueue.from_config(queue_config) as pq:
        await (await pq.register_producer("p")).publish("t", "now")
        consumer = await pq.register_consumer("c", ["t"])
        messages = await consumer.poll(wait=5)
        assert [m.payload for m in messages] == ["now"]


async def test_a_signal_naming_a_higher_priority_ends_what_a_listing_left(
    queue_config: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer works through what its last listing left (1 s, here long enough to never
    run out); a change signal from another process naming a message of a higher priority
    ends that: its next poll takes that message, not the next one the listing left."""
    monkeypatch.setattr("pawn_queue._protocol.claiming._REMEMBER_SECONDS", 60.0)
    polling = {**queue_config["polling"], "max_messages_per_poll": 1}  # type: ignore[dict-item]
    config = {**queue_config, "polling": polling}
    async with (
        await PawnQueue.from_config(config) as pq,
        await PawnQueue.from_config(config) as other,
    ):
        await pq.create_topic("t")
        producer = await other.register_producer("remote")
        for n in range(10):
            await producer.publish("t", n)
        consumer = await pq.register_consumer("c", ["t"])
        [first] = await consumer.poll(wait=5)
        await first.ack()
        [second] = await consumer.poll()  # from what the listing left: no LIST
        await second.ack()
        assert [first.payload, second.payload] == [0, 1]
        await producer.publish("t", "urgent", priority=9)
        signals = pq.runtime.signals
        async with asyncio.timeout(30):
            while signals.prioritised("t")[9] < 1:
                await signals.refresh()
                await asyncio.sleep(0.05)
        [third] = await consumer.poll()
        assert (third.payload, third.priority) == ("urgent", 9)
