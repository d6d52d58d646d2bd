"""Small asyncio helpers shared by the queue modules."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")

IO_CONCURRENCY = 32  # requests in flight per consumer (claims, reads, refreshes, releases)


async def gather_limited(limit: int, aws: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Run ``aws`` with at most ``limit`` at once; results (or raised exceptions) in order."""
    semaphore = asyncio.Semaphore(limit)

    async def run(aw: Awaitable[T]) -> T:
        async with semaphore:
            return await aw

    return await asyncio.gather(*(run(aw) for aw in aws), return_exceptions=True)
