"""Back-pressure for a store that refuses requests for its request rate.

Providers cap request rates: about one write a second to one key (Google Cloud Storage,
Cloudflare R2, Storj), a few hundred requests a second per bucket (Hetzner, Backblaze B2),
thousands per prefix (AWS). Past a cap they answer 429 or 503 ``SlowDown``, which the store
raises as :class:`~pawn_queue.exceptions.StoreThrottledError`. Such a request was not
applied, whatever it was (a conditional write included), so it is safe to send again.

:class:`ThrottleBackoff` sends it again after a pause that starts at one second (the window
of a per-key limit) and doubles up to 16 s, with jitter so that processes refused together
do not come back together, or after the store's ``Retry-After`` when it said one and asked
for longer. The caller sees the error only once ``timeout_seconds`` have passed
(docs/protocol.md, "Request rates").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from pawn_queue.exceptions import StoreThrottledError
from pawn_queue.store.base import Store
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

__all__ = [
    "DEFAULT_THROTTLE_TIMEOUT_SECONDS",
    "ThrottleBackoff",
    "ThrottlePauses",
    "first_refusal_raised",
    "throttle_backoff_of",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_THROTTLE_TIMEOUT_SECONDS = 60.0
FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 16.0
_LOG_EVERY_SECONDS = 60.0

ThrottleListener = Callable[[StoreCall], None]

_FIRST_REFUSAL_RAISED: ContextVar[bool] = ContextVar("first_refusal_raised", default=False)


@contextlib.contextmanager
def first_refusal_raised() -> Iterator[None]:
    """Within it, a call refused for the store's request rate raises StoreThrottledError at
    once (counted and logged as any refusal), for a caller that learns more from a read
    than from waiting to send it again: a claim's create refused because its key was
    written within the second, most likely by the claimer that won it."""
    token = _FIRST_REFUSAL_RAISED.set(True)
    try:
        yield
    finally:
        _FIRST_REFUSAL_RAISED.reset(token)


class ThrottleBackoff(StoreWrapper):
    """Resends what ``inner`` refused for its request rate, backing off, for up to
    ``timeout_seconds`` per call; then the caller gets the StoreThrottledError."""

    def __init__(
        self,
        inner: Store,
        timeout_seconds: float = DEFAULT_THROTTLE_TIMEOUT_SECONDS,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(inner)
        self.timeout_seconds = timeout_seconds
        self.throttled = 0
        """Answers refused for the request rate so far (each resend that is refused counts)."""
        self.listeners: list[ThrottleListener] = []
        """Called with each refused call (metrics count them)."""
        self.limits_writes_per_key = False
        """Whether the store is known to refuse a write to a key within about a second of
        the last (the strategy probe was refused so): a young message's delete waits for
        its second from the start, not from a first refusal (docs/protocol.md, "Request
        rates")."""
        self._sleep = sleep
        self._unlogged: Counter[str] = Counter()
        self._logged_at = time.monotonic() - _LOG_EVERY_SECONDS

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        began = time.monotonic()
        pauses = ThrottlePauses()
        while True:
            try:
                return await run()
            except StoreThrottledError as exc:
                self._refused(call)
                if _FIRST_REFUSAL_RAISED.get():
                    raise
                wait = pauses.next(exc)
                if time.monotonic() - began + wait > self.timeout_seconds:
                    raise
            await self._sleep(wait)

    def __repr__(self) -> str:
        return repr(self.inner)  # a part of every store opened from a config, not a layer

    def _refused(self, call: StoreCall) -> None:
        self.throttled += 1
        for listener in self.listeners:
            listener(call)
        self._unlogged[call.key or call.operation] += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_SECONDS:
            # One line a minute at most, however hard the store pushes back.
            key, most = self._unlogged.most_common(1)[0]
            logger.warning(
                "the store refused %d request(s) for its request rate (HTTP 429 or 503 "
                "SlowDown), most for %r (%d); backing off (one such line a minute at most)",
                sum(self._unlogged.values()),
                key,
                most,
            )
            self._unlogged.clear()
            self._logged_at = now


class ThrottlePauses:
    """The pauses between the sends of one request the store refuses for its rate: 1 s,
    doubling to 16 s, each with up to 50 % jitter, or the store's Retry-After if longer."""

    def __init__(self) -> None:
        self._step = FIRST_PAUSE_SECONDS

    def next(self, refusal: StoreThrottledError) -> float:
        """The pause before the next send, after ``refusal``."""
        wait = max(self._step * random.uniform(1.0, 1.5), refusal.retry_after or 0.0)
        self._step = min(self._step * 2, MAX_PAUSE_SECONDS)
        return wait


def throttle_backoff_of(store: Store) -> ThrottleBackoff | None:
    """The ThrottleBackoff in ``store``'s chain of wrappers, if there is one."""
    while isinstance(store, StoreWrapper):
        if isinstance(store, ThrottleBackoff):
            return store
        store = store.inner
    return None
