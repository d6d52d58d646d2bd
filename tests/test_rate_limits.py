"""Rate limits and a subscriber's limits through the public API
(docs/concepts/flow-control.md): ``rate_limit`` shared by two queues on one store hands out
no more permits than the rate allows in any span, a permit never twice; timeouts; bad values
refused before any request; a ring of at most 16 keys per name; the blocking twin; and
``listen(max_in_flight=, rate_limit=)`` across two consumers of one topic, with the App's
and the worker's ways of giving them. Worker processes: tests/cli/test_worker.py."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pawn_queue import (
    App,
    ArgumentError,
    ConfigError,
    LimitTimeoutError,
    Message,
    PawnQueue,
    RateLimited,
    sync,
)
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.store import Store, open_store
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from tests.helpers.support import keys_under

T = TypeVar("T")
RATE = 20  # a second
CHUNK = 5  # permits a chunk holds at 20/s: a quarter second's


def most_in_any_second(times: list[float]) -> int:
    """The most of ``times`` (seconds) inside any one-second span."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


async def test_two_queues_share_the_rate(pq: PawnQueue, queue_config: dict[str, Any]) -> None:
    entered: list[float] = []

    async def take(queue: PawnQueue, n: int) -> None:
        for _ in range(n):
            async with queue.rate_limit("api", f"{RATE}/s"):
                entered.append(time.time())

    async with PawnQueue.from_config(queue_config) as other:
        async with asyncio.timeout(60):
            await asyncio.gather(
                *(take(queue, 15) for queue in (pq, other) for _ in range(2))  # 60 in all
            )
    assert len(entered) == 60
    # A permit is used at its time, or within a chunk's span after it; never twice.
    assert most_in_any_second(entered) <= RATE + CHUNK
    assert max(entered) - min(entered) >= (60 - RATE - CHUNK) / RATE
    ring = await keys_under(pq, "_rates/api/")
    assert 0 < len(ring) <= 16


async def test_a_permit_not_due_within_the_timeout_raises_at_once(
    queue_config: dict[str, Any],
) -> None:
    def half_past() -> datetime:  # 30 s into a minute, whatever the time
        return datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)

    config = load_config(queue_config)
    async with PawnQueue(config, clock=half_past) as pq:
        async with pq.rate_limit("nightly", "1/min", timeout=0):
            pass  # the permit of this minute: due 30 s ago
        started = time.monotonic()
        with pytest.raises(LimitTimeoutError, match=r"rate limit 'nightly' \(1/60s\)") as caught:
            async with pq.rate_limit("nightly", "1/min", timeout=5):
                pytest.fail("a second permit within the minute")
    assert isinstance(caught.value, TimeoutError)
    assert time.monotonic() - started < 5  # raised at once: the next is due in 30 s


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ("0/s", "needs a count and a span above 0"),
        ("-1/s", "must be"),
        ("nan/s", "must be"),
        ("20", "must be"),
        ("20/fortnight", "must be"),
        ("20/0s", "needs a count and a span above 0"),
        ("1000001/10s", "at most 100000 a second"),
        (20, "must be a string"),
        (None, "must be a string"),
    ],
)
async def test_bad_rates_raise_before_any_request(rate: Any, message: str) -> None:
    store = CountingStore(MemoryStore())
    async with PawnQueue(PawnQueueConfig.from_url("memory://"), store=store) as pq:
        store.reset()
        with pytest.raises(ArgumentError, match=message):
            async with pq.rate_limit("api", rate):
                pytest.fail("ran under a bad rate")
        for name in ("_x", "a/b", "a..b", "", "x" * 200, "\u202eevil"):
            with pytest.raises(ConfigError, match="rate limit name"):
                async with pq.rate_limit(name, "1/s"):
                    pytest.fail("ran under a bad name")
        with pytest.raises(ArgumentError, match="timeout"):
            async with pq.rate_limit("api", "1/s", timeout=math.nan):
                pytest.fail("ran with a NaN timeout")
        assert store.reset() == {}


@pytest.mark.parametrize("rate", ["20/s", "20/sec", "20 / second", "1200/min", "3/10s", "5/h"])
async def test_rate_spellings(pq: PawnQueue, rate: str) -> None:
    async with pq.rate_limit("spelled", rate, timeout=0):
        pass


class SlowStore(StoreWrapper):
    """Each request takes 0.4 s, longer than a chunk of 20/s lasts."""

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        await asyncio.sleep(0.4)
        return await run()


async def test_a_permit_due_once_its_chunk_is_won_is_not_a_timeout() -> None:
    config = PawnQueueConfig.from_url("memory://")
    async with PawnQueue(config, store=SlowStore(MemoryStore())) as pq:
        for _ in range(3):  # each won in 0.4 s or more, its first permit due by then
            async with pq.rate_limit("slow", "20/s", timeout=0):
                pass


