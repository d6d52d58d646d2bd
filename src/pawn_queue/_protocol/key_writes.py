"""When a message object may be deleted on a store that limits writes per key.

Google Cloud Storage, Cloudflare R2 and Storj refuse a write to a key within about a second
of the last one, a delete included (docs/protocol.md, "Request rates"). A message acked
within a second of its publish has its delete refused, then sent again after the backoff's
pause of one to one and a half seconds, often refused again. Once this process saw the
delete of such a young message refused, or from the start where the store's probe was
refused so (:mod:`pawn_queue._protocol.strategy`), it deletes a message no sooner than a
second after the time its name says it was written: the delete is sent once, when it can
land, and the ack returns sooner than after a refusal and its pause.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from datetime import datetime

from pawn_queue._protocol import layout
from pawn_queue.store.throttling import ThrottleBackoff
from pawn_queue.store.wrapper import StoreCall

__all__ = ["KeyWriteLimit"]

_KEY_WRITE_SECONDS = 1.0
"""The per-key write window of the providers that have one."""

_LANDING_SECONDS = 0.25
"""How long after the time in its name a message's write may land (a publish's request)."""

_LEARNED_SECONDS = 600.0
"""How long a refusal is remembered: every new one renews it."""


class KeyWriteLimit:
    """Whether the store showed a per-key write limit, and how long a message's delete then
    waits. :meth:`refused` listens to the store's refusals (a ThrottleBackoff listener)."""

    def __init__(self, clock: Callable[[], datetime], backoff: ThrottleBackoff | None) -> None:
        """``backoff``: the store's, whose refusals this learns from; where the store's probe
        showed the limit, it holds from the start, for good."""
        self._clock = clock
        known = backoff is not None and backoff.limits_writes_per_key
        self._until = math.inf if known else 0.0  # monotonic: while limited
        if backoff is not None:
            backoff.listeners.append(self.refused)

    @property
    def limited(self) -> bool:
        return time.monotonic() < self._until

    def refused(self, call: StoreCall) -> None:
        """A request the store refused for its rate: a delete of a message written less than
        a second ago shows a per-key limit (or a bucket's rate limit, under which waiting for
        the second costs little)."""
        if call.operation == "delete":
            keys: Iterable[str] = (call.key,)
        elif call.operation == "delete_many":
            keys = call.keys
        else:
            return
        if any(self._wait(key) > 0 for key in keys):
            self._until = max(self._until, time.monotonic() + _LEARNED_SECONDS)

    async def before_delete(self, keys: Iterable[str]) -> None:
        """Wait, while limited, until the youngest message of ``keys`` is past its key's
        second; a delayed message (named for when it is due) or another key: no wait."""
        if self.limited:
            wait = max((self._wait(key) for key in keys), default=0.0)
            if wait > 0:
                await asyncio.sleep(wait)

    def _wait(self, key: str) -> float:
        written = layout.due_from_key(key)
        if written is None or layout.is_delayed_key(key):
            return 0.0
        age = (self._clock() - written).total_seconds()
        return max(0.0, _KEY_WRITE_SECONDS + _LANDING_SECONDS - age)
