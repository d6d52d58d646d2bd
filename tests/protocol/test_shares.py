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
    queue_config: dict[str, Any],
) -> AsyncIterator[tuple[PawnQueue, PawnQueue, Consumer, set[str]]]:
    """Two listening processes of topic t, and 20 messages published: the first process,
    its consumer (which polls) and the ids; the other never claims."""
    async with (
        await PawnQueue.from_config(queue_config) as working,
        await PawnQueue.from_config(queue_config) as other,
    ):
        await working.create_topic("t")
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
        await listening.create_topic("t")
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
