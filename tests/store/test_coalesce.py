"""Coalesced deletes: one request for the deletes of one moment, each caller sees its outcome."""

from __future__ import annotations

import asyncio

import pytest

from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store.coalesce import DeleteCoalescer
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from tests.helpers.faults import FaultyStore


async def test_same_turn_deletes_become_one_request() -> None:
    store = CountingStore(MemoryStore())
    for n in range(2500):
        await store.put(f"k/{n:05d}", b"x")
    deleter = DeleteCoalescer(store)
    store.reset()
    await asyncio.gather(*(deleter.delete(f"k/{n:05d}") for n in range(2500)))
    assert store.reset()["DELETE"] == 3  # 1,000 keys per request
    assert await store.list("k/") == []


async def test_each_waiter_gets_its_requests_failure() -> None:
    inner = MemoryStore()
    await inner.put("a", b"1")
    await inner.put("b", b"2")
    faulty = FaultyStore(inner)

    async def fail(operation: str, key: str) -> None:
        if operation == "delete":
            raise StoreUnavailable("injected")

    faulty.hooks.append(fail)
    deleter = DeleteCoalescer(faulty)
    results = await asyncio.gather(deleter.delete("a"), deleter.delete("b"), return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results)
    faulty.hooks.clear()
    await deleter.delete("a")
    assert [m.key for m in await inner.list()] == ["b"]
    with pytest.raises(StoreUnavailable):
        faulty.hooks.append(fail)
        await deleter.delete("b")
