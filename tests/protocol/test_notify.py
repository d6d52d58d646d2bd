"""Change signals (vnotify): idle consumers wake on a publish from another process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pawn_queue import Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreError
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from tests.helpers.faults import FaultyStore
from tests.helpers.support import acking, latest_signal_log


def slow_backfill(queue_config: dict[str, Any]) -> dict[str, Any]:
    """A full poll only every 60 s: anything faster must come from a change signal."""
    queue_config["polling"]["interval_seconds"] = 60
    queue_config["notify"] = {
        **queue_config.get("notify", {}),
        "check_interval_seconds": 0.05,
        "backfill_interval_seconds": 60,
    }
    return queue_config


async def test_listener_wakes_on_publish_from_another_instance(
    queue_config: dict[str, Any],
) -> None:
    config = slow_backfill(queue_config)
    async with (
        await PawnQueue.from_config(config) as producer_side,
        await PawnQueue.from_config(config) as consumer_side,
    ):
        await producer_side.create_topic("t")
        producer = await producer_side.register_producer("p")
        consumer = await consumer_side.register_consumer("c", topics=["t"])
        async with acking(consumer) as received:
            for _ in range(3):
                mid = await producer.publish("t", {"x": 1})
                assert await asyncio.wait_for(received.get(), 10) == mid


async def test_poll_wait_returns_when_a_message_arrives(queue_config: dict[str, Any]) -> None:
    config = slow_backfill(queue_config)
    async with (
        await PawnQueue.from_config(config) as producer_side,
        await PawnQueue.from_config(config) as consumer_side,
    ):
        await producer_side.create_topic("t")
        producer = await producer_side.register_producer("p")
        consumer = await consumer_side.register_consumer("c", topics=["t"])
        assert await consumer.poll(wait=0.2) == []
        waiting = asyncio.create_task(consumer.poll(wait=30))
        mid = await producer.publish("t", {"x": 1})
        messages = await asyncio.wait_for(waiting, 10)
        assert [m.id for m in messages] == [mid]


async def test_idle_listener_costs_one_head_per_check(queue_config: dict[str, Any]) -> None:
    config = load_config(slow_backfill(queue_config))
    counting = CountingStore(open_store(config))
    heads = asyncio.Event()
    seen_heads = 0

    async def count_heads(operation: str, key: str) -> None:
        nonlocal seen_heads
        if operation == "head" and layout.is_notify_ring_key(key):
            seen_heads += 1
            if seen_heads >= 20:
                heads.set()

    observed = FaultyStore(counting, hooks=[count_heads])
    async with PawnQueue(config, store=observed) as pq:
        for n in range(10):
            await pq.create_topic(f"topic-{n}")
        consumer = await pq.register_consumer("idle", topics=[f"topic-{n}" for n in range(10)])
        counting.reset()
        task = asyncio.create_task(consumer.listen(lambda m: m.ack()))
        await asyncio.wait_for(heads.wait(), 20)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        counts = counting.reset()
    # To start: a look at the signals (the ring's 16 keys read at once, none there yet, and
    # a HEAD of 0.2.0's root), then a listing of each of the 10 topics: the look came first,
    # so nothing can land unseen in between. Then a HEAD per check: of the ring's next key,
    # and every tenth check of 0.2.0's root too. Besides: the process record written as the
    # listener starts and ends (a PUT each), the change signal each writes for the other
    # processes (`_listeners`: versions 1 and 2, each a ring key created), seen by the watch
    # with its HEAD alone (versions written here: their etags are known), and the records
    # read for the shares (a LIST at the start, one more at that signal).
    ring_heads = seen_heads
    assert ring_heads >= 20 and counts["HEAD"] <= ring_heads + 2 + ring_heads // 10, counts
    assert counts["PUT"] == 2 and counts["PUT create"] == 2
    assert counts["GET"] == layout.NOTIFY_RING_SIZE and 1 <= counts["LIST"] - 10 <= 2, counts
    assert set(counts) <= {"LIST", "HEAD", "PUT", "PUT create", "PUT if-match", "GET"}, counts


async def test_signals_can_be_turned_off(queue_config: dict[str, Any]) -> None:
    queue_config["notify"] = {"enabled": False}
    config = load_config(queue_config)
    counting = CountingStore(open_store(config))
    async with PawnQueue(config, store=counting) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", topics=["t"])
        counting.reset()
        await producer.publish("t", 1)
        [message] = await consumer.poll(wait=1)
        await message.ack()
        counts = counting.reset()
        assert await pq.store.list(layout.NOTIFY) == []
    # The publish and the claim (both create-only), and no signal.
    assert counts["HEAD"] == 0 and counts["PUT create"] == 2 and counts["PUT"] == 0


async def test_signals_of_a_burst_are_coalesced(queue_config: dict[str, Any]) -> None:
    # A long interval: the burst's first mark goes out at once, a second only much later.
    queue_config["notify"] = {"check_interval_seconds": 30}
    queue_config["producer"] = {"group_commit": False}  # a message object each
    config = load_config(queue_config)
    counting = CountingStore(open_store(config))
    root_written = asyncio.Event()
    root_reads: list[str] = []

    async def on_put(operation: str, key: str) -> None:
        if operation == "put" and layout.is_notify_ring_key(key):
            root_written.set()

    async def on_read(operation: str, key: str) -> None:
        if operation != "put" and key.startswith(layout.NOTIFY):
            root_reads.append(operation)

    observed = FaultyStore(counting, hooks=[on_read], observers=[on_put])
    async with PawnQueue(config, store=observed) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        counting.reset()
        await asyncio.gather(*(producer.publish("t", n) for n in range(100)))
        await asyncio.wait_for(root_written.wait(), 10)
        counts = counting.reset()
        # The messages (create-only), then version 1 of the signal log: its ring key
        # created, as none was there (the ring's 16 keys read at once found none). No slot
        # and no root: only 0.2.0's consumers read them (notify.slot_signals).
        assert counts["PUT create"] == 100 + 1, counts
        assert root_reads == ["get"] * layout.NOTIFY_RING_SIZE, root_reads
        assert counts["PUT"] == counts["HEAD"] == 0
        first = layout.notify_ring_key(1)
        assert await pq.store.list(layout.NOTIFY) == [await pq.store.head(first)]


async def test_signal_checks_go_on_after_store_errors(queue_config: dict[str, Any]) -> None:
    """A failing HEAD of the signal ring does not stop the watch until the next backfill:
    once the store answers again, a publish still wakes the listener at once."""
    config = load_config(slow_backfill(queue_config))
    store = FaultyStore(open_store(config))
    failures, failed = 3, asyncio.Event()

    async def fail_root_heads(operation: str, key: str) -> None:
        nonlocal failures
        if operation == "head" and layout.is_notify_ring_key(key) and failures:
            failures -= 1
            if not failures:
                failed.set()
            raise StoreError("injected: HEAD failed")

    async with (
        await PawnQueue.from_config(slow_backfill(queue_config)) as producer_side,
        PawnQueue(config, store=store) as consumer_side,
    ):
        await producer_side.create_topic("t")
        producer = await producer_side.register_producer("p")
        consumer = await consumer_side.register_consumer("c", topics=["t"])
        assert await consumer.poll(wait=0.2) == []
        waiting = asyncio.create_task(consumer.poll(wait=30))
        store.hooks.append(fail_root_heads)
        await asyncio.wait_for(failed.wait(), 10)
        mid = await producer.publish("t", {"x": 1})
        messages = await asyncio.wait_for(waiting, 10)
        assert [m.id for m in messages] == [mid]


async def test_idle_listener_hears_another_instance_however_long_it_waited(
    queue_config: dict[str, Any],
) -> None:
    """The watch lasts as long as the wait: a listener idle for many times the watch's grace
    (50 checks) still wakes on a signal, not at the 60 s backfill."""
    config = slow_backfill(queue_config)
    async with (
        await PawnQueue.from_config(config) as producer_side,
        await PawnQueue.from_config(config) as consumer_side,
    ):
        await producer_side.create_topic("t")
        producer = await producer_side.register_producer("p")
        consumer = await consumer_side.register_consumer("c", topics=["t"])
        async with acking(consumer) as received:
            for idle in (0.5, 3 * 50 * 0.05):  # the second gap outlasts the grace three times
                await asyncio.sleep(idle)  # the idle gap under test, not a synchronisation
                mid = await producer.publish("t", {"idle": idle})
                assert await asyncio.wait_for(received.get(), 10) == mid


_PUBLISH_ONE = """
import asyncio, json, sys
from pawn_queue import PawnQueue

