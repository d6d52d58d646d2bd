"""Listings of a topic's messages shared by the consumers of one queue.

Consumers of one :class:`~pawn_queue.client.PawnQueue` woken by the same change signal
would each LIST the same page. A listing that began after every change signal a consumer
has seen for the topic shows it every message a listing of its own would (listings are
strongly consistent, and a publish signals once its write is durable): a listening consumer
joins that listing instead of sending another. One LIST then serves them all, and the lease
reservations of :class:`~pawn_queue._protocol.leases.LeaseManager` split its candidates among them.
``poll()`` lists on its own when it lists (which, like a listening consumer, it does only for
a topic that may have changed: :mod:`pawn_queue._protocol.freshness`).
"""

from __future__ import annotations

import asyncio

from pawn_queue._protocol import layout
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue.store.base import ObjectMeta, Store

_Page = tuple[str, str | None, int]  # topic, start after, limit


class SharedListings:
    """Pages of ``{topic}/messages/`` listings, shared while in flight."""

    def __init__(self, store: Store, signals: ChangeSignals) -> None:
        self._store = store
        self._signals = signals
        # page -> (the topic's signal generation when its LIST began, the LIST)
        self._in_flight: dict[_Page, tuple[int, asyncio.Future[list[ObjectMeta]]]] = {}

    async def page(
        self, topic: str, start_after: str | None, limit: int, *, join: bool = True
    ) -> list[ObjectMeta]:
        """Up to ``limit`` keys of the topic's messages after ``start_after``, from a LIST
        that began after every change signal seen here for ``topic`` (with ``join``), or in
        this call. Callers only read the list: it may be shared."""
        page = (topic, start_after, limit)
        generation = self._signals.generation(topic)
        current = self._in_flight.get(page)
        if join and current is not None and current[0] >= generation:
            return await asyncio.shield(current[1])
        listing = asyncio.ensure_future(
            self._store.list(layout.messages_prefix(topic), start_after=start_after, limit=limit)
        )
        self._in_flight[page] = (generation, listing)
        listing.add_done_callback(lambda _: self._forget(page, listing))
        return await asyncio.shield(listing)

    def _forget(self, page: _Page, listing: asyncio.Future[list[ObjectMeta]]) -> None:
        if not listing.cancelled():
            listing.exception()  # seen, even when every caller was cancelled meanwhile
        current = self._in_flight.get(page)
        if current is not None and current[1] is listing:
            del self._in_flight[page]
