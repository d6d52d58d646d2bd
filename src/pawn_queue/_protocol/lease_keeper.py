"""The leases one consumer (or one streaming query) holds, kept alive until they are let go.

:class:`LeaseKeeper` is the one refresh loop of the project: every ``interval`` seconds it
refreshes each held lease on its own (a slow or stalled request must not hold back the
refreshes of the others: their leases would run out meanwhile). It stops only between
rounds, never mid-write, since a cancelled request can still land after a release and
resurrect the lease. The lease operations themselves are
:class:`~pawn_queue._protocol.leases.LeaseManager`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta

from pawn_queue._internal.aio import IO_CONCURRENCY, gather_limited
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue.exceptions import LeaseLostError

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """Holds leases and refreshes them in the background until they are forgotten (settled,
    abandoned, lost) or released."""

    def __init__(self, leases: LeaseManager, interval: float) -> None:
        self._leases = leases
        self._interval = interval
        self._held: dict[str, Lease] = {}
        self._loop: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.paused = False  # no refreshes while set: stands in for a stalled process
        self._round = asyncio.Event()  # set, and replaced, as each round has started its refreshes

    def hold(self, lease: Lease) -> None:
        """Keep ``lease`` refreshed until it is forgotten or released."""
        self._held[lease.key] = lease
        if self._loop is None or self._loop.done():
            self._stop = asyncio.Event()
            self._loop = asyncio.create_task(self._refresh_loop(self._stop))

    def forget(self, lease: Lease) -> None:
        """Stop refreshing ``lease`` (settled, or left to expire)."""
        if self._held.get(lease.key) is lease:
            del self._held[lease.key]

    def get(self, key: str) -> Lease | None:
        """The held lease at ``key``, if any."""
        return self._held.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._held.values()))

    def __len__(self) -> int:
        return len(self._held)

    async def release(self, leases: list[Lease], *, counted: bool = True) -> None:
        """Give ``leases`` back (their messages stay pending), concurrently; a failure is
        logged (the lease then expires). ``counted=False``: a stop, whose delivery does not
        count as a receive."""
        for lease in leases:
            self.forget(lease)
        results = await gather_limited(
            IO_CONCURRENCY, (self._leases.release(lease, counted=counted) for lease in leases)
        )
        for lease, result in zip(leases, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("lease release failed key=%s error=%s", lease.key, result)

    async def stop(self) -> None:
        """Stop refreshing, between rounds (the leases stay held until they expire)."""
        if self._loop is not None:
            self._stop.set()
            await self._loop
            self._loop = None

    async def release_all(self) -> None:
        """Stop refreshing and release every held lease without counting a receive
        (rule 10)."""
        await self.stop()
        await self.release(list(self._held.values()), counted=False)

    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        running: dict[str, asyncio.Task[None]] = {}
        slots = asyncio.Semaphore(IO_CONCURRENCY)
        try:
            while self._held:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._interval)
                if stop.is_set():
                    return
                if self.paused:
                    continue
                for key in [k for k in running if running[k].done()]:
                    del running[key]
                for lease in list(self._held.values()):
                    if lease.released or lease.lost or lease.expiring:  # a run's, done
                        self.forget(lease)
                    elif lease.key not in running and self._due(lease):
                        running[lease.key] = asyncio.create_task(self._refresh(lease, slots))
                done, self._round = self._round, asyncio.Event()
                done.set()
        finally:
            # Never stop mid-write: a cancelled request can still land after the release.
            await asyncio.gather(*running.values(), return_exceptions=True)

    async def next_round(self) -> None:
        """Wait until the next round of refreshes has started."""
        await self._round.wait()

    def _due(self, lease: Lease) -> bool:
        """Whether ``lease`` is refreshed this round: not if it was written a moment ago (a
        claim just before the round). The next round then comes at most that much later in
        its life than a refresh's usually does, and a store that limits writes per key
        would refuse a write within the second of the last (docs/protocol.md, "Request
        rates"). Nor a run's lease that is only waiting to be deleted."""
        if self._leases.closes_in_time(lease):
            return False
        moment = min(1.0, self._interval / 4, max(0.0, lease.visibility - self._interval) / 4)
        written = lease.expires - timedelta(seconds=lease.visibility)
        return (self._leases.clock() - written).total_seconds() >= moment

    async def _refresh(self, lease: Lease, slots: asyncio.Semaphore) -> None:
        async with slots:
            try:
                await self._leases.refresh(lease)
            except LeaseLostError:
                self.forget(lease)
            except Exception as exc:
                logger.warning("lease refresh failed key=%s error=%s", lease.key, exc)