async def main() -> None:
    async with await PawnQueue.from_config(json.loads(sys.argv[1])) as pq:
        producer = await pq.register_producer("other-process")
        print(await producer.publish("t", {"from": "another process"}), flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_idle_listener_hears_a_publish_from_another_process(
    queue_config: dict[str, Any],
) -> None:
    """As users run it: the producer is another process, published after the listener has
    been idle longer than the watch's grace; signals, not the backfill, deliver it."""
    config = slow_backfill(queue_config)
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        consumer = await pq.register_consumer("c", topics=["t"])
        async with acking(consumer) as received:
            await asyncio.sleep(3 * 50 * 0.05)  # the idle gap under test
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _PUBLISH_ONE,
                json.dumps(config),
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await asyncio.wait_for(process.communicate(), 30)
            assert process.returncode == 0
            # The other process's start-up is not counted: the wait starts once it published.
            assert await asyncio.wait_for(received.get(), 10) == out.decode().strip()


async def test_a_signal_held_back_says_busy_and_other_processes_list_without_waiting() -> None:
    """Messages coming faster than one signal per interval: the late signal says so, and a
    watcher elsewhere wakes its consumers every few checks with no further signal."""
    from pawn_queue._protocol.notify import ChangeSignals
    from pawn_queue.config import NotifyConfig
    from pawn_queue.store.memory import MemoryStore

    written: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]
    puts = 0

    async def on_put(operation: str, key: str) -> None:
        nonlocal puts
        if operation == "put" and key.startswith(layout.NOTIFY):
            puts += 1
            written[0 if not written[0].is_set() else 1].set()

    async def busy() -> bool:
        log = await latest_signal_log(store)
        assert log is not None
        [change] = [c for c in log.changes if c.seq == log.seq]
        assert change.topic == "t"
        return change.busy

    store = FaultyStore(MemoryStore(), observers=[on_put])
    config = NotifyConfig(check_interval_seconds=0.05, signal_interval_seconds=0.5)
    producer, watcher = ChangeSignals(store, config), ChangeSignals(store, config)
    watcher.watch(["t"])
    assert await watcher.refresh()  # the baseline, and the watch runs
    keep_watching = asyncio.create_task(watcher.wait(["other"], within=30))
    try:
        producer.published("t")
        await asyncio.wait_for(written[0].wait(), 10)
        assert not await busy()  # the first: at once
        producer.published("t")  # within the interval: held back, then marked busy
        await asyncio.wait_for(written[1].wait(), 10)
        assert await busy()
        await asyncio.wait_for(producer.close(), 10)
        signals = puts
        # The watcher saw it (one wake), then wakes the topic's consumers again and again
        # while the topic counts as busy, with no signal written meanwhile.
        for _ in range(3):
            seen = watcher.snapshot(["t"])
            assert await watcher.local.wait(["t"], within=5, since=seen)
        assert puts == signals
    finally:
        keep_watching.cancel()
        await asyncio.gather(keep_watching, return_exceptions=True)
        await watcher.close()


