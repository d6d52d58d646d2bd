"""The concurrency limits of :class:`pawn_queue.client.PawnQueue`
(docs/concepts/flow-control.md)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from pawn_queue._internal.durations import count_argument, seconds_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.limits import MAX_LIMIT, Limits
from pawn_queue.exceptions import ArgumentError, ConfigError
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
        count_argument("limit", limit, minimum=1)
        if limit > MAX_LIMIT:
            raise ArgumentError(f"limit: got {limit!r}, must be at most {MAX_LIMIT}")
        wait = None if timeout is None else seconds_argument("timeout", timeout, zero=True)
        runtime = self._ready()
        if runtime.leases.strategy != "conditional_write":
            raise ConfigError(
                "concurrency limits hold only on a store with conditional writes: this one "
                f"runs strategy {runtime.leases.strategy} (docs/concepts/flow-control.md)"
            )
        return _holding(runtime.limits, checked, limit, wait)


@contextlib.asynccontextmanager
async def _holding(
    limits: Limits, name: str, limit: int, within: float | None
) -> AsyncIterator[LimitSlot]:
    slot = await limits.acquire(name, limit, within)
    try:
        yield slot
    finally:
        await limits.release(slot)
