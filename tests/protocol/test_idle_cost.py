"""Idle topics cost a bounded number of requests whatever their number (docs/protocol.md,
rule 14), and nothing depends on a change signal: a signal that never came is made up for by
the sweep within its bound, and ``poll()`` answers from what the queue knows, within the
signals' bound."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.support import latest_signal_log

REPO = Path(__file__).resolve().parents[2]

# Kills its own process with SIGKILL just before it writes its change signal (a ring key): the
# message is durable, its signal is not, as when a producer dies between the two writes.
_PUBLISH_AND_DIE = """
import asyncio, json, os, signal, sys
from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore

config = load_config(json.loads(sys.argv[1]))

async def die_before_signal(operation: str, key: str) -> None:
    if operation == "put" and layout.is_notify_ring_key(key):
        os.kill(os.getpid(), signal.SIGKILL)

async def main() -> None:
    store = FaultyStore(open_store(config), hooks=[die_before_signal])
    async with PawnQueue(config, store=store) as pq:
        producer = await pq.register_producer("doomed")
        print(await producer.publish("t", {"from": "a producer about to die"}), flush=True)
        await asyncio.Event().wait()  # the signal's write kills us

asyncio.run(main())
"""

_PUBLISH_ONE = """
import asyncio, json, sys
from pawn_queue import PawnQueue

async def main() -> None:
    async with await PawnQueue.from_config(json.loads(sys.argv[1])) as pq:
        producer = await pq.register_producer("other-process")
        print(await producer.publish("t", {"from": "another process"}), flush=True)

asyncio.run(main())
"""


async def run_child(script: str, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE, cwd=REPO
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:  # timed out, or the test was cancelled: no orphan
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode().strip()


def timings(queue_config: dict[str, Any], **notify: float) -> dict[str, Any]:
    """Signals checked often; anything not set here is slow, so only what the test sets
    can deliver in time (a full poll of old took 60 s: ``polling.interval_seconds``)."""
    queue_config["polling"]["interval_seconds"] = 60
    queue_config["notify"] = {
        "check_interval_seconds": 0.05,
        "idle_check_interval_seconds": 0.2,
        "backfill_interval_seconds": 60,
        "sweep_interval_seconds": 600,
        "sweep_pace_seconds": 60,
        **notify,
    }
    return queue_config


class Received:
    """A listener's handler: acks and remembers when each message arrived."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    async def __call__(self, message: Message) -> None:
        await message.ack()
        await self.queue.put((message.id, time.monotonic()))

    async def next(self, within: float) -> tuple[str, float]:
        return await asyncio.wait_for(self.queue.get(), within)


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_a_signal_that_never_arrives_is_made_up_for_within_its_bound(
    queue_config: dict[str, Any],
) -> None:
    """A producer killed (SIGKILL) between its message write and its change signal: the idle
    listener of another process gets the message within the sweep's bound (rule 14; one
    topic: max(interval, 1 x pace) + pace), not at the next per-topic full poll (60 s
    here)."""
    bound = 1.1
    notify = {"sweep_interval_seconds": 1.0, "sweep_pace_seconds": 0.1}
    config = timings(queue_config, **notify)
    listed = asyncio.Event()

    async def on_list(operation: str, key: str) -> None:
        if operation == "list" and key == layout.messages_prefix("t"):
            listed.set()

    store = FaultyStore(open_store(load_config(config)), hooks=[on_list])
    async with PawnQueue(load_config(config), store=store) as pq:
        await pq.create_topic("t")
        consumer = await pq.register_consumer("c", topics=["t"])
        received = Received()
        listener = asyncio.create_task(consumer.listen(received))
        try:
            # The listener's first listing: the signals were looked at before it.
            await asyncio.wait_for(listed.wait(), 10)
            await pq.runtime.signals.marked()  # its own (a listener started: shares)
            log_before = await latest_signal_log(pq.store)
            code, mid = await run_child(_PUBLISH_AND_DIE, json.dumps(config))
            died = time.monotonic()
            assert code == -signal.SIGKILL and mid
            # Its signal never came: the signal log is as it was.
            assert await latest_signal_log(pq.store) == log_before
            got, arrived = await received.next(bound + 10)  # slack for a loaded machine
            assert got == mid
            # Within the bound, plus what the listing and the claim take.
            assert arrived - died < bound + 5
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)


async def test_a_topic_created_after_the_listener_started_is_served(
    queue_config: dict[str, Any],
) -> None:
    """The watch took its first look before the topic existed: the topic's slot is new to
    it, and a publish there still wakes the topic's listener (no sweep, no backfill here)."""
    config = timings(queue_config)
    async with (
        await PawnQueue.from_config(config) as listening,
        await PawnQueue.from_config(config) as other,
    ):
        await listening.create_topic("first")
        early = await listening.register_consumer("early", topics=["first"])
        received = Received()
        tasks = [asyncio.create_task(early.listen(received))]
        try:
            assert await early.poll() == []  # watched, with a first look taken
            await other.create_topic("later")
            producer = await other.register_producer("p")
            before = await producer.publish("later", {"n": "before its listener"})
            late = await listening.register_consumer("late", topics=["later"])
            tasks.append(asyncio.create_task(late.listen(received)))
            assert (await received.next(10))[0] == before
            after = await producer.publish("later", {"n": "while it listens"})
            assert (await received.next(10))[0] == after
            first = await producer.publish("first", {"n": "and the first topic"})
            assert (await received.next(10))[0] == first
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_poll_returns_a_message_from_another_process_within_the_bound(
    queue_config: dict[str, Any],
) -> None:
    """``poll()`` answers from what the queue knows (no LIST while nothing changed): a
    message published by another process shows within one idle check of its signal
    (rule 14), long before the sweep or the backfill (600 s and 60 s here)."""
    config = timings(queue_config)
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        consumer = await pq.register_consumer("c", topics=["t"])
        assert await consumer.poll() == []
        code, mid = await run_child(_PUBLISH_ONE, json.dumps(config))
        assert code == 0
        published = time.monotonic()
        messages: list[Message] = []
        while not messages:
            # A caller's poll loop, as the README shows it: the pause is the loop's own.
            messages = await consumer.poll()
            if not messages:
                assert time.monotonic() - published < 10, "not within the bound (slack: 10 s)"
                await asyncio.sleep(0.05)
        assert [m.id for m in messages] == [mid]
        await messages[0].ack()