async def test_a_watch_spaces_its_looks_to_how_often_the_root_changes() -> None:
    """Changes 1.5 s apart: about four looks each, not one every check interval (15 at
    0.1 s), and every change still wakes the topic."""
    from pawn_queue._protocol.notify import ChangeSignals
    from pawn_queue.config import NotifyConfig
    from pawn_queue.store.memory import MemoryStore

    looks = 0

    async def count_looks(operation: str, key: str) -> None:
        nonlocal looks
        if operation in ("head", "get") and key.startswith(layout.NOTIFY):
            looks += 1

    shared = MemoryStore()
    config = NotifyConfig(check_interval_seconds=0.1, signal_interval_seconds=0.1)
    producer = ChangeSignals(shared, config)
    watcher = ChangeSignals(FaultyStore(shared, hooks=[count_looks]), config)
    watcher.watch(["t", "other"])
    assert await watcher.refresh()  # the baseline, and the watch runs
    keep_watching = asyncio.create_task(watcher.wait(["other"], within=60))  # for as long
    looks_at_wake = []
    try:
        for n in range(6):
            if n:
                await asyncio.sleep(1.5)  # the workload: a change every 1.5 s
            seen = watcher.snapshot(["t"])
            producer.published("t")
            assert await watcher.local.wait(["t"], within=10, since=seen)
            looks_at_wake.append(looks)
    finally:
        keep_watching.cancel()
        await asyncio.gather(keep_watching, return_exceptions=True)
        await watcher.close()
        await producer.close()
    # Once three gaps are known (from the fourth change), the looks are spaced to a quarter.
    looks_per_change = [b - a for a, b in itertools.pairwise(looks_at_wake)]
    assert max(looks_per_change[3:]) <= 7, looks_per_change


