"""Concurrency limits through the public API (docs/concepts/flow-control.md): at most
``limit`` holders across two queues on one store, ``limit=1`` as a mutex, timeouts, bad
values refused before any request, the requests an acquire costs, a holder that stalled
past its lease, and the blocking twin. Worker processes and a killed holder:
tests/test_concurrency_limit_processes.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import (
    ArgumentError,
    ConfigError,
    LimitSlot,
    LimitTimeoutError,
    PawnQueue,
    sync,
)
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from tests.helpers.storage import limit_slots


class Holders:
    """Counts the blocks running under a limit, and the most at once."""

    def __init__(self) -> None:
        self.now = self.most = self.done = 0
        self.slots: set[int] = set()

    @contextlib.contextmanager
    def inside(self, slot: LimitSlot) -> Any:
        assert slot.held
        self.now += 1
        self.most = max(self.most, self.now)
        self.slots.add(slot.slot)
        try:
            yield
        finally:
            self.now -= 1
            self.done += 1


async def test_at_most_limit_holders_across_two_queues(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    holders = Holders()

    async def work(queue: PawnQueue) -> None:
        async with queue.concurrency_limit("api", 3) as slot:
            with holders.inside(slot):
                await asyncio.sleep(0.05)  # the work, long enough for the others to pile up

    async with PawnQueue.from_config(queue_config) as other:
        async with asyncio.timeout(60):
            await asyncio.gather(*(work(pq if n % 2 else other) for n in range(12)))
    assert (holders.most, holders.done, holders.slots) == (3, 12, {0, 1, 2})
    slots = await limit_slots(pq.store, "api", 3)
    assert sorted(slots) == [0, 1, 2]
    assert all(body.released for body in slots.values())  # given back, not deleted


async def test_limit_one_is_a_mutex(pq: PawnQueue, queue_config: dict[str, Any]) -> None:
    counter = 0
    holders = Holders()

    async def increment(queue: PawnQueue) -> None:
        nonlocal counter
        async with queue.concurrency_limit("counter", 1) as slot:
            with holders.inside(slot):
                value = counter
                await asyncio.sleep(0.01)  # a read-modify-write others would interleave with
                counter = value + 1

    async with PawnQueue.from_config(queue_config) as other:
        async with asyncio.timeout(60):
            await asyncio.gather(*(increment(pq if n % 2 else other) for n in range(8)))
    assert (counter, holders.most) == (8, 1)


async def test_timeout_raises_and_leaves_nothing_held(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    async with PawnQueue.from_config(queue_config) as other:
        async with pq.concurrency_limit("api", 1) as held:
            with pytest.raises(LimitTimeoutError, match="'api'") as info:
                async with other.concurrency_limit("api", 1, timeout=0.3):
                    pytest.fail("entered while the only slot was held")
            assert isinstance(info.value, TimeoutError)
            assert held.held
        assert not held.held
        # The waiter that gave up holds nothing: the slot is free at once, to anyone.
        async with other.concurrency_limit("api", 1, timeout=0) as slot:
            assert slot.slot == 0


async def test_an_error_in_the_block_gives_the_slot_back(pq: PawnQueue) -> None:
    with pytest.raises(KeyError):
        async with pq.concurrency_limit("api", 1) as slot:
            raise KeyError("handler failed")
    assert not slot.held
    assert (await limit_slots(pq.store, "api", 1))[0].released


async def test_a_cancelled_wait_holds_nothing(pq: PawnQueue, queue_config: dict[str, Any]) -> None:
    async with PawnQueue.from_config(queue_config) as other:
        async with pq.concurrency_limit("api", 1):
            entered = asyncio.Event()

            async def wait() -> None:
                async with other.concurrency_limit("api", 1):
                    entered.set()

            waiter = asyncio.create_task(wait())
            # It waits (reads the slot live) until cancelled.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), 0.5)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert not entered.is_set()
        async with other.concurrency_limit("api", 1, timeout=0):
            pass


def memory_config() -> PawnQueueConfig:
    return PawnQueueConfig.from_url("memory://", concurrency={"strategy": "conditional_write"})


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"name": "a/b", "limit": 1}, ConfigError, "limit name"),
        ({"name": "..", "limit": 1}, ConfigError, "limit name"),
        ({"name": "api\n", "limit": 1}, ConfigError, "limit name"),
        ({"name": "api\u202e", "limit": 1}, ConfigError, "limit name"),
        ({"name": "_limits", "limit": 1}, ConfigError, "reserved"),
        ({"name": 42, "limit": 1}, ConfigError, "limit name"),
        ({"name": "api", "limit": 0}, ArgumentError, "limit: got 0"),
        ({"name": "api", "limit": -3}, ArgumentError, "limit"),
        ({"name": "api", "limit": True}, ArgumentError, "limit"),
        ({"name": "api", "limit": 2.0}, ArgumentError, "limit"),
        ({"name": "api", "limit": "3"}, ArgumentError, "limit"),
        ({"name": "api", "limit": 1001}, ArgumentError, "at most 1000"),
        ({"name": "api", "limit": 1, "timeout": -1}, ArgumentError, "timeout"),
        ({"name": "api", "limit": 1, "timeout": math.inf}, ArgumentError, "timeout"),
        ({"name": "api", "limit": 1, "timeout": math.nan}, ArgumentError, "timeout"),
        ({"name": "api", "limit": 1, "timeout": "5"}, ArgumentError, "timeout"),
        ({"name": "api", "limit": 1, "timeout": True}, ArgumentError, "timeout"),
    ],
)
async def test_bad_values_raise_before_any_request(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    store = CountingStore(MemoryStore())
    async with PawnQueue(memory_config(), store=store) as pq:
        store.reset()
        with pytest.raises(error, match=match):
            pq.concurrency_limit(**arguments)
        assert store.reset() == {}


async def test_refused_on_a_store_without_conditional_writes() -> None:
    """There every waiter's create-only PUT of a slot would succeed."""
    config = PawnQueueConfig.from_url("memory://", concurrency={"strategy": "csprng_verify"})
    async with PawnQueue(config) as pq:
        with pytest.raises(ConfigError, match="conditional writes"):
            pq.concurrency_limit("api", 2)