class FirstWritesSlow(StoreWrapper):
    """The first two writes of a rate's keys take a second: its first chunks are won late."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.slow = 2

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "put" and call.key.startswith("_rates/") and self.slow > 0:
            self.slow -= 1
            await asyncio.sleep(1.0)
        return await run()


async def test_chunks_won_late_do_not_burst() -> None:
    """Two queues whose first chunks are won a second late: those permits are dropped, not
    used at once on top of the ones due then (which gave 30 in one second at 20/s)."""
    store = FirstWritesSlow(MemoryStore())
    config = PawnQueueConfig.from_url("memory://")
    entered: list[float] = []

    async def take(queue: PawnQueue) -> None:
        for _ in range(10):
            async with queue.rate_limit("api", f"{RATE}/s"):
                entered.append(time.monotonic())

    async with PawnQueue(config, store=store) as a, PawnQueue(config, store=store) as b:
        async with asyncio.timeout(60):
            await asyncio.gather(*(take(q) for q in (a, b) for _ in range(2)))
    assert store.slow == 0
    assert most_in_any_second(entered) <= RATE + CHUNK


async def test_refused_on_a_store_without_conditional_writes() -> None:
    config = PawnQueueConfig.from_url("memory://", concurrency={"strategy": "csprng_verify"})
    async with PawnQueue(config) as pq:
        with pytest.raises(ConfigError, match="rate limits hold only on a store with conditional"):
            async with pq.rate_limit("api", "1/s"):
                pytest.fail("ran without conditional writes")
        await pq.create_topic("jobs")
        consumer = await pq.register_consumer("c", ["jobs"])
        with pytest.raises(ConfigError, match="max_in_flight and rate_limit hold only"):
            await consumer.listen(lambda m: None, max_in_flight=2)


def test_the_blocking_twin(tmp_path: Path) -> None:
    with sync.PawnQueue.from_url(f"file://{tmp_path / 'store'}") as pq:
        with pq.rate_limit("api", "1/min", timeout=0):
            pass
        with pytest.raises(LimitTimeoutError), pq.rate_limit("api", "1/min", timeout=0):
            pytest.fail("a second permit within the minute")


class Running:
    """Counts the handlers running in every consumer, and the most at once."""

    def __init__(self, expected: int) -> None:
        self.now = self.most = 0
        self.started: list[float] = []
        self.done: set[int] = set()
        self.all_done = asyncio.Event()
        self.expected = expected

    async def handle(self, message: Message) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        self.started.append(time.time())
        try:
            await asyncio.sleep(0.05)  # the work
        finally:
            self.now -= 1
        await message.ack()
        self.done.add(message.payload)
        if len(self.done) == self.expected:
            self.all_done.set()


async def listen_on_two_queues(
    pq: PawnQueue, queue_config: dict[str, Any], running: Running, **limits: Any
) -> None:
    producer = await pq.register_producer("p")
    await pq.create_topic("jobs")
    for n in range(running.expected):
        await producer.publish("jobs", n)
    async with PawnQueue.from_config(queue_config) as other:
        consumers = [await queue.register_consumer("c", ["jobs"]) for queue in (pq, other)]
        listeners = [
            asyncio.create_task(c.listen(running.handle, concurrency=8, retry=None, **limits))
            for c in consumers
        ]
        try:
            async with asyncio.timeout(90):
                await running.all_done.wait()
        finally:
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    stats = await pq.topic_stats("jobs")
    assert stats.dead_letter == 0 and running.done == set(range(running.expected))


async def test_max_in_flight_holds_across_consumers(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    running = Running(24)
    await listen_on_two_queues(pq, queue_config, running, max_in_flight=2)
    assert running.most == 2  # 16 could run: 8 a consumer
    slots = await keys_under(pq, "_limits/_topics/jobs/")
    assert slots == ["_limits/_topics/jobs/0.lease", "_limits/_topics/jobs/1.lease"]


async def test_rate_limit_holds_across_consumers(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    running = Running(30)
    await listen_on_two_queues(pq, queue_config, running, rate_limit="10/s")
    assert most_in_any_second(running.started) <= 10 + 2  # 2: a chunk at 10/s
    assert await keys_under(pq, "_rates/_topics/jobs/")


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_in_flight": 0}, "max_in_flight: got 0"),
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_in_flight": 1.5}, "max_in_flight"),
        ({"max_in_flight": True}, "max_in_flight"),
        ({"max_in_flight": 1001}, "at most 1000"),
        ({"rate_limit": "0/s"}, "rate_limit"),
        ({"rate_limit": "fast"}, "rate_limit"),
        ({"rate_limit": 20}, "rate_limit"),
    ],
)
async def test_bad_subscriber_limits_are_refused(limits: dict[str, Any], message: str) -> None:
    async with PawnQueue.from_url("memory://") as pq:
        await pq.create_topic("jobs")
        await (await pq.register_producer("p")).publish("jobs", 1)
        consumer = await pq.register_consumer("c", ["jobs"])
        with pytest.raises(ArgumentError, match=message):
            await consumer.listen(lambda m: None, **limits)
        assert len(await consumer.poll()) == 1  # nothing was claimed
    app = App("memory://", name="limited")
    with pytest.raises(ArgumentError, match=message):
        app.subscriber("jobs", **limits)
    with pytest.raises(ArgumentError, match=message):
        app.set_limits(**limits)


async def test_an_app_subscriber_s_limits_reach_listen() -> None:
    app = App("memory://", name="limited", create_topics=True)
    running = Running(6)

    @app.subscriber("jobs", max_in_flight=1, rate_limit="50/s", retry=None)
    async def job(message: Message) -> None:
        await running.handle(message)

    await app.start()
    try:
        for n in range(running.expected):
            await app.producer.publish("jobs", n)
        serving = asyncio.create_task(app.serve())
        async with asyncio.timeout(30):
            await running.all_done.wait()
        app.stop_consuming()
        await serving
        keys = await keys_under(app.queue, "_")
    finally:
        await app.stop()
    assert running.most == 1
    assert "_limits/_topics/jobs/0.lease" in keys
    assert any(key.startswith("_rates/_topics/jobs/") for key in keys)


async def test_rate_limited_pauses_the_subscriber_in_every_consumer(
    pq: PawnQueue, queue_config: dict[str, Any]
) -> None:
    """A handler raising RateLimited(retry_after=3): no handler of the subscriber starts in
    the 3 s that follow (the other consumer's within a second: it reads the pause at most
    once a second), and the message comes back after them, its receive not counted: a topic
    that dead-letters at the second receive keeps it."""
    await pq.create_topic("jobs", max_receive_count=1)
    producer = await pq.register_producer("p")
    for n in range(12):
        await producer.publish("jobs", n)
    started: list[tuple[float, int]] = []
    refused: list[float] = []
    done: set[int] = set()
    all_done = asyncio.Event()

    async def handle(message: Message) -> None:
        started.append((time.time(), message.receive_count))
        if not refused:
            refused.append(time.time())
            raise RateLimited(retry_after=3)
        await asyncio.sleep(0.05)
        await message.ack()
        done.add(message.payload)
        if len(done) == 12:
            all_done.set()

    async with PawnQueue.from_config(queue_config) as other:
        consumers = [await queue.register_consumer("c", ["jobs"]) for queue in (pq, other)]
        listeners = [asyncio.create_task(c.listen(handle, concurrency=1)) for c in consumers]
        try:
            async with asyncio.timeout(60):
                await all_done.wait()
        finally:
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    [paused_at] = refused
    assert [at for at, _ in started if paused_at + 1.0 < at < paused_at + 3.0] == []
    assert all(count == 1 for _, count in started)  # the refused one came back uncounted
    assert (await pq.topic_stats("jobs")).dead_letter == 0
    assert await keys_under(pq, "_pauses/") == ["_pauses/_topics/jobs.json"]


class PauseReads(StoreWrapper):
    """Counts the HEADs of pause objects."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.heads = 0

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "head" and call.key.startswith("_pauses/"):
            self.heads += 1
        return await run()