@contextlib.asynccontextmanager
async def watching_consumer(
    queue_config: dict[str, Any],
) -> AsyncIterator[tuple[PawnQueue, Any, Any]]:
    """A queue with a consumer of topic ``t`` that listed it once and watches the signals,
    and a producer of another PawnQueue (another process, as far as signals go)."""
    config = slow_backfill(queue_config)
    async with (
        await PawnQueue.from_config(config) as here,
        await PawnQueue.from_config(config) as there,
    ):
        await here.create_topic("t")
        consumer = await here.register_consumer("c", topics=["t"])
        assert await consumer.poll(wait=0.2) == []  # listed once; the watch runs
        yield here, consumer, await there.register_producer("p")


async def test_a_message_whose_signal_never_came_is_listed_while_others_come_named(
    queue_config: dict[str, Any],
) -> None:
    """A producer died between its message and its signal. While the topic's other
    messages come named by signals (claimed with no listing), the consumer still lists the
    topic every ``backfill_interval_seconds``, and so finds it (rule 14); it waited for the
    sweep (10 minutes), once in a CI run of three schedule runners killed in turn."""
    config = slow_backfill(queue_config)
    config["notify"]["backfill_interval_seconds"] = 1
    silent = {**config, "notify": {**config["notify"], "enabled": False}}  # writes no signal
    async with (
        await PawnQueue.from_config(config) as producer_side,
        await PawnQueue.from_config(silent) as dead_side,
        await PawnQueue.from_config(config) as consumer_side,
    ):
        await producer_side.create_topic("t")
        consumer = await consumer_side.register_consumer("c", topics=["t"])
        assert await consumer.poll(wait=0.1) == []  # listed once: nothing
        unsignalled = await (await dead_side.register_producer("dead")).publish("t", "lone")
        producer = await producer_side.register_producer("p")
        received: list[str] = []
        for n in range(40):
            await producer.publish("t", n)
            for message in await consumer.poll(wait=0.5):
                await message.ack()
                received.append(message.id)
            if unsignalled in received:
                break
        assert unsignalled in received


