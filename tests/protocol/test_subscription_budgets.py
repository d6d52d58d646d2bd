"""Request budgets of publishing to a topic with subscriptions, counted at the store boundary
(docs/protocol.md, "Subscriptions"): one write per matching subscription, the index read at
most once per cache period, nothing for a subscription whose filter does not match."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol import subscriptions as subscriptions_module
from pawn_queue.config import load_config
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from tests.helpers.support import settled

T = TypeVar("T")


async def spent(pq: PawnQueue, store: CountingStore) -> Counter[str]:
    await settled(pq)
    return store.reset()


@contextlib.asynccontextmanager
async def counted_topic(
    queue_config: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    filters: dict[str, Any],
    wrap: Callable[[Store], Store] = lambda store: store,
) -> AsyncIterator[tuple[PawnQueue, CountingStore]]:
    """Topic ``t`` with the subscriptions ``filters`` names, its requests counted; the
    producers' copy of the index stays warm (an hour) once they read it."""
    queue_config["polling"]["visibility_timeout_seconds"] = 60
    queue_config["polling"]["lease_refresh_interval_seconds"] = 20
    queue_config["notify"] = {"enabled": False}  # measured on their own (test_notify.py)
    config = load_config(queue_config)
    store = CountingStore(wrap(open_store(config)))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")
        # Quick changes (the rule holds for any cache time: the wait follows it) ...
        monkeypatch.setattr(subscriptions_module, "INDEX_CACHE_SECONDS", 0.2)
        for name, given in filters.items():
            await pq.create_subscription("t", name, filter=given)
        # ... then a cache that does not expire while a budget is measured.
        monkeypatch.setattr(subscriptions_module, "INDEX_CACHE_SECONDS", 3600.0)
        yield pq, store


@pytest.mark.parametrize("subscriptions", [0, 1, 3])
async def test_publish_writes_once_per_subscription_and_reads_the_index_once(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch, subscriptions: int
) -> None:
    filters = {f"s{n}": None for n in range(subscriptions)}
    copies = max(1, subscriptions)  # without subscriptions: the topic's own queue
    async with counted_topic(queue_config, monkeypatch, filters) as (pq, store):
        producer = await pq.register_producer("p")
        await spent(pq, store)
        # Cold: the index is read once (a 404 without subscriptions: the same rule).
        await producer.publish("t", 0)
        assert await spent(pq, store) == Counter({"GET": 1, "PUT create": copies})
        # Warm: one create-only PUT per copy, nothing else.
        for n in range(5):
            await producer.publish("t", n)
        assert await spent(pq, store) == Counter({"PUT create": 5 * copies})
        await producer.publish("t", "later", delay=60, group="g")
        assert await spent(pq, store) == Counter({"PUT create": copies})
        await producer.publish_batch("t", list(range(10)))
        assert await spent(pq, store) == Counter({"PUT create": copies})
        # Concurrent publishes share objects in each queue (group commit).
        await asyncio.gather(*(producer.publish("t", n) for n in range(20)))
        together = await spent(pq, store)
        assert set(together) == {"PUT create"}, together
        assert copies <= together["PUT create"] <= 2 * copies, together
        # A dedup id: its marker (create, then if-match once written) and the copies. Not
        # the first with a dedup id: that one may sweep the topic's markers (a LIST, by
        # chance: dedup.FIRST_SWEEP_CHANCE).
        await producer.publish("t", "first", dedup_id="d0")
        await spent(pq, store)
        await producer.publish("t", "once", dedup_id="d")
        assert await spent(pq, store) == Counter({"PUT create": 1 + copies, "PUT if-match": 1})


async def test_concurrent_publishes_share_each_read_of_the_index(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load, every publish that starts while the expired index is read again waits
    for that read: one GET per refresh, not one per publish."""
    async with counted_topic(queue_config, monkeypatch, {"a": None, "b": None}) as counted:
        pq, store = counted
        producer = await pq.register_producer("p")
        await producer.publish("t", "first")  # the first read
        clock = Clock(monkeypatch)
        for _ in range(3):
            await spent(pq, store)
            clock.expire_the_index()
            await asyncio.gather(*(producer.publish("t", n, group=str(n)) for n in range(10)))
            assert await spent(pq, store) == Counter({"GET": 1, "PUT create": 20})


class Clock:
    """The monotonic clock of pawn_queue.subscriptions, moved forward on request."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ahead = 0.0
        monkeypatch.setattr(subscriptions_module, "time", self)

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def expire_the_index(self) -> None:
        """Every copy of the index read so far is now too old to be used."""
        self.ahead += subscriptions_module.INDEX_CACHE_SECONDS


class HeldIndexReads(StoreWrapper):
    """Holds each read of the index while ``go`` is clear (it starts set)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.go = asyncio.Event()
        self.go.set()
        self.reading = asyncio.Event()

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "get" and call.key == layout.subscription_index_key("t"):
            self.reading.set()
            await self.go.wait()
        return await run()


async def test_a_publish_cancelled_while_it_reads_the_index_fails_none_sharing_it(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[HeldIndexReads] = []

    def wrap(store: Store) -> Store:
        held.append(HeldIndexReads(store))
        return held[0]

    async with counted_topic(queue_config, monkeypatch, {"a": None}, wrap) as (pq, store):
        producer = await pq.register_producer("p")
        await producer.publish("t", "first")  # the first read
        Clock(monkeypatch).expire_the_index()
        held[0].go.clear()
        await spent(pq, store)
        reader = asyncio.create_task(producer.publish("t", "cancelled"))
        await held[0].reading.wait()
        sharing = [asyncio.create_task(producer.publish("t", n)) for n in range(3)]
        await asyncio.sleep(0)  # they start, and wait for the read in flight
        reader.cancel()
        held[0].go.set()
        assert len(set(await asyncio.gather(*sharing))) == 3
        assert reader.cancelled()
        # The cancelled read, then one of their own, shared; their copies, one object.
        counts = await spent(pq, store)
        assert counts["GET"] == 2 and 1 <= counts["PUT create"] <= 3, counts
        queue = layout.subscription_queue("t", "a")
        assert len(await pq.store.list(layout.messages_prefix(queue))) == 1 + counts["PUT create"]


async def test_a_subscription_whose_filter_does_not_match_costs_nothing(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    filters = {"eu": {"region": "eu"}, "us": {"region": ["us", "ca"]}, "vip": {"vip": "1"}}
    async with counted_topic(queue_config, monkeypatch, filters) as (pq, store):
        producer = await pq.register_producer("p")
        await producer.publish("t", "warm")  # matches none
        await spent(pq, store)
        await producer.publish("t", "eu", attributes={"region": "eu"})
        assert await spent(pq, store) == Counter({"PUT create": 1})
        await producer.publish("t", "eu-vip", attributes={"region": "eu", "vip": "1"})
        assert await spent(pq, store) == Counter({"PUT create": 2})
        await producer.publish_batch("t", [1, 2], attributes={"region": "ca"})
        assert await spent(pq, store) == Counter({"PUT create": 1})
        # Matching none: no request at all.
        await producer.publish("t", "ap", attributes={"region": "ap"})
        await producer.publish_batch("t", [1, 2], attributes={"vip": "0"})
        await asyncio.gather(*(producer.publish("t", n) for n in range(5)))
        await producer.publish("t", "later", delay=60, group="g")
        assert await spent(pq, store) == Counter()
