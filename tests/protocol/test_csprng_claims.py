"""csprng_verify claims (docs/protocol.md, "Concurrency strategies"): read the lease, write
ours, wait, and read it back. A claimer that stalls between its read and its write (a busy
event loop, a pause) could write over a claim another consumer already decided it won, and
both would hold the message: it gives the claim up instead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pawn_queue._protocol.leases import LeaseManager
from pawn_queue.config import ConcurrencyConfig
from pawn_queue.store.base import Store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")

FAST = ConcurrencyConfig.model_validate(
    {
        "strategy": "csprng_verify",
        "csprng_verify": {
            "jitter_min_ms": 10,
            "jitter_max_ms": 20,
            "verify_retries": 1,
            "verify_retry_delay_ms": 10,
        },
    }
)


@dataclass(repr=False)
class StalledRead(StoreWrapper):
    """The first GET of a lease returns only once ``resume`` is set (``read`` is set when
    its answer is in)."""

    inner: Store
    read: asyncio.Event = field(default_factory=asyncio.Event)
    resume: asyncio.Event = field(default_factory=asyncio.Event)

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation != "get" or "/leases/" not in call.key or self.read.is_set():
            return await run()
        try:
            return await run()
        finally:
            self.read.set()
            await self.resume.wait()


async def test_a_claim_that_stalled_after_its_read_gives_up_and_the_winner_keeps_it() -> None:
    shared = MemoryStore()
    stalled_store = StalledRead(shared)
    stalled = LeaseManager(stalled_store, "csprng_verify", FAST)
    other = LeaseManager(shared, "csprng_verify", FAST)
    late = asyncio.create_task(stalled.claim("t", "m", "t/messages/m.json", "late", 30))
    await stalled_store.read.wait()  # it read: no lease yet
    won = await other.claim("t", "m", "t/messages/m.json", "first", 30)
    assert won is not None  # claimed and decided while the other stalled
    stalled_store.resume.set()
    assert await late is None
    await other.refresh(won)  # still ours: not written over


async def test_a_claim_without_a_stall_still_wins() -> None:
    leases = LeaseManager(StalledRead(MemoryStore()), "csprng_verify", FAST)
    store = leases._store
    assert isinstance(store, StalledRead)
    store.resume.set()
    assert await leases.claim("t", "m", "t/messages/m.json", "c", 30) is not None
