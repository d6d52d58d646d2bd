"""Replay: a topic's replay window, ``create_subscription(start=...)`` and ``seek``, on every
default store (docs/protocol.md, "Replay")."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import pytest

from pawn_queue import ArgumentError, PawnQueue
from pawn_queue._protocol import layout, retained
from pawn_queue.config import load_config
from pawn_queue.consumer import Consumer
from pawn_queue.exceptions import ConfigError, LeaseLostError, ReplayUnavailableError
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.stores import FAST_POLLING

pytestmark = pytest.mark.usefixtures("quick_subscription_changes")  # all in this process


async def drain(consumer: Consumer) -> list[object]:
    """Every payload the consumer can get now, acked (a poll waits for change signals)."""
    payloads: list[object] = []
    while messages := await consumer.poll(wait=1.0):
        for message in messages:
            payloads.append(message.payload)
            await message.ack()
    return payloads


async def retained_keys(pq: PawnQueue, topic: str) -> list[str]:
    prefix = layout.messages_prefix(layout.retained_log(topic))
    return [meta.key for meta in await pq.store.list(prefix)]


async def test_a_topic_without_a_replay_window_keeps_nothing(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    await producer.publish("t", 1)
    await producer.publish_batch("t", [2, 3])
    assert await retained_keys(pq, "t") == []


async def test_a_new_subscription_from_the_earliest_gets_every_kind_of_message(
    pq: PawnQueue,
) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    producer = await pq.register_producer("p")
    await producer.publish("t", "plain", attributes={"k": "a"})
    await asyncio.gather(
        *(producer.publish("t", f"many-{i}", attributes={"k": "a"}) for i in range(20))
    )
    await producer.publish_batch("t", ["batch-1", "batch-2"], attributes={"k": "b"})
    await producer.publish("t", b"raw bytes", attributes={"k": "a"})
    await producer.publish("t", "grouped", group="g", attributes={"k": "a"})
    await producer.publish("t", "dedup", dedup_id="d-1", attributes={"k": "a"})
    published = {"plain", "batch-1", "batch-2", b"raw bytes", "grouped", "dedup"}
    published |= {f"many-{i}" for i in range(20)}
    assert await retained_keys(pq, "t")  # the log holds them, acked or not

    await pq.create_subscription("t", "all", start="earliest")
    await pq.create_subscription("t", "only-a", start="earliest", filter={"k": "a"})
    everything = await drain(await pq.register_consumer("c1", ["t"], subscription="all"))
    assert sorted(map(repr, everything)) == sorted(map(repr, published))
    taken = await drain(await pq.register_consumer("c2", ["t"], subscription="only-a"))
    assert sorted(map(repr, taken)) == sorted(map(repr, published - {"batch-1", "batch-2"}))
    # The topic's own queue still holds them: the log is another copy.
    assert (await pq.topic_stats("t")).pending > 0


async def test_a_filter_takes_part_of_a_batch_object(pq: PawnQueue) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    producer = await pq.register_producer("p")
    # Concurrent publishes share batch objects, whatever their attributes.
    await asyncio.gather(
        *(producer.publish("t", i, attributes={"odd": str(i % 2)}) for i in range(30))
    )
    await pq.create_subscription("t", "odd", start="earliest", filter={"odd": "1"})
    got = await drain(await pq.register_consumer("c", ["t"], subscription="odd"))
    assert sorted(got) == list(range(1, 30, 2))  # type: ignore[type-var]


async def test_seek_to_a_time_redelivers_from_then_on_only(pq: PawnQueue) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    await pq.create_subscription("t", "s")
    await pq.create_subscription("t", "other")
    producer = await pq.register_producer("p")
    for i in range(3):
        await producer.publish("t", f"before-{i}")
    middle = datetime.now(UTC)
    await asyncio.sleep(0.01)  # the keys' microsecond stamps fall after ``middle``
    for i in range(3):
        await producer.publish("t", f"after-{i}")
    consumer = await pq.register_consumer("c", ["t"], subscription="s")
    assert len(await drain(consumer)) == 6

    await pq.seek("t", "s", middle)
    assert await drain(consumer) == ["after-0", "after-1", "after-2"]  # in order
    await pq.seek("t", "s", "earliest")
    assert len(await drain(consumer)) == 6
    # Seeking one subscription leaves the other as it was.
    other = await pq.register_consumer("o", ["t"], subscription="other")
    assert len(await drain(other)) == 6


async def test_seek_to_latest_drops_the_backlog(pq: PawnQueue) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    for i in range(5):
        await producer.publish("t", i)
    await pq.seek("t", "s", "latest")
    assert (await pq.subscription_stats("t", "s")).pending == 0
    await producer.publish("t", "new")
    consumer = await pq.register_consumer("c", ["t"], subscription="s")
    assert await drain(consumer) == ["new"]


async def test_a_seek_redelivers_at_once_what_this_process_just_acked(
    queue_config: dict[str, object],
) -> None:
    """An acked message's lease outlives it a while here (S3 keeps it as a tombstone); a
    replayed copy carries the same id, so the same lease key, and must not wait for it."""
    queue_config["polling"] = {**FAST_POLLING, "visibility_timeout_seconds": 60}
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t", replay_window_seconds=3600)
        await pq.create_subscription("t", "s")
        producer = await pq.register_producer("p")
        await producer.publish("t", "only")
        consumer = await pq.register_consumer("c", ["t"], subscription="s")
        assert await drain(consumer) == ["only"]
        await pq.seek("t", "s", "earliest")
        assert [m.payload for m in await consumer.poll(wait=20.0)] == ["only"]


async def test_a_seek_keeps_a_delayed_message_until_it_is_due(pq: PawnQueue) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    await producer.publish("t", "later", delay=3600)
    await pq.seek("t", "s", "earliest")
    stats = await pq.subscription_stats("t", "s")
    assert (stats.pending, stats.delayed) == (0, 1)


async def test_the_log_is_swept_once_past_the_window(queue_config: dict[str, object]) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    async with PawnQueue(load_config(queue_config), clock=lambda: now[0]) as pq:
        await pq.create_topic("t", replay_window_seconds=600)
        producer = await pq.register_producer("p")
        await producer.publish("t", "old")
        [old] = await retained_keys(pq, "t")
        # The first publish picks when this process first sweeps: within max(window / 10, 60 s).
        now[0] += timedelta(seconds=601 + 60)
        await producer.publish("t", "young")
        await pq.runtime.background.done()
        keys = await retained_keys(pq, "t")
        assert old not in keys and len(keys) == 1


async def test_a_one_shot_publisher_may_sweep_the_log_at_its_first_publish(
    queue_config: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that publishes once and exits never reaches a next sweep: its first
    publish sweeps at once, by chance (here always)."""
    monkeypatch.setattr(retained, "FIRST_SWEEP_CHANCE", 1.0)
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    for payload in ("old", "young"):  # two one-shot processes, an hour apart
        async with PawnQueue(load_config(queue_config), clock=lambda: now[0]) as pq:
            if payload == "old":
                await pq.create_topic("t", replay_window_seconds=600)
            await (await pq.register_producer("p")).publish("t", payload)
        now[0] += timedelta(hours=1)
    async with PawnQueue(load_config(queue_config)) as pq:
        [young] = await retained_keys(pq, "t")
        message = await pq.store.get(young)
        assert b"young" in message.data


