"""The dashboard's own cost: every request it sends to the store, counted and timed."""

from __future__ import annotations

import math
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


@dataclass(frozen=True, slots=True)
class Cost:
    """What the dashboard's reads cost: in total, and over the last minute. At start it reads
    everything once, a burst that is no rate: until a minute has passed, it says what it sent
    so far and in how long, not that scaled to a minute."""

    total: int
    by_operation: dict[str, int]
    last_minute: int  # requests in the last minute, or since start while younger
    window_seconds: float  # the last minute, or the seconds since start while younger
    per_minute: int | None  # last_minute once a minute has passed, else None
    summary: str  # "91 requests in the last minute", "131 requests in the first 12 s"


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
        age = now - self._started
        requests = f"{last_minute} request{'' if last_minute == 1 else 's'}"
        if age >= WINDOW_SECONDS:
            per_minute: int | None = last_minute
            summary = f"{requests} in the last minute"
        else:
            per_minute = None
            summary = f"{requests} in the first {max(1, math.ceil(age))} s"
        return Cost(
            total=self.counts.total(),
            by_operation=dict(sorted(self.counts.items())),
            last_minute=last_minute,
            window_seconds=round(min(age, WINDOW_SECONDS), 1),
            per_minute=per_minute,
            summary=summary,
        )

    def recent_by_operation(self) -> Counter[str]:
        """The last minute's requests by operation."""
        self._forget(self._clock())
        counts: Counter[str] = Counter()
        for _, operation, count in self._recent:
            counts[operation] += count
        return counts
