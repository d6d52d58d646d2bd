"""Shares: consumer processes of one queue each claim their own share of new messages first
(``_protocol/shares.py``; docs/protocol.md, strategy ``conditional_write``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pawn_queue import Consumer, Message, PawnQueue
from pawn_queue._protocol import layout, shares
from pawn_queue._protocol.shares import Shares
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore, Hook
from tests.helpers.support import settled


def _key(at: datetime, n: int) -> str:
    return layout.message_key("t", f"id-{n}", at)


def test_each_new_message_has_one_owner_and_successors_wait_in_turn() -> None:
    now = datetime.now(UTC)
    ids = ["a", "b", "c"]
    views = {}
    for me in ids:
        view = Shares(me)
        view.update({"t": ids}, own=["t"])
        views[me] = view
    owners = []
    for n in range(60):
        key = _key(now, n)
        turns = sorted(
            ((turn[0] - now).total_seconds(), turn[1])
            if (turn := v.free_at("t", f"lease-{n}", key))
            else (0.0, False)
            for v in views.values()
        )
        wait = shares.SHARE_WAIT_SECONDS
        assert turns == [(0.0, False), (wait, True), (2 * wait, False)]
        owners.append(
            next(me for me, v in views.items() if v.free_at("t", f"lease-{n}", key) is None)
        )
    assert set(owners) == set(ids)  # every process owns some
    step = shares.LOOK_STEP_SECONDS
    looks = {views["a"].look_at(now + timedelta(seconds=k / 10)) for k in range(int(step * 10))}
    assert len(looks) <= 2 and all(look >= now for look in looks)  # on the grid, none early
    assert all(look.timestamp() % step == 0 for look in looks)
    assert views["a"].size("t") == 3 and views["a"].fewest(["t", "other"]) == 1


def test_alone_or_not_yet_seen_a_process_owns_everything() -> None:
    view = Shares("me")
    view.update({"t": ["other"]}, own=[])  # consumes nothing here: no shares
    assert view.free_at("t", "lease", _key(datetime.now(UTC), 1)) is None
    view.update({}, own=["t"])  # its own record not read back yet: alone
    assert view.size("t") == 1
    assert view.free_at("t", "lease", _key(datetime.now(UTC), 1)) is None


async def _drain(consumer: Any, rounds: int = 20) -> list[str]:
    got: list[str] = []
    for _ in range(rounds):
        messages = await consumer.poll(wait=0.2)
        if not messages:
            break
        for message in messages:
            await message.ack()
            got.append(message.id)
    return got


async def _listening(pq: PawnQueue) -> None:
    """As while a ``listen()`` of topic t runs in ``pq`` (the polls below stand for it)."""
    await pq.registry.listening([layout.queue("t", None)], started=True)


@contextlib.asynccontextmanager
async def _two_listening(
    queue_config: dict[str, Any], hooks: list[Hook] | None = None
) -> AsyncIterator[tuple[PawnQueue, PawnQueue, Consumer, set[str]]]:
    """Two listening processes of topic t, and 20 messages published: the first process
    (its store's requests seen by ``hooks``), its consumer (which polls) and the ids; the
    other never claims."""
    config = load_config(queue_config)
    async with (
        PawnQueue(config, store=FaultyStore(open_store(config), hooks=hooks or [])) as working,
        await PawnQueue.from_config(queue_config) as other,
    ):
        await working.create_topic("t", claims="message")
        await other.register_consumer("other", topics=["t"])
        await _listening(other)
        consumer = await working.register_consumer("working", topics=["t"])
        await _listening(working)
        producer = await working.register_producer("p")
        published = {await producer.publish("t", n) for n in range(20)}
        yield working, other, consumer, published


async def test_a_consumer_process_takes_its_share_first_and_a_stopped_ones_at_once(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one polling claims only its share of new messages (the other's wait for it, here
    for longer than the test); once the other stopped and the registry says so, it takes
    the rest at once. Before shares, it took all 20."""
    monkeypatch.setattr(shares, "SHARE_WAIT_SECONDS", 600.0)
    async with _two_listening(queue_config) as (working, resting, consumer, published):
        first = await _drain(consumer)
        assert 0 < len(first) < 20 and set(first) <= published
        assert working.registry.shares.size(layout.queue("t", None)) == 2
        await resting.teardown()
        await working.registry.refresh_shares()
        rest = await _drain(consumer)
        assert sorted(first + rest) == sorted(published)


async def test_a_contended_consumer_claims_its_whole_share_whatever_its_lane(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Having lost races lately, a consumer works in one lane; its share it claims whatever
    the lane (nobody else claims it yet), with no LIST of leases to choose a lane."""
    monkeypatch.setattr(shares, "SHARE_WAIT_SECONDS", 600.0)
    listed: list[str] = []

    async def hook(operation: str, key: str) -> None:
        if operation == "list":
            listed.append(key)

    async with _two_listening(queue_config, [hook]) as (working, _, consumer, published):
        queue = layout.queue("t", None)
        consumer._claimer.lanes.work_in(queue, 0)
        listed.clear()
        first = await _drain(consumer)
        assert 0 < len(first) < 20 and set(first) <= published
        assert all(working.registry.shares.owns(queue, m) for m in first)
        assert layout.leases_prefix(queue) not in listed, listed


async def test_another_processs_share_is_taken_once_it_waited(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other listening process is live but never claims (busy, or hung): its share of
    the messages is taken over once they waited SHARE_WAIT_SECONDS."""
    monkeypatch.setattr(shares, "SHARE_WAIT_SECONDS", 0.5)
    async with _two_listening(queue_config) as (_, _, consumer, published):
        got: list[str] = []
        for _ in range(100):
            for message in await consumer.poll(wait=1):
                await message.ack()
                got.append(message.id)
            if len(got) >= 20:
                break
        assert sorted(got) == sorted(published)


async def test_a_listener_is_in_the_shares_while_it_runs(queue_config: dict[str, Any]) -> None:
    """A process counts for a queue's shares while a listen() of it runs there: its record
    says so as the listener starts, and no longer once it ended."""
    queue = layout.queue("t", None)
    async with (
        await PawnQueue.from_config(queue_config) as listening,
        await PawnQueue.from_config(queue_config) as watching,
    ):
        await listening.create_topic("t", claims="message")
        consumer = await listening.register_consumer("listener", topics=["t"])
        await watching.register_consumer("watcher", topics=["t"])
        await _listening(watching)
        assert watching.registry.shares.size(queue) == 1
        handled = asyncio.Event()

        async def handler(message: Message) -> None:
            await message.ack()
            handled.set()

        task = asyncio.create_task(consumer.listen(handler))
        await (await watching.register_producer("p")).publish("t", "hello")
        await asyncio.wait_for(handled.wait(), 30)  # so the listener's record was written
        await watching.registry.refresh_shares()
        assert watching.registry.shares.size(queue) == 2
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watching.registry.refresh_shares()
        assert watching.registry.shares.size(queue) == 1


async def test_a_listener_starting_or_ending_is_signalled_to_the_others(
    queue_config: dict[str, Any],
) -> None:
    """The other processes read the records again as soon as a change signal says a
    listener started or ended, not at their next heartbeat (a minute)."""
    queue = layout.queue("t", None)
    async with (
        await PawnQueue.from_config(queue_config) as joining,
        await PawnQueue.from_config(queue_config) as watching,
    ):
        await joining.create_topic("t", claims="message")
        joined = await joining.register_consumer("joining", topics=["t"])
        watcher = await watching.register_consumer("watching", topics=["t"])
        shares_seen = watching.registry.shares
        sizes: asyncio.Queue[int] = asyncio.Queue()
        wake = shares_seen.on_change
        assert wake is not None

        def changed(topic: str) -> None:
            wake(topic)
            sizes.put_nowait(shares_seen.size(queue))

        shares_seen.on_change = changed
        watching_task = asyncio.create_task(watcher.listen(lambda m: m.ack()))
        assert await asyncio.wait_for(sizes.get(), 10) == 1  # its own listener
        joined_task = asyncio.create_task(joined.listen(lambda m: m.ack()))
        assert await asyncio.wait_for(sizes.get(), 10) == 2
        joined_task.cancel()
        await asyncio.gather(joined_task, return_exceptions=True)
        assert await asyncio.wait_for(sizes.get(), 10) == 1
        watching_task.cancel()
        await asyncio.gather(watching_task, return_exceptions=True)


async def test_a_shared_topic_is_listed_at_a_signal_so_unsignalled_messages_come_too(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where listening processes share a topic, a change signal has it listed (not only
    its named messages claimed): a message whose producer's signal has not come yet (here:
    a producer with signals off) is found at the next signal of any producer, not at the
    backfill a minute later."""
    monkeypatch.setattr(shares, "SHARE_WAIT_SECONDS", 600.0)
    queue_config["notify"] = {
        **queue_config.get("notify", {}),
        "check_interval_seconds": 0.05,
        "backfill_interval_seconds": 60,
    }
    silent = {**queue_config, "notify": {**queue_config["notify"], "enabled": False}}
    async with (
        _two_listening(queue_config) as (working, _, consumer, _),
        await PawnQueue.from_config(silent) as quiet_side,
        await PawnQueue.from_config(queue_config) as loud_side,
    ):
        await _drain(consumer)  # its share of the first 20
        await settled(working)  # their signals written,
        assert await consumer.poll(wait=0.5) == []  # and seen
        quiet = await quiet_side.register_producer("quiet")
        unsignalled = {await quiet.publish("t", n) for n in range(20)}
        queue = layout.queue("t", None)
        mine = {m for m in unsignalled if working.registry.shares.owns(queue, m)}
        assert mine
        assert await consumer.poll(wait=0.5) == []  # nothing signalled: nothing listed
        loud = await loud_side.register_producer("loud")  # another process: a signal
        await loud.publish("t", "signalled")
        got: set[str] = set()
        for _ in range(10):
            for message in await consumer.poll(wait=1):
                await message.ack()
                got.add(message.id)
            if mine <= got:
                break
        assert mine <= got
