"""Coalesced deletes: deletes issued in the same moment go out as one ``delete_many``.

Each caller still waits for its own key: ``await deleter.delete(key)`` returns once the
request that carried the key succeeded, and raises what that request raised.
"""

from __future__ import annotations

import asyncio

from pawn_queue.store.base import LIST_PAGE, Store


class DeleteCoalescer:
    """Batches concurrent deletes on one store (per event loop turn, 1,000 keys at most)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._flush_scheduled = False
        self._flushing: set[asyncio.Task[None]] = set()

    async def delete(self, key: str) -> None:
        future = self._pending.get(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            # A waiter that was cancelled must not leave an unretrieved exception behind.
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._pending[key] = future
            if not self._flush_scheduled:
                self._flush_scheduled = True
                # Let every task that is ready this turn add its key before the request goes.
                asyncio.get_running_loop().call_soon(self._start_flush)
        await asyncio.shield(future)

    def _start_flush(self) -> None:
        self._flush_scheduled = False
        while self._pending:
            keys = list(self._pending)[:LIST_PAGE]  # one S3 DeleteObjects request
            batch = {key: self._pending.pop(key) for key in keys}
            task = asyncio.ensure_future(self._flush(batch))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _flush(self, batch: dict[str, asyncio.Future[None]]) -> None:
        try:
            if len(batch) == 1:
                await self._store.delete(next(iter(batch)))
            else:
                await self._store.delete_many(list(batch))
        except BaseException as exc:  # every waiter gets the failure of its request
            for future in batch.values():
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for future in batch.values():
                if not future.done():
                    future.set_result(None)
