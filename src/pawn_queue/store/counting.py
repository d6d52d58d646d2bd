"""A store wrapper that counts requests by operation: for request budgets and benchmarks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, Store, StoredObject

_DELETE_BATCH = 1000  # S3 DeleteObjects takes at most 1,000 keys per request


class CountingStore:
    """Delegates to ``inner`` and counts each call as the S3 request it stands for.

    Keys of :attr:`counts`: ``GET``, ``HEAD``, ``LIST``, ``DELETE``, and ``PUT`` split by mode
    (``PUT``, ``PUT create``, ``PUT if-match``). Failed requests count too: they cost the same.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    def reset(self) -> Counter[str]:
        """Return the counts so far and start again from zero."""
        counts, self.counts = self.counts, Counter()
        return counts

    async def get(self, key: str) -> StoredObject:
        self.counts["GET"] += 1
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectMeta:
        self.counts["HEAD"] += 1
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        if isinstance(mode, IfMatch):
            self.counts["PUT if-match"] += 1
        else:
            self.counts["PUT create" if mode == "create" else "PUT"] += 1
        return await self.inner.put(key, data, mode, durable=durable)

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        result = await self.inner.list(prefix, start_after, limit)
        # One request per page of 1,000, and at least one.
        self.counts["LIST"] += max(1, -(-len(result) // 1000))
        return result

    async def delete(self, key: str) -> None:
        self.counts["DELETE"] += 1
        await self.inner.delete(key)

    async def delete_many(self, keys: Sequence[str]) -> None:
        self.counts["DELETE"] += -(-len(keys) // _DELETE_BATCH)
        await self.inner.delete_many(keys)

    async def close(self) -> None:
        await self.inner.close()

    def __repr__(self) -> str:
        return f"CountingStore({self.inner!r})"