async def test_named_objects_a_poll_cannot_take_are_listed_not_lost(
    queue_config: dict[str, Any],
) -> None:
    """A signal names three messages to a consumer that takes one a poll: it claims one
    without a listing, and the topic is listed for the others (claimed by name alone, they
    would wait for the sweep, as no other signal comes)."""
    queue_config["polling"]["max_messages_per_poll"] = 1
    queue_config["producer"] = {"group_commit": False}
    async with watching_consumer(queue_config) as (_, consumer, producer):
        ids = [await producer.publish("t", n) for n in range(3)]
        got: list[Message] = []
        async with asyncio.timeout(30):
            while len(got) < 3:
                got += await consumer.poll(wait=10)
        assert sorted(m.id for m in got) == sorted(ids)
        await consumer.ack_all(got)


async def test_a_delayed_message_named_by_a_signal_is_listed_and_comes_when_due(
    queue_config: dict[str, Any],
) -> None:
    """A signal can name a delayed message: the consumer cannot claim it yet, so it lists
    the topic, learns when it comes due, and gets it then with no further signal."""
    async with watching_consumer(queue_config) as (_, consumer, producer):
        mid = await producer.publish("t", {"x": 1}, delay=1)
        async with asyncio.timeout(30):
            [message] = await consumer.poll(wait=20)
        assert message.id == mid
        await message.ack()


async def test_a_root_written_by_0_2_0_wakes_every_topic_and_slots_are_written_when_asked(
    queue_config: dict[str, Any],
) -> None:
    """0.2.0's producers write a slot and then a 16-byte token to the root: a watcher here
    cannot read that and has its consumers list every topic, so the message is found. With
    ``notify.slot_signals`` this version writes the topic's slot too, for 0.2.0's
    consumers."""
    queue_config["notify"] = {"slot_signals": True}
    async with watching_consumer(queue_config) as (here, consumer, producer):
        slot = layout.notify_slot_key("t")
        await producer.publish("t", {"from": "this version"})
        async with asyncio.timeout(30):
            [message] = await consumer.poll(wait=10)
        await message.ack()
        assert await here.store.head(slot)  # written for 0.2.0's consumers
        # A 0.2.0 producer: the message, its slot, then the root's token.
        legacy = {**queue_config, "notify": {"enabled": False}}
        async with await PawnQueue.from_config(legacy) as old:
            mid = await (await old.register_producer("old")).publish("t", {"from": "0.2.0"})
            await old.store.put(slot, b"0123456789abcdef", "overwrite")
            await old.store.put(layout.NOTIFY_ROOT, b"fedcba9876543210", "overwrite")
        async with asyncio.timeout(30):
            [message] = await consumer.poll(wait=10)
        assert message.id == mid
        await message.ack()


async def test_a_message_named_later_does_not_overtake_one_named_before_and_left(
    queue_config: dict[str, Any],
) -> None:
    """A signal names two priority-9 messages to a consumer that takes one a poll: it claims
    the first by name and leaves the other (the topic is to be listed). A later signal names
    a priority-0 message: the next poll lists the topic and gives the priority-9 one first,
    where it claimed the newly named message ahead of it (once in CI, under load)."""
    queue_config["polling"]["max_messages_per_poll"] = 1
    queue_config["producer"] = {"group_commit": False}
    async with watching_consumer(queue_config) as (here, consumer, producer):
        signals = here.runtime.signals

        async def named(count: int) -> None:  # the watch here has seen them named
            async with asyncio.timeout(10):
                while True:
                    seen = signals.snapshot(["t"])  # a hint moves it, and wakes the wait
                    if len(signals._hints.get("t", ())) >= count:
                        return
                    await signals.local.wait(["t"], within=10, since=seen)

        urgent = [await producer.publish("t", n, priority=9) for n in range(2)]
        await named(2)
        [first] = await consumer.poll(wait=10)
        await producer.publish("t", "later")
        await named(1)
        [second] = await consumer.poll(wait=10)
        assert [first.id, second.id] == urgent
        await consumer.ack_all([first, second])
