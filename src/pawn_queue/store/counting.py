"""A store wrapper that counts requests by operation: for request budgets and benchmarks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from pawn_queue.store.base import LIST_PAGE, IfMatch, ObjectMeta, Store
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")


class CountingStore(StoreWrapper):
    """Delegates to ``inner`` and counts each call as the S3 requests it stands for.

    Keys of :attr:`counts`: ``GET``, ``HEAD``, ``LIST``, ``DELETE``, and ``PUT`` split by mode
    (``PUT``, ``PUT create``, ``PUT if-match``). A listing counts one request per page of
    1,000 keys it returned (at least one), a ``delete_many`` one per 1,000 keys. Failed
    requests count too, they cost the same; a failed listing, whose pages are unknown, does
    not.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()

    def reset(self) -> Counter[str]:
        """Return the counts so far and start again from zero."""
        counts, self.counts = self.counts, Counter()
        return counts

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "list":
            result = await run()
            pages = -(-len(cast("list[ObjectMeta]", result)) // LIST_PAGE)
            self.counts["LIST"] += max(1, pages)
            return result
        if call.operation == "put":
            if isinstance(call.mode, IfMatch):
                self.counts["PUT if-match"] += 1
            else:
                self.counts["PUT create" if call.mode == "create" else "PUT"] += 1
        elif call.operation == "delete_many":
            self.counts["DELETE"] += -(-len(call.keys) // LIST_PAGE)
        else:
            self.counts[call.operation.upper()] += 1
        return await run()
