"""The signal log's body (docs/protocol.md, "Request rates"): a chain of versions naming
the topics changed lately, and what a watcher can tell from it; and how producers of several
processes write it."""

from __future__ import annotations

import asyncio

from pawn_queue._protocol import layout
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue._protocol.signal_log import (
    KEEP_SECONDS,
    MAX_CHANGES,
    MAX_NAMES,
    decode,
    next_version,
)
from pawn_queue.config import NotifyConfig
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from tests.helpers.faults import FaultyStore
from tests.helpers.support import latest_signal_log


def test_each_version_numbers_itself_and_keeps_one_entry_per_topic() -> None:
    first = next_version(None, {"a": None}, now=100.0)
    second = next_version(first, {"b": None}, now=101.0, busy=True)
    third = next_version(second, {"a": None}, now=102.0)
    assert [v.seq for v in (first, second, third)] == [1, 2, 3]
    assert [(c.seq, c.topic, c.busy) for c in third.changes] == [(2, "b", True), (3, "a", False)]
    assert third.kept_from == 1
    # A watcher that saw version 1 learns of b and of a's later change; one that saw 2, of a.
    assert [c.topic for c in third.after(1) or []] == ["b", "a"]
    assert [c.topic for c in third.after(2) or []] == ["a"]
    assert third.after(3) == []


def test_an_entry_names_its_objects_and_a_later_one_of_its_topic_keeps_them() -> None:
    """A watcher that missed version 1 sees a's entry of version 2 only: it must still name
    x, or the consumers that claim what is named, without listing, would never see it. One
    that saw version 1 gets y alone."""
    first = next_version(None, {"a": frozenset({"x"})}, now=1.0)
    second = next_version(first, {"a": frozenset({"y"}), "b": frozenset({"z"})}, now=2.0)
    entries = {c.topic: c for c in second.changes}
    assert entries["a"].named_after(0) == ["x", "y"]
    assert entries["a"].named_after(1) == ["y"]
    assert entries["b"].named_after(0) == ["z"]
    # A write without names (a lease given back): "list the topic" for whoever sees it.
    third = next_version(second, {"a": None}, now=3.0)
    [a] = [c for c in third.changes if c.topic == "a"]
    assert a.named_after(2) is None
    # Names again: complete only for a watcher that saw the unknown one.
    fourth = next_version(third, {"a": frozenset({"w"})}, now=4.0)
    [a] = [c for c in fourth.changes if c.topic == "a"]
    assert a.named_after(3) == ["w"] and a.named_after(2) is None


def test_an_entry_keeps_the_latest_names_and_says_from_when_they_are_complete() -> None:
    log = None
    for n in range(MAX_NAMES + 4):  # a busy topic: one object per version
        log = next_version(log, {"a": frozenset({f"m{n:02d}"})}, now=1.0 + n / 10)
    assert log is not None
    [a] = log.changes
    assert a.named_after(4) == [f"m{n:02d}" for n in range(4, MAX_NAMES + 4)]
    assert a.named_after(3) is None  # m03 was dropped: that watcher lists the topic
    assert a.named_after(log.seq - 1) == [f"m{MAX_NAMES + 3:02d}"]


def test_a_watcher_that_cannot_tell_is_told_so() -> None:
    old = next_version(None, {"a": None}, now=100.0)
    later = next_version(old, {"b": None}, now=100.0 + KEEP_SECONDS + 1)
    # a's entry went unseen by a watcher at version 0: it must list everything.
    assert [c.topic for c in later.changes] == ["b"] and later.kept_from == 2
    assert later.after(0) is None
    assert [c.topic for c in later.after(1) or []] == ["b"]
    assert later.after(None) is None  # saw nothing readable before
    assert old.after(5) is None  # the chain restarted (the ring deleted and written again)


def test_entries_past_the_cap_drop_the_oldest() -> None:
    first = next_version(None, {f"t{n}": None for n in range(MAX_CHANGES + 10)}, now=1.0)
    assert len(first.changes) == MAX_CHANGES
    assert first.after(0) is None  # 10 topics of version 1 were never named
    log = next_version(first, {"x": None}, now=1.0)
    assert len(log.changes) == MAX_CHANGES and log.changes[-1].topic == "x"
    # The entry dropped now was in version 1: a watcher that saw it needs only x.
    assert [c.topic for c in log.after(1) or []] == ["x"]


def test_the_body_round_trips_and_each_version_has_its_own_bytes() -> None:
    log = next_version(None, {"orders": frozenset({"k1", "k2"}), "billing.eu": None}, now=1.5)
    assert decode(log.encode()) == log
    # Equal logs, distinct bytes: an etag that is the content's MD5 still moves.
    assert log.encode() != log.encode()
    for legacy in (b"0123456789abcdef", b"0123456789abcdef+", b"", b"[]", b'{"format": 2}'):
        assert decode(legacy) is None


async def test_producers_of_two_processes_each_get_their_topic_named() -> None:
    """Two processes signal different topics at once: one write wins, the other reads the
    winner's version and writes its topic over it, so a watcher learns of both (not only of
    the winner's topic)."""
    store = MemoryStore()
    config = NotifyConfig(check_interval_seconds=0.05, signal_interval_seconds=0.05)
    one, two = ChangeSignals(store, config), ChangeSignals(store, config)
    watcher = ChangeSignals(store, config)
    watcher.watch(["a", "b", "c"])
    assert await watcher.refresh()
    try:
        seen = watcher.snapshot(["a", "b", "c"])
        one.published("a")
        two.published("b")
        await asyncio.gather(one.close(), two.close())
        log = await latest_signal_log(store)
        assert log is not None and {c.topic for c in log.changes} == {"a", "b"}
        for topic in ("a", "b"):
            assert await watcher.local.wait([topic], within=10, since={topic: seen[topic]})
        assert watcher.snapshot(["c"]) == {"c": seen["c"]}  # not named: not woken
    finally:
        await watcher.close()


async def test_a_lone_producer_signals_with_one_put_and_no_read() -> None:
    """While no other process writes signals, each is a PUT of the ring's next key, over
    what this process wrote there a lap before (create-only on the first lap): no GET, no
    HEAD after the first signal's look at the ring."""
    counting = CountingStore(MemoryStore())
    written = asyncio.Event()

    async def on_put(operation: str, key: str) -> None:
        if layout.is_notify_ring_key(key):
            written.set()

    config = NotifyConfig(check_interval_seconds=0.01, signal_interval_seconds=0.01)
    producer = ChangeSignals(FaultyStore(counting, observers=[on_put]), config)
    try:
        laps = layout.NOTIFY_RING_SIZE + 4
        for n in range(laps):
            written.clear()
            producer.published("t")
            await asyncio.wait_for(written.wait(), 10)
            counts = counting.reset()
            if n == 0:  # the first: the ring's keys read at once, none there; a create
                assert counts == {"GET": layout.NOTIFY_RING_SIZE, "PUT create": 1}, counts
            elif n < layout.NOTIFY_RING_SIZE:  # the rest of the first lap
                assert counts == {"PUT create": 1}, counts
            else:  # over the version a lap before
                assert counts == {"PUT if-match": 1}, (n, counts)
        log = await latest_signal_log(counting)
        assert log is not None and log.seq == laps
    finally:
        await producer.close()
