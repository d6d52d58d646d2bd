"""Clock skew between consumers, on every store.

Every time a queue writes or compares reads its one clock (``PawnQueue(config, clock=...)``).
Each test gives two queues (two hosts) clocks on one virtual timeline that the test moves
forward, one of them skewed, so the outcome depends on the protocol alone, not on how fast
this machine is. The holder's
background refresh is paused and replaced by explicit refreshes at chosen times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from pawn_queue import LeaseLostError, Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.config import load_config
from pawn_queue.consumer import Consumer
from tests.helpers.support import keys_under, settled

VISIBILITY = 10.0
MARGIN = 1.0
STEP = 0.25  # virtual seconds between two looks of the other consumer


@dataclass
class Timeline:
    """Virtual time shared by the hosts of a test; each host reads it through its skew."""

    start: datetime
    elapsed: float = 0.0

    def clock(self, skew: Callable[[], float]) -> Callable[[], datetime]:
        return lambda: self.start + timedelta(seconds=self.elapsed + skew())


@dataclass
class Hosts:
    timeline: Timeline
    holder_queue: PawnQueue
    holder: Consumer
    other_queue: PawnQueue
    other: Consumer


@pytest.fixture
async def hosts(queue_config: dict[str, Any]) -> AsyncIterator[Callable[[float], Hosts]]:
    """``make(skew)``: a holder on true time and another consumer ``skew`` seconds ahead."""
    queue_config["polling"]["visibility_timeout_seconds"] = VISIBILITY
    queue_config["polling"]["lease_refresh_interval_seconds"] = VISIBILITY / 2
    queue_config["concurrency"]["clock_skew_margin_seconds"] = MARGIN
    config = load_config(queue_config)
    timeline = Timeline(now_utc())
    skew = [0.0]  # the other host's, set by make()
    async with (
        PawnQueue(config, clock=timeline.clock(lambda: 0.0)) as holder_queue,
        PawnQueue(config, clock=timeline.clock(lambda: skew[0])) as other_queue,
    ):
        await holder_queue.create_topic("t", claims="message")
        holder = await holder_queue.register_consumer("holder", topics=["t"])
        other = await other_queue.register_consumer("other", topics=["t"])
        holder.held_leases.paused = True  # refreshes happen when the test says

        def make(other_skew: float) -> Hosts:
            timeline.start, timeline.elapsed, skew[0] = now_utc(), 0.0, other_skew
            return Hosts(timeline, holder_queue, holder, other_queue, other)

        yield make


async def publish_and_hold(h: Hosts) -> Message:
    producer = await h.holder_queue.register_producer("p")
    message_id = await producer.publish("t", {"v": 1})
    [held] = await h.holder.poll(wait=10)
    assert held.id == message_id
    return held


async def refresh(h: Hosts, held: Message) -> None:
    lease = h.holder.held_leases.get(lease_key(held))
    assert lease is not None
    await h.holder_queue.runtime.leases.refresh(lease)


def lease_key(message: Message) -> str:
    return layout.lease_key("t", message.id)


async def first_delivery(consumer: Consumer) -> Message:
    """The next message ``consumer`` gets at this moment (a claim may straggle: bounded)."""
    async with asyncio.timeout(10):
        while True:
            if got := await consumer.poll(wait=0.5):
                [message] = got
                return message


async def keys(h: Hosts, prefix: str) -> list[str]:
    """The keys under ``prefix``, once the lease deletes after both hosts' acks landed."""
    await settled(h.other_queue)
    return await keys_under(h.holder_queue, prefix)


async def test_clock_ahead_by_the_margin_never_steals_a_refreshed_lease(
    hosts: Callable[[float], Hosts],
) -> None:
    h = hosts(MARGIN)
    held = await publish_and_hold(h)
    # The holder refreshes late, with half a margin left: a taker that ignored the margin
    # (or applied it the wrong way) would see the lease expire before each refresh.
    every = VISIBILITY - MARGIN / 2
    refreshed_at, looks = 0.0, 0
    while h.timeline.elapsed < 3 * VISIBILITY:
        h.timeline.elapsed += STEP
        if h.timeline.elapsed - refreshed_at >= every:
            await refresh(h, held)
            refreshed_at = h.timeline.elapsed
        assert await h.other.poll() == [], f"stolen at {h.timeline.elapsed}s"
        looks += 1
    await held.ack()
    assert looks == int(3 * VISIBILITY / STEP)
    assert await keys(h, "t/messages/") == []
    assert await keys(h, "t/leases/") == []


async def test_clock_ahead_beyond_margin_and_visibility_takes_over_a_live_lease(
    hosts: Callable[[float], Hosts],
) -> None:
    """The documented behaviour beyond the margin: a duplicate delivery, never a loss."""
    h = hosts(VISIBILITY + MARGIN + STEP)
    held = await publish_and_hold(h)
    await refresh(h, held)  # as live as a lease can be
    taken = await first_delivery(h.other)
    assert taken.id == held.id and taken.receive_count == 2
    # The holder learns it at its next refresh; from then on it deletes nothing.
    with pytest.raises(LeaseLostError):
        await refresh(h, held)
    with pytest.raises(LeaseLostError):
        await held.ack()
    with pytest.raises(LeaseLostError):
        await held.nack()
    assert len(await keys(h, "t/messages/")) == 1
    assert await keys(h, "t/dead-letter/") == []
    await taken.ack()
    assert await keys(h, "t/messages/") == []
    assert await keys(h, "t/leases/") == []

    # An ack before the holder's next refresh still deletes the message, which the taker is
    # processing too (its lease with it): processed twice, and its ack then succeeds.
    held = await publish_and_hold(h)
    taken = await first_delivery(h.other)
    assert taken.id == held.id
    await held.ack()
    await taken.ack()
    assert await keys(h, "t/messages/") == []
    assert await keys(h, "t/leases/") == []


async def test_clock_behind_only_delays_recovery_of_a_dead_holder(
    hosts: Callable[[float], Hosts],
) -> None:
    lag = 3.0
    h = hosts(-lag)
    held = await publish_and_hold(h)  # then the holder dies: no refresh, no ack
    free_at = VISIBILITY + MARGIN + lag  # on the timeline: expiry, margin, and the lag
    taken: Message | None = None
    while taken is None:
        h.timeline.elapsed += STEP
        assert h.timeline.elapsed < free_at + 10 * STEP, "the dead holder's message was lost"
        got = await h.other.poll()
        if got:
            [taken] = got
            assert h.timeline.elapsed > free_at, f"taken over early, at {h.timeline.elapsed}s"
    assert taken.id == held.id and taken.receive_count == 2
    await taken.ack()
    with pytest.raises(LeaseLostError):
        await held.ack()
    assert await keys(h, "t/messages/") == []
    assert await keys(h, "t/leases/") == []