async def test_a_busy_consumer_reads_its_pause_once_until_a_signal_says_one_was_written(
    queue_config: dict[str, Any],
) -> None:
    """Handlers at work for 4 s read the subscriber's pause once, before the first: the
    change signals say when a pause is written (the test above: the other consumer stops at
    once), so a busy process does not HEAD it every second."""
    config = load_config(queue_config)
    store = PauseReads(open_store(config))
    handled: list[int] = []
    all_handled = asyncio.Event()
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("jobs")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", ["jobs"])

        async def handle(message: Message) -> None:
            handled.append(message.payload)
            await message.ack()
            if len(handled) == 40:
                all_handled.set()

        listener = asyncio.create_task(consumer.listen(handle, concurrency=1))
        try:
            for n in range(40):  # 4 s, a message every 0.1 s
                await producer.publish("jobs", n)
                await asyncio.sleep(0.1)
            async with asyncio.timeout(30):
                await all_handled.wait()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
    assert sorted(handled) == list(range(40))
    assert store.heads == 1


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf, 86_401, "5", True, None])
def test_rate_limited_needs_a_pause_of_up_to_a_day(seconds: Any) -> None:
    with pytest.raises(ArgumentError, match="retry_after"):
        RateLimited(retry_after=seconds)
    assert RateLimited(retry_after=1.5).retry_after == 1.5