async def test_requests_per_acquire() -> None:
    """The counts docs/concepts/flow-control.md gives ("Requests"), three processes' worth."""
    shared = MemoryStore.named(f"limits-{uuid.uuid4().hex}")
    stores = [CountingStore(shared) for _ in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        one, two, three = [
            await stack.enter_async_context(PawnQueue(memory_config(), store=store))
            for store in stores
        ]
        for store in stores:
            store.reset()
        counts = stores[0].reset
        async with one.concurrency_limit("api", 1):
            assert counts() == {"PUT create": 1}  # a slot never written
        assert counts() == {"PUT if-match": 1}  # the release
        async with one.concurrency_limit("api", 1):
            assert counts() == {"PUT if-match": 1}  # the slot this process gave back
            for _ in range(2):
                with pytest.raises(LimitTimeoutError):
                    async with two.concurrency_limit("api", 1, timeout=0):
                        pass
            # Never seen there: the create is refused, and its read says live; then one
            # GET per slot per round.
            assert stores[1].reset() == {"PUT create": 1, "GET": 2}
        counts()
        async with two.concurrency_limit("api", 1):  # given back by another process
            assert stores[1].reset() == {"GET": 1, "PUT if-match": 1}
        async with three.concurrency_limit("api", 1):  # never read here, written before
            assert stores[2].reset() == {"PUT create": 1, "GET": 1, "PUT if-match": 1}


async def test_a_contended_round_reads_each_slot_once() -> None:
    shared = MemoryStore.named(f"limits-{uuid.uuid4().hex}")
    mine, theirs = CountingStore(shared), CountingStore(shared)
    async with (
        PawnQueue(memory_config(), store=mine) as pq,
        PawnQueue(memory_config(), store=theirs) as other,
        contextlib.AsyncExitStack() as stack,
    ):
        for _ in range(3):
            await stack.enter_async_context(pq.concurrency_limit("api", 3))
        theirs.reset()
        with pytest.raises(LimitTimeoutError):
            async with other.concurrency_limit("api", 3, timeout=0):
                pass
        assert theirs.reset() == {"PUT create": 3, "GET": 3}  # the first look at each
        with pytest.raises(LimitTimeoutError):
            async with other.concurrency_limit("api", 3, timeout=0):
                pass
        assert theirs.reset() == {"GET": 3}


async def test_a_holder_that_stalled_past_its_lease_learns_it_lost_the_slot(
    pq: PawnQueue, queue_config: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A queue whose clock runs a minute ahead sees the lease as long expired, as any
    queue would after this holder stalled that long, and takes the slot over."""
    config = load_config(queue_config)
    ahead = PawnQueue(config, clock=lambda: datetime.now(UTC) + timedelta(seconds=60))
    async with ahead, contextlib.AsyncExitStack() as stack:
        async with pq.concurrency_limit("api", 1) as slot:
            thief = await stack.enter_async_context(ahead.concurrency_limit("api", 1, timeout=5))
            # The holder's next refresh (every 0.5 s here) finds the slot taken.
            deadline = time.monotonic() + 10
            while slot.held:
                assert time.monotonic() < deadline, "the holder never learned it lost its slot"
                await asyncio.sleep(0.05)
            assert "concurrency limit slot lost" in caplog.text
        # The end of the block gave nothing back: the slot is the thief's.
        assert thief.held and not (await limit_slots(pq.store, "api", 1))[0].released


def test_the_blocking_twin(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    holders, lock, errors = Holders(), threading.Lock(), []

    def work(queue: sync.PawnQueue) -> None:
        try:
            with queue.concurrency_limit("api", 2) as slot:
                with lock:
                    holders.now += 1
                    holders.most = max(holders.most, holders.now)
                time.sleep(0.05)  # the work
                with lock:
                    holders.now -= 1
                    holders.done += 1
                assert slot.held
        except BaseException as exc:
            errors.append(exc)

    with sync.PawnQueue.from_url(url) as pq, sync.PawnQueue.from_url(url) as other:
        threads = [threading.Thread(target=work, args=(pq if n % 2 else other,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert (errors, holders.most, holders.done) == ([], 2, 6)
        with pq.concurrency_limit("mutex", 1) as slot:
            assert isinstance(slot, LimitSlot) and slot.held
            with (
                pytest.raises(LimitTimeoutError),
                other.concurrency_limit("mutex", 1, timeout=0),
            ):
                pytest.fail("entered while the only slot was held")
        with other.concurrency_limit("mutex", 1, timeout=0):
            pass
        with pytest.raises(ArgumentError, match="limit"):
            pq.concurrency_limit("api", 0)
