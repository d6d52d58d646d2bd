"""The dashboard's own cost: every request it sends to the store, counted and timed."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pawn_queue.store.base import Store
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.wrapper import StoreCall

T = TypeVar("T")

WINDOW_SECONDS = 60.0
_MIN_WINDOW_SECONDS = 10.0  # a younger dashboard's first reads are not a rate yet


@dataclass(frozen=True, slots=True)
class Cost:
    """What the dashboard's reads cost: in total, and over the last minute."""

    total: int
    by_operation: dict[str, int]
    last_minute: int
    window_seconds: float  # the last minute, or less while the dashboard is younger
    per_minute: float  # last_minute scaled to a minute


class RequestMeter(CountingStore):
    """A :class:`CountingStore` that also remembers when each request was sent, so the page
    can say what the last minute cost (requests as S3 bills them: a LIST page is one)."""

    def __init__(self, inner: Store, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(inner)
        self._clock = clock
        self._started = clock()
        self._recent: deque[tuple[float, str, int]] = deque()

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        # CountingStore counts a listing after it returned and any other call before it
        # runs; each difference is taken with no await in between, so concurrent calls are
        # never counted twice.
        before = self.counts.copy()

        async def marked() -> T:
            nonlocal before
            if call.operation != "list":
                self._note(self.counts - before)
            try:
                return await run()
            finally:
                before = self.counts.copy()

        try:
            return await super().around(call, marked)
        finally:
            if call.operation == "list":
                self._note(self.counts - before)

    def _note(self, counts: Counter[str]) -> None:
        now = self._clock()
        for operation, count in counts.items():
            self._recent.append((now, operation, count))
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - WINDOW_SECONDS:
            self._recent.popleft()

    def cost(self) -> Cost:
        now = self._clock()
        self._forget(now)
        last_minute = sum(count for _, _, count in self._recent)
        window = min(WINDOW_SECONDS, max(now - self._started, _MIN_WINDOW_SECONDS))
        return Cost(
            total=self.counts.total(),
            by_operation=dict(sorted(self.counts.items())),
            last_minute=last_minute,
            window_seconds=round(window, 1),
            per_minute=round(last_minute * 60.0 / window, 1),
        )

    def recent_by_operation(self) -> Counter[str]:
        """The last minute's requests by operation."""
        self._forget(self._clock())
        counts: Counter[str] = Counter()
        for _, operation, count in self._recent:
            counts[operation] += count
        return counts
