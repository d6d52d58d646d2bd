"""Tombstones: the lease of an acked message, kept a while after the message is deleted.

A publish whose answer was lost looks for its message, then for a lease naming it, before
it writes again (:mod:`pawn_queue._protocol.landing`): a consumer may have claimed and acked the
message in between. So on a store that can lose an answer (S3), the consumer that settled a
message deletes its lease not at once but ``TOMBSTONE_SECONDS`` later, or two safety windows
before the lease would expire if that comes first. The lease is still live and still its
own then: the delete needs no write first (rule 3), and it costs what an immediate one would
(deletes due together share one request). A stop or teardown deletes them all at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from pawn_queue._internal.aio import Background

if TYPE_CHECKING:
    from pawn_queue._protocol.lease_protocol import Lease

TOMBSTONE_SECONDS = 30.0
"""The longest an acked message's lease is kept (the default S3 request timeout)."""

_EARLY_SECONDS = 0.01  # a delete this much early costs nothing: it has a window to spare


class Tombstones:
    """Leases to delete later, each at its own time, by ``delete`` run in ``background``."""

    def __init__(
        self, delete: Callable[[Lease], Coroutine[Any, Any, None]], background: Background
    ) -> None:
        self._delete = delete
        self._background = background
        self._due: list[tuple[float, int, Lease]] = []  # (loop time, tie-breaker, lease)
        self._kept: dict[str, Lease] = {}  # lease key -> lease, for what is in _due
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: str) -> bool:
        return key in self._kept

    def keep(self, lease: Lease, seconds: float) -> None:
        """Delete ``lease`` in ``seconds``."""
        loop = asyncio.get_running_loop()
        at = loop.time() + seconds
        heapq.heappush(self._due, (at, next(self._order), lease))
        self._kept[lease.key] = lease
        if self._timer is None or at < self._timer.when():
            self._schedule(loop)

    def take_superseded(self, key: str, message_key: str) -> Lease | None:
        """The kept lease ``key`` if it covers another message than ``message_key`` (one with
        the same id: a replayed copy), no longer kept; None otherwise."""
        lease = self._kept.get(key)
        if lease is None or lease.message_key == message_key:
            return None
        del self._kept[key]  # its entry in _due is skipped when it comes up
        return lease

    def flush(self) -> None:
        """Start deleting every kept lease now (awaited through ``background``)."""
        self._start(float("inf"))

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._due[0][0], self._expire) if self._due else None

    def _expire(self) -> None:
        # A timer may fire a hair before its time (the loop's clock resolution).
        self._start(asyncio.get_running_loop().time() + _EARLY_SECONDS)

    def _start(self, until: float) -> None:
        """Start the deletes due by ``until``, all in this loop turn (so they share requests)."""
        while self._due and self._due[0][0] <= until:
            lease = heapq.heappop(self._due)[2]
            if self._kept.get(lease.key) is lease:
                del self._kept[lease.key]
                self._background.start(self._delete(lease))
        if self._timer is not None or self._due:
            self._schedule(asyncio.get_running_loop())
