"""A store wrapper that injects failures and pauses at the store boundary."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from pawn_queue.store.base import ObjectMeta, PutMode, Store, StoredObject

Hook = Callable[[str, str], Awaitable[None]]


@dataclass
class FaultyStore:
    """Delegates to ``inner``. ``hooks`` run before each call and may raise or pause it;
    ``observers`` run after a call that succeeded."""

    inner: Store
    hooks: list[Hook] = field(default_factory=list)
    observers: list[Hook] = field(default_factory=list)

    async def _before(self, operation: str, key: str) -> None:
        for hook in list(self.hooks):
            await hook(operation, key)

    async def _after(self, operation: str, key: str) -> None:
        for observer in list(self.observers):
            await observer(operation, key)

    async def get(self, key: str) -> StoredObject:
        await self._before("get", key)
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectMeta:
        await self._before("head", key)
        return await self.inner.head(key)

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        await self._before("put", key)
        etag = await self.inner.put(key, data, mode, durable=durable)
        await self._after("put", key)
        return etag

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        await self._before("list", prefix)
        return await self.inner.list(prefix, start_after, limit)

    async def delete(self, key: str) -> None:
        await self._before("delete", key)
        await self.inner.delete(key)
        await self._after("delete", key)

    async def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            await self._before("delete", key)
        await self.inner.delete_many(keys)
        for key in keys:
            await self._after("delete", key)

    async def close(self) -> None:
        await self.inner.close()

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r})"
