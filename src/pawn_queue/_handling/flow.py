"""A subscriber's limits across processes: ``listen(max_in_flight=N, rate_limit="20/s")``,
and its pauses (a handler raised ``RateLimited``).

Each handler call first waits out a pause of the subscriber, then takes a slot of its
concurrency limit, then a permit of its rate limit, all named after what it reads (one name
per topic set or subscription, :func:`~pawn_queue._protocol.layout.subscriber_limit_name`),
so every process that consumes the same topic or subscription shares them. The message
waits claimed, its lease kept, and the wait is neither a receive nor a failure: a stop
meanwhile gives it back at once (docs/concepts/flow-control.md, "A subscriber's limits"),
and one past its own deadline after the wait is settled as expired, not handed out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from pawn_queue._handling.handlers import AsyncBatchHandler
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.expiry import unexpired
from pawn_queue._protocol.limits import conditional_writes, limit_argument
from pawn_queue._protocol.rates import Rate, parse_rate
from pawn_queue._protocol.runtime import Runtime


def check_flow(max_in_flight: object, rate_limit: object) -> tuple[int | None, Rate | None]:
    """``max_in_flight`` and ``rate_limit`` checked (ArgumentError), as the flow uses them."""
    count = None if max_in_flight is None else limit_argument("max_in_flight", max_in_flight)
    rate = None if rate_limit is None else parse_rate(rate_limit, "rate_limit")
    return count, rate


class Flow:
    """What one subscriber's handler calls wait for: a pause, its limits."""

    def __init__(
        self, runtime: Runtime, name: str, max_in_flight: int | None, rate: Rate | None
    ) -> None:
        self.runtime = runtime
        self._limits = runtime.limits
        self._rates = runtime.rates
        self._pauses = runtime.pauses
        self.name = name
        self.max_in_flight = max_in_flight
        self.rate = rate

    def concurrency(self, wanted: int | None) -> int | None:
        """A listener's local ``concurrency`` (``wanted``), at most ``max_in_flight``: it
        claims no more messages than it may run."""
        if self.max_in_flight is None:
            return wanted
        return min(wanted or self.max_in_flight, self.max_in_flight)

    def open(self) -> bool:
        """Whether a handler call may start at once, with no request: no limits, and no
        pause known or due to be read."""
        return self.max_in_flight is None and self.rate is None and self._pauses.clear(self.name)

    @contextlib.asynccontextmanager
    async def turn(self, permits: int = 1) -> AsyncIterator[None]:
        """Wait out a pause, hold a slot (with ``max_in_flight``) and wait for ``permits``
        permits (with a rate limit) for the block; the slot is given back after it."""
        await self._pauses.wait(self.name)
        slot = None
        if self.max_in_flight is not None:
            slot = await self._limits.acquire(self.name, self.max_in_flight, None)
        try:
            if self.rate is not None:
                for _ in range(permits):
                    await self._rates.acquire(self.name, self.rate, None)
            yield
        finally:
            if slot is not None:
                await self._limits.release(slot)


def gated_batch(call: AsyncBatchHandler, flow: Flow) -> AsyncBatchHandler:
    """``call``, each batch waiting for a slot and a permit per message first."""

    async def gated(messages: list[Message]) -> None:
        if flow.open():
            await call(messages)
            return
        async with flow.turn(len(messages)):
            # Those past their own deadline after the wait are settled as expired instead.
            if left := await unexpired(messages, flow.runtime):
                await call(left)

    return gated


def subscriber_flow(runtime: Runtime, name: str, max_in_flight: object, rate_limit: object) -> Flow:
    """The flow of the subscriber ``name`` (``layout.subscriber_limit_name``).
    ArgumentError for a bad value, ConfigError for limits on a store without conditional
    writes, before any request."""
    count, rate = check_flow(max_in_flight, rate_limit)
    if count is not None or rate is not None:
        conditional_writes(runtime.leases.strategy, "max_in_flight and rate_limit")
    return Flow(runtime, name, count, rate)
