"""A store wrapper that injects failures and pauses at the store boundary."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pawn_queue.store.base import Store
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")

Hook = Callable[[str, str], Awaitable[None]]


@dataclass(repr=False)
class FaultyStore(StoreWrapper):
    """Delegates to ``inner``. ``hooks`` run before each call and may raise or pause it;
    ``observers`` run after a put or delete that succeeded. Both get ``(operation, key)``:
    the prefix for a list, and one ``("delete", key)`` per key of a delete_many."""

    inner: Store
    hooks: list[Hook] = field(default_factory=list)
    observers: list[Hook] = field(default_factory=list)

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "delete_many":
            for key in call.keys:
                await self._before("delete", key)
            result = await run()
            for key in call.keys:
                await self._after("delete", key)
            return result
        await self._before(call.operation, call.key)
        result = await run()
        if call.operation in ("put", "delete"):
            await self._after(call.operation, call.key)
        return result

    async def _before(self, operation: str, key: str) -> None:
        for hook in list(self.hooks):
            await hook(operation, key)

    async def _after(self, operation: str, key: str) -> None:
        for observer in list(self.observers):
            await observer(operation, key)
