"""A store wrapper that acts like a provider's request limits (docs/protocol.md, "Request
rates"): about one write a second to one key (Google Cloud Storage, Cloudflare R2, Storj)
and a request rate per bucket (Hetzner: 750 a second), refused as the providers refuse them,
with :class:`StoreThrottledError` and a ``retry_after``.

Put beneath a :class:`ThrottleBackoff` (:func:`limited`), as an S3 store sits beneath its
own, so the queue meets the refusals as it meets a throttling provider's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pawn_queue.exceptions import StoreThrottledError
from pawn_queue.store.base import Store
from pawn_queue.store.throttling import ThrottleBackoff
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")


class LimitingStore(StoreWrapper):
    """Refuses a write to a key within ``per_key_seconds`` of the last one sent to it
    (refused conditional writes count: the store saw them), and any request beyond
    ``per_second`` (a token bucket holding one second's worth)."""

    def __init__(
        self,
        inner: Store,
        *,
        per_key_seconds: float | None = 1.0,
        per_second: float | None = None,
        retry_after: float = 1.0,
    ) -> None:
        super().__init__(inner)
        self.per_key_seconds = per_key_seconds
        self.per_second = per_second
        self.retry_after = retry_after
        self.refused: Counter[str] = Counter()
        """Refusals by kind: ``key`` (the per-key limit), ``rate`` (the request rate)."""
        self.refused_keys: Counter[str] = Counter()
        """Refusals by the key (list: prefix) of the call refused; a ``delete_many``
        counts for each of its keys."""
        self.writes: Counter[tuple[str, int]] = Counter()
        """Writes sent on to the store, by key and wall-clock second."""
        self._last_write: dict[str, float] = {}
        self._refuse_all_until = 0.0
        self._tokens = per_second or 0.0
        self._filled = time.monotonic()

    def refuse_everything(self, seconds: float) -> None:
        """Refuse every request for the next ``seconds`` (a store throttling a burst)."""
        self._refuse_all_until = time.monotonic() + seconds

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        now = time.monotonic()
        if now < self._refuse_all_until:
            self._refuse("rate", call)
        if self.per_second is not None:
            self._tokens = min(
                self.per_second, self._tokens + (now - self._filled) * self.per_second
            )
            self._filled = now
            if self._tokens < 1:
                self._refuse("rate", call)
            self._tokens -= 1
        written = _written_keys(call)
        if self.per_key_seconds is not None:
            for key in written:
                last = self._last_write.get(key)
                if last is not None and now - last < self.per_key_seconds:
                    self._refuse("key", call)
        second = int(time.time())
        for key in written:
            self._last_write[key] = now
            self.writes[key, second] += 1
        return await run()

    def hottest(self) -> tuple[str, int]:
        """The key written most in one second, and how many times (``("", 0)``: none)."""
        if not self.writes:
            return "", 0
        (key, _), count = self.writes.most_common(1)[0]
        return key, count

    def _refuse(self, kind: str, call: StoreCall) -> None:
        self.refused[kind] += 1
        self.refused_keys.update(call.keys if call.operation == "delete_many" else (call.key,))
        what = "per-key write limit" if kind == "key" else "request rate"
        raise StoreThrottledError(
            f"{call.operation} {call.key!r} refused: {what} (test limit)",
            retry_after=self.retry_after,
        )


def limited(
    store: Store, *, per_key_seconds: float | None = 1.0, per_second: float | None = None
) -> tuple[Store, LimitingStore]:
    """``store`` beneath a limit and a backoff; the store to use, and the limit (to read)."""
    limit = LimitingStore(store, per_key_seconds=per_key_seconds, per_second=per_second)
    return ThrottleBackoff(limit), limit


def _written_keys(call: StoreCall) -> tuple[str, ...]:
    if call.operation in ("put", "delete"):
        return (call.key,)
    if call.operation == "delete_many":
        return call.keys
    return ()
