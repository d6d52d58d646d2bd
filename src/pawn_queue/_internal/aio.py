"""Small asyncio helpers shared by the queue modules."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

IO_CONCURRENCY = 32  # requests in flight per consumer (claims, reads, refreshes, releases)


async def gather_limited(limit: int, aws: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Run ``aws`` with at most ``limit`` at once; results (or raised exceptions) in order.
    Cancelled, it closes the coroutines it had not started (no "never awaited" warning)."""
    semaphore = asyncio.Semaphore(limit)
    waiting = list(aws)

    async def run(aw: Awaitable[T]) -> T:
        async with semaphore:
            return await aw

    try:
        return await asyncio.gather(*(run(aw) for aw in waiting), return_exceptions=True)
    finally:
        for aw in waiting:
            if inspect.iscoroutine(aw) and inspect.getcoroutinestate(aw) == "CORO_CREATED":
                aw.close()


class Background:
    """Work nothing waits for at once (an ack's lease delete, a finished batch object's
    delete), but a teardown does: :meth:`done`. The work logs its own failures."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def done(self) -> None:
        """Wait until all work started so far, and any it started, has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def cancel_and_wait(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until each has ended, however often this is cancelled
    meanwhile (that is then raised at the end), as a TaskGroup's exit does."""
    cancelled = False
    while tasks:
        for task in tasks:
            task.cancel()
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            cancelled = True
        tasks = {task for task in tasks if not task.done()}
    if cancelled:
        raise asyncio.CancelledError
