"""Listings shared by the consumers of one queue (pawn_queue._protocol.listings)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pawn_queue._internal.config_sections import NotifyConfig
from pawn_queue._protocol.listings import SharedListings
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")


class GatedListings(StoreWrapper):
    """Listings wait for :attr:`release`, then fail with :attr:`error` if set;
    :attr:`started` counts those sent."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.started = 0
        self.sent = asyncio.Event()
        self.release = asyncio.Event()
        self.error: Exception | None = None

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "list":
            self.started += 1
            self.sent.set()
            await self.release.wait()
            if self.error is not None:
                raise self.error
        return await run()


async def test_a_listing_in_flight_serves_callers_that_saw_no_later_signal() -> None:
    store = GatedListings()
    signals = ChangeSignals(store, NotifyConfig(enabled=False))
    listings = SharedListings(store, signals)
    await store.inner.put("t/messages/a.json", b"{}", "create")
    first = asyncio.create_task(listings.page("t", None, 10))
    await store.sent.wait()
    joined = asyncio.create_task(listings.page("t", None, 10))
    other_page = asyncio.create_task(listings.page("t", "t/messages/a.json", 10))
    own = asyncio.create_task(listings.page("t", None, 10, join=False))  # as poll() lists
    await asyncio.sleep(0)  # both take their first step: joined finds the listing in flight
    # A message published after the listing began: a caller woken by its signal must not
    # get a listing that may miss it.
    await store.inner.put("t/messages/b.json", b"{}", "create")
    signals.published("t")
    after_signal = asyncio.create_task(listings.page("t", None, 10))
    store.release.set()
    pages = await asyncio.gather(first, joined, other_page, after_signal, own)
    assert store.started == 4  # first (shared with joined), other_page, after_signal, own
    assert pages[0] is pages[1] and pages[4] is not pages[0]
    assert [m.key for m in pages[3]] == ["t/messages/a.json", "t/messages/b.json"]
    assert [m.key for m in pages[2]] == ["t/messages/b.json"]


async def test_a_failed_listing_fails_every_caller_and_is_not_reused() -> None:
    store = GatedListings()
    signals = ChangeSignals(store, NotifyConfig(enabled=False))
    listings = SharedListings(store, signals)
    store.error = StoreUnavailable("listing failed")
    first = asyncio.create_task(listings.page("t", None, 10))
    await store.sent.wait()
    joined = asyncio.create_task(listings.page("t", None, 10))
    await asyncio.sleep(0)  # joined finds the listing in flight
    store.release.set()
    results = await asyncio.gather(first, joined, return_exceptions=True)
    assert results == [store.error, store.error]
    store.error = None
    assert await listings.page("t", None, 10) == []
    assert store.started == 2
