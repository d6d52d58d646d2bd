"""The concurrency and rate limits of :class:`pawn_queue.client.PawnQueue`
(docs/concepts/flow-control.md)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.limits import Limits, conditional_writes, limit_argument
from pawn_queue._protocol.rates import Rate, parse_rate
from pawn_queue.limits import LimitSlot

if TYPE_CHECKING:
    from pawn_queue._protocol.runtime import Runtime


class LimitMethods:
    """Limits on how many blocks of code run at once, shared by every process on the store."""

    if TYPE_CHECKING:

        def _ready(self) -> Runtime: ...

    def concurrency_limit(
        self, name: str, limit: int, *, timeout: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[LimitSlot]:
        """``async with pq.concurrency_limit(name, limit):`` runs its block holding one of
        the ``limit`` slots of ``name``, which every process and host on the store shares:
        at most ``limit`` such blocks run at once (one name per customer, per upstream
        API...). ``limit=1`` makes a distributed mutex. Yields the :class:`LimitSlot`.

        Waits for a free slot, trying again after 50 ms to 1 s, for at most ``timeout``
        seconds (None: as long as it takes; 0: one try), then raises LimitTimeoutError.
        The slot's lease lasts ``polling.visibility_timeout_seconds`` and is refreshed in
        the background while the block runs; the slot of a holder that died frees at most
        that plus the clock-skew margin after its last refresh. A holder that stalls past
        its lease can lose its slot: that is logged, and ``LimitSlot.held`` turns False,
        but the block is not interrupted.

        Raises ConfigError for a bad name or on a store without conditional writes, and
        ArgumentError for another bad value, before any request. Requests and guarantees:
        docs/concepts/flow-control.md."""
        checked = layout.validate_name(name, "limit name")
        limit_argument("limit", limit)
        wait = None if timeout is None else seconds_argument("timeout", timeout, zero=True)
        runtime = self._ready()
        conditional_writes(runtime.leases.strategy, "concurrency limits")
        return _holding(runtime.limits, checked, limit, wait)

    def rate_limit(
        self, name: str, rate: str, *, timeout: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """``async with pq.rate_limit(name, "100/s"):`` runs its block at the time of one
        permit of ``name``: every process and host on the store shares the rate, whose
        permits come evenly spaced (``"20/s"``, ``"5000/min"``, ``"100/h"``, ``"3/10s"``).
        Nothing is held while the block runs, and nothing is given back.

        Waits for the next permit due to this process for at most ``timeout`` seconds
        (None: as long as it takes), else raises LimitTimeoutError at once. Raises
        ConfigError for a bad name or on a store without conditional writes, and
        ArgumentError for a malformed rate, before any request. Accuracy and requests:
        docs/concepts/flow-control.md."""
        checked = layout.validate_name(name, "rate limit name")
        parsed = parse_rate(rate)
        wait = None if timeout is None else seconds_argument("timeout", timeout, zero=True)
        runtime = self._ready()
        conditional_writes(runtime.leases.strategy, "rate limits")
        return _pacing(runtime, checked, parsed, wait)


@contextlib.asynccontextmanager
async def _pacing(
    runtime: Runtime, name: str, rate: Rate, within: float | None
) -> AsyncIterator[None]:
    await runtime.rates.acquire(name, rate, within)
    yield


@contextlib.asynccontextmanager
async def _holding(
    limits: Limits, name: str, limit: int, within: float | None
) -> AsyncIterator[LimitSlot]:
    slot = await limits.acquire(name, limit, within)
    try:
        yield slot
    finally:
        await limits.release(slot)
