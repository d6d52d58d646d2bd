"""The asyncio helpers of ``_internal/aio.py``."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from pawn_queue._internal.aio import gather_limited


async def test_gather_limited_keeps_order_and_returns_exceptions() -> None:
    async def value(n: int) -> int:
        await asyncio.sleep(0)
        if n == 2:
            raise ValueError(n)
        return n

    results = await gather_limited(2, (value(n) for n in range(4)))
    assert results[:2] == [0, 1] and results[3] == 3
    assert isinstance(results[2], ValueError)


async def test_gather_limited_cancelled_closes_what_it_had_not_started() -> None:
    """A dashboard stopping while its reads were queued behind the limit left coroutines
    never awaited (a RuntimeWarning at garbage collection)."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def read() -> None:
        started.set()
        await release.wait()

    reads = [read() for _ in range(5)]
    task = asyncio.ensure_future(gather_limited(1, reads))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [inspect.getcoroutinestate(c) for c in reads] == ["CORO_CLOSED"] * 5
