"""The signal ring (docs/protocol.md, "Change signals"): versions of the signal log go round
16 keys, each written once a lap; watchers follow them, however far behind they fell."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from pawn_queue._protocol import layout
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue.config import NotifyConfig
from pawn_queue.store.memory import MemoryStore
from tests.helpers.faults import FaultyStore
from tests.helpers.limits import limited
from tests.helpers.support import latest_signal_log

FAST = NotifyConfig(check_interval_seconds=0.01, signal_interval_seconds=0.01)


async def signal_versions(producer: ChangeSignals, store: MemoryStore, topics: list[str]) -> int:
    """Have ``producer`` write a version per topic, one after the other; the last seq."""
    for topic in topics:
        before = await latest_signal_log(store)
        producer.published(topic)
        await producer.marked()
        after = await latest_signal_log(store)
        assert after is not None and (before is None or after.seq == before.seq + 1)
    log = await latest_signal_log(store)
    assert log is not None
    return log.seq


async def test_each_ring_key_holds_every_sixteenth_version() -> None:
    store = MemoryStore()
    writes: Counter[str] = Counter()

    async def count_writes(operation: str, key: str) -> None:
        if operation == "put":
            writes[key] += 1

    producer = ChangeSignals(FaultyStore(store, observers=[count_writes]), FAST)
    try:
        last = await signal_versions(producer, store, [f"t{n}" for n in range(40)])
    finally:
        await producer.close()
    assert last == 40
    assert set(writes) == {layout.notify_ring_key(n) for n in range(16)}
    # 40 versions over 16 keys: r01..r08 hold versions 1-8, 17-24 and 33-40 (three writes).
    assert sorted(writes.values()) == [2] * 8 + [3] * 8
    assert layout.NOTIFY_ROOT not in {meta.key for meta in await store.list(layout.NOTIFY)}


async def test_a_watch_that_missed_laps_wakes_every_topic_named_since() -> None:
    """A watcher that last looked 20 versions ago (over a lap) finds a version a lap on at
    the next key, which names every change of the last 10 s up to it, and reads on to the
    latest: it wakes exactly the topics changed since, in a few looks."""
    store = MemoryStore()
    producer, watcher = ChangeSignals(store, FAST), ChangeSignals(store, FAST)
    topics = [f"t{n}" for n in range(20)]
    watcher.watch([*topics, "quiet"])
    try:
        await watcher._look()  # the baseline
        seen = watcher.snapshot([*topics, "quiet"])
        last = await signal_versions(producer, store, topics)
        looks = 0
        while watcher._seq != last and looks < 10:
            assert await watcher._look()
            looks += 1
        assert looks <= 4  # version 17 (a lap on), then 18, 19 and 20
        now = watcher.snapshot([*topics, "quiet"])
        assert [t for t in topics if now[t] == seen[t]] == []  # every one woken
        assert now["quiet"] == seen["quiet"]  # and nothing else
    finally:
        await asyncio.gather(producer.close(), watcher.close())


@pytest.mark.alone  # looks against versions a fraction of a second apart: not on a loaded machine
async def test_a_watch_that_looks_seldom_reads_near_the_latest_version() -> None:
    """Versions every 0.05 s, a watch looking every 0.3 s (about 6 versions a look): each
    look reads where the latest likely is (one or two reads), so it keeps within a few
    versions of the latest, where reading the next key alone falls behind by 5 a look."""
    store = MemoryStore()
    reads: Counter[str] = Counter()

    async def count_reads(operation: str, key: str) -> None:
        if operation in ("head", "get") and layout.is_notify_ring_key(key):
            reads["ring"] += 1

    fast = NotifyConfig(check_interval_seconds=0.05, signal_interval_seconds=0.05)
    producer = ChangeSignals(store, fast)
    slow = NotifyConfig(check_interval_seconds=0.3, idle_check_interval_seconds=0.3)
    watcher = ChangeSignals(FaultyStore(store, hooks=[count_reads]), slow)
    watcher.watch(["t"])
    try:
        await watcher._look()
        reads.clear()
        behind: list[int] = []
        for _ in range(12):
            for _ in range(15):  # 0.3 s of publishes: about 6 versions
                producer.published("t")
                await asyncio.sleep(0.02)
            await watcher._look()
            log = await latest_signal_log(store)
            assert log is not None and watcher._seq is not None
            behind.append(log.seq - watcher._seq)
        # After the first looks taught it the rate: a few versions behind at most.
        assert max(behind[4:]) <= 10, behind  # the next key alone: 4, 8, 12, then a lap
        assert reads["ring"] <= 2 * 12, reads
    finally:
        await asyncio.gather(producer.close(), watcher.close())


async def test_a_ring_emptied_and_begun_again_is_followed() -> None:
    """Every ring key deleted (a bucket emptied under running processes) and a new chain
    begun: a watcher that had seen over a lap notices at its next look, wakes every topic
    (it cannot tell what changed), and follows the new chain from there."""
    store = MemoryStore()
    first, watcher = ChangeSignals(store, FAST), ChangeSignals(store, FAST)
    watcher.watch(["a", "b"])
    try:
        await watcher._look()
        await signal_versions(first, store, ["a"] * 20)
        for _ in range(10):
            if watcher._seq == 20:
                break
            await watcher._look()
        assert watcher._seq == 20
    finally:
        await first.close()
    for n in range(16):
        await store.delete(layout.notify_ring_key(n))
    second = ChangeSignals(store, FAST)
    try:
        await signal_versions(second, store, ["a", "a"])  # versions 1 and 2 of a new chain
        seen = watcher.snapshot(["a", "b"])
        await watcher._look()
        now = watcher.snapshot(["a", "b"])
        assert now["a"] > seen["a"] and now["b"] > seen["b"]  # both: it cannot tell
        assert watcher._seq == 2
        await signal_versions(second, store, ["b"])
        seen = watcher.snapshot(["a", "b"])
        await watcher._look()
        now = watcher.snapshot(["a", "b"])
        assert now == {"a": seen["a"], "b": seen["b"] + 1}
    finally:
        await asyncio.gather(second.close(), watcher.close())


async def test_writers_racing_for_a_version_under_a_per_key_limit_both_get_signalled() -> None:
    """Two processes write the same version at once where the store allows one write a
    second per key: the loser's write is refused for the rate (the winner wrote that key
    within the second); it backs off, reads the winner's version and writes the next one
    over it, and from then on writes at most a version a second (racing producers settle
    so: every version names every change, so nothing is signalled later for it)."""
    store, limit = limited(MemoryStore())
    one, two = ChangeSignals(store, NotifyConfig()), ChangeSignals(store, NotifyConfig())
    first = ChangeSignals(store, NotifyConfig())
    try:
        first.published("before")
        await first.marked()
        await asyncio.sleep(1.2)  # version 1 is over a second old: both may write over it
        assert await one.refresh() and await two.refresh()  # both know version 1
        one.published("a")
        two.published("b")
        await asyncio.gather(one.marked(), two.marked())
        # They raced: a write refused (twice, if the backoff's jitter came under a second).
        assert limit.refused["key"] >= 1
        log = await latest_signal_log(store)
        assert log is not None and log.seq == 3
        assert {c.topic for c in log.changes} == {"before", "a", "b"}
        # A refusal teaches every writer on the store refused (all three, here: one store).
        assert one._writer._limited and two._writer._limited and first._writer._limited
    finally:
        await asyncio.gather(first.close(), one.close(), two.close())
