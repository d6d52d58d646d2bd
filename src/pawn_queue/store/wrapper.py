"""The base of store wrappers: a :class:`~pawn_queue.store.base.Store` that delegates every
call to ``inner`` through one overridable hook, :meth:`StoreWrapper.around`.

Counting (:mod:`pawn_queue.store.counting`), metrics (:class:`pawn_queue.metrics.MetricsStore`)
and the tests' fault injection are wrappers. A wrapper observes, delays or fails calls but
keeps the inner store's semantics (put modes, listing order), so the client treats a wrapped
memory or local-directory store as the store it wraps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias, TypeVar

from pawn_queue.store.base import ObjectMeta, PutMode, Store, StoredObject

__all__ = ["Operation", "StoreCall", "StoreWrapper"]

T = TypeVar("T")

Operation: TypeAlias = Literal["get", "head", "put", "list", "delete", "delete_many"]


@dataclass(frozen=True, slots=True)
class StoreCall:
    """One call of the Store protocol, as :meth:`StoreWrapper.around` sees it.

    ``key`` is the key (get, head, put, delete), the prefix (list) or ``""`` (delete_many,
    whose keys are ``keys``). ``mode`` (None but for put) and ``durable`` are put's,
    ``start_after`` and ``limit`` list's.
    """

    operation: Operation
    key: str = ""
    keys: tuple[str, ...] = ()
    mode: PutMode | None = None
    durable: bool = True
    start_after: str | None = None
    limit: int | None = None


class StoreWrapper:
    """Delegates to ``inner``; every call but :meth:`close` goes through :meth:`around`.

    Subclasses override :meth:`around` (the default just runs the call). ``close()`` and
    ``repr()`` forward to ``inner``.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        """Run ``call`` on the inner store (``await run()``) and return its result. Code
        before ``run()`` sees the call before the store does; code after it, the result;
        an exception from ``run()`` is the store's error."""
        return await run()

    async def get(self, key: str) -> StoredObject:
        return await self.around(StoreCall("get", key), lambda: self.inner.get(key))

    async def head(self, key: str) -> ObjectMeta:
        return await self.around(StoreCall("head", key), lambda: self.inner.head(key))

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        call = StoreCall("put", key, mode=mode, durable=durable)
        return await self.around(call, lambda: self.inner.put(key, data, mode, durable=durable))

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        call = StoreCall("list", prefix, start_after=start_after, limit=limit)
        return await self.around(call, lambda: self.inner.list(prefix, start_after, limit))

    async def delete(self, key: str) -> None:
        await self.around(StoreCall("delete", key), lambda: self.inner.delete(key))

    async def delete_many(self, keys: Sequence[str]) -> None:
        call = StoreCall("delete_many", keys=tuple(keys))
        await self.around(call, lambda: self.inner.delete_many(keys))

    async def close(self) -> None:
        await self.inner.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


if TYPE_CHECKING:

    def _satisfies_protocol(store: StoreWrapper) -> Store:
        return store