async def test_closing_the_queue_waits_for_the_sweep_its_publish_began(
    queue_config: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-shot publisher's sweep (above) runs in the background: leaving ``async with``
    waits for it, or a process that publishes and exits would cut it short."""
    monkeypatch.setattr(retained, "FIRST_SWEEP_CHANCE", 1.0)
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    async with PawnQueue(load_config(queue_config), clock=lambda: now[0]) as pq:
        await pq.create_topic("t", replay_window_seconds=600)
        await (await pq.register_producer("p")).publish("t", "old")
        [old] = await retained_keys(pq, "t")
    now[0] += timedelta(hours=1)
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    log = layout.messages_prefix(layout.retained_log("t"))
    deleted: list[str] = []

    async def slow_sweep(operation: str, key: str) -> None:
        if operation == "list" and key.startswith(log):
            await asyncio.sleep(0.5)

    async def note(operation: str, key: str) -> None:
        if operation == "delete":
            deleted.append(key)

    store.hooks.append(slow_sweep)
    store.observers.append(note)
    async with PawnQueue(config, store=store, clock=lambda: now[0]) as pq:
        await (await pq.register_producer("p")).publish("t", "young")
    assert old in deleted


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "60"])
async def test_a_bad_replay_window_is_refused(pq: PawnQueue, bad: object) -> None:
    with pytest.raises(ConfigError, match="replay_window_seconds"):
        await pq.create_topic("t", replay_window_seconds=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["now", datetime(2030, 1, 1), 0, None])
async def test_a_bad_seek_target_is_refused_before_anything_changes(
    pq: PawnQueue, bad: object
) -> None:
    await pq.create_topic("t", replay_window_seconds=3600)
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    await producer.publish("t", 1)
    with pytest.raises(ArgumentError):
        await pq.seek("t", "s", bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError):
        await pq.create_subscription("t", "s2", start=bad)  # type: ignore[arg-type]
    assert (await pq.subscription_stats("t", "s")).pending == 1
    assert [s.name for s in await pq.list_subscriptions("t")] == ["s"]


async def test_a_seek_into_a_topic_without_history_refuses_and_keeps_what_waits(
    pq: PawnQueue,
) -> None:
    await pq.create_topic("t")  # no replay window: nothing to bring back
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    for i in range(5):
        await producer.publish("t", i)
    for to in ("earliest", datetime.now(UTC) - timedelta(minutes=5)):
        with pytest.raises(ReplayUnavailableError, match="replay_window_seconds"):
            await pq.seek("t", "s", to)
        assert (await pq.subscription_stats("t", "s")).pending == 5
    consumer = await pq.register_consumer("c", ["t"], subscription="s")
    assert await drain(consumer) == [0, 1, 2, 3, 4]
    # Asked for: what waits is dropped, and nothing comes back.
    await producer.publish("t", "again")
    await pq.seek("t", "s", "earliest", drop=True)
    assert (await pq.subscription_stats("t", "s")).pending == 0


async def test_a_seek_before_the_replay_window_refuses(pq: PawnQueue) -> None:
    await pq.create_topic("t", replay_window_seconds=60)
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    await producer.publish("t", "kept")
    with pytest.raises(ReplayUnavailableError, match="60"):
        await pq.seek("t", "s", datetime.now(UTC) - timedelta(hours=1))
    assert (await pq.subscription_stats("t", "s")).pending == 1
    await pq.seek("t", "s", datetime.now(UTC) - timedelta(hours=1), drop=True)
    consumer = await pq.register_consumer("c", ["t"], subscription="s")
    assert await drain(consumer) == ["kept"]  # what the window holds comes back


async def test_a_seek_refuses_to_drop_what_waits_from_before_the_history(
    pq: PawnQueue,
) -> None:
    """A window given to a topic later keeps the messages published from then on: an
    earlier one that still waits would be dropped and not brought back."""
    await pq.create_topic("t")
    await pq.create_subscription("t", "s")
    producer = await pq.register_producer("p")
    await producer.publish("t", "from before")
    await pq.update_topic("t", replay_window_seconds=3600)
    await producer.publish("t", "kept")
    with pytest.raises(ReplayUnavailableError, match="1 message"):
        await pq.seek("t", "s", "earliest")
    assert (await pq.subscription_stats("t", "s")).pending == 2
    # Seeking past it skips it, as asked.
    middle = layout.due_from_key(sorted(await retained_keys(pq, "t"))[0])
    assert middle is not None
    await pq.seek("t", "s", middle)
    consumer = await pq.register_consumer("c", ["t"], subscription="s")
    assert await drain(consumer) == ["kept"]


async def test_a_seek_frees_at_once_what_this_process_held(
    queue_config: dict[str, object],
) -> None:
    """Messages claimed and not acked when a seek drops them come back as replayed copies
    with the same ids, so the same lease keys: consumers here take them at once, and the
    old deliveries can no longer be settled."""
    queue_config["polling"] = {
        **FAST_POLLING,
        "visibility_timeout_seconds": 60,
        "lease_refresh_interval_seconds": 30,
    }
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t", replay_window_seconds=3600)
        await pq.create_subscription("t", "s")
        producer = await pq.register_producer("p")
        for i in range(3):
            await producer.publish("t", i)
        held = await (await pq.register_consumer("c", ["t"], subscription="s")).poll()
        assert sorted(m.payload for m in held) == [0, 1, 2]

        await pq.seek("t", "s", "earliest")
        other = await pq.register_consumer("c2", ["t"], subscription="s")
        got: list[object] = []
        for _ in range(3):  # each poll waits for a change signal: the replay's
            got += [m.payload for m in await other.poll(wait=5.0)]
            if len(got) == 3:
                break
        assert sorted(got) == [0, 1, 2]
        with pytest.raises(LeaseLostError):
            await held[0].ack()
