"""Runs: one lease for the messages of one second (docs/protocol.md, "Runs").

A ``.run`` message's lease is its second's (:func:`pawn_queue._protocol.layout.run_end`).
Its holder takes in, with no request, the messages of that second it finds while the lease
is safely its own; acks delete each; once none is handed out here, the lease is deleted
``RUN_GRACE_SECONDS`` after its second (a message of it may land until then).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from pawn_queue._internal.aio import Background
from pawn_queue._protocol import layout
from pawn_queue._protocol.lease_protocol import Lease, LeaseProtocol, ResolvedStrategy
from pawn_queue._protocol.tombstones import Tombstones
from pawn_queue.config import ConcurrencyConfig
from pawn_queue.store.base import Store

SETTLED_SECONDS = 60.0  # how long a message settled here is remembered: longer than a listing
SETTLED_MEMORY = 10_000  # how many are, at most (then the stale ones are forgotten)
RUN_GRACE_SECONDS = 1.0
"""How long a run's lease outlives its second: a message stamped in it may land until then."""
RUN_LOOK_SECONDS = 0.25
"""How long after its second a run's holder lists its topic again: a message stamped in the
second has landed by then, as a rule (a publish's request)."""


class RunLeases(LeaseProtocol):
    """The leases held and claimed here, and what a run's lease does beyond any lease's:
    the base of :class:`~pawn_queue._protocol.leases.LeaseManager`, which claims, releases
    and lets expire."""

    def __init__(
        self,
        store: Store,
        strategy: ResolvedStrategy,
        concurrency: ConcurrencyConfig,
        clock: Callable[[], datetime],
        background: Background,
    ) -> None:
        super().__init__(store, strategy, concurrency, clock)
        self._held_here: dict[str, Lease] = {}
        self._claiming_here: set[str] = set()
        self._settled_here: dict[str, float] = {}  # message key -> until when (monotonic)
        self._closing_runs = Tombstones(self._close_run, background)
        # Told of a topic the consumers here are to list again (:meth:`_look_again`).
        self.on_look: Callable[[str], None] | None = None

    def _hold(self, lease: Lease) -> None:
        """Hold ``lease`` here; the holder of a run whose second is not over looks at its
        topic again just after it (:meth:`_look_again`)."""
        self._held_here[lease.key] = lease
        end = _run_end(lease)
        if end is not None:
            delay = (end - self.clock()).total_seconds() + RUN_LOOK_SECONDS
            if delay > 0:
                asyncio.get_running_loop().call_later(delay, self._look_again, lease)

    def _look_again(self, lease: Lease) -> None:
        """List the topic of a run still held here that took in more than one message: its
        messages that landed since the last listing are taken in now, not at the listing
        the change signals bring next (under a per-key write limit they come up to a
        second apart, and processes that share a topic check them less often). A run of
        one message, as at a trickle, would pay a listing a message for nothing."""
        if self._held_here.get(lease.key) is lease and lease.joined and self.on_look:
            self.on_look(lease.topic)

    def _let_go(self, lease: Lease) -> None:
        """Forget that ``lease`` is held here (not another lease of that key held since)."""
        if self._held_here.get(lease.key) is lease:
            del self._held_here[lease.key]

    def _leased_here(self, key: str) -> bool:
        return key in self._held_here or key in self._claiming_here

    def _taken_in_here(self, key: str, message_key: str) -> bool:
        """Whether a message whose lease is held or claimed here is a run's that its holder
        here takes in: now, or once the claim of its run in flight is won (until then each
        poll looks again, so it is not left behind)."""
        if key in self._claiming_here:
            return layout.run_end(layout.lease_id_of(key)) is not None
        return self._joinable(key, message_key) is not None

    def claiming(self, topic: str, lease_id: str) -> bool:
        """Whether a claim of this lease is in flight here (:meth:`reserve`)."""
        return layout.lease_key(topic, lease_id) in self._claiming_here

    def _note_settled(self, message_key: str) -> None:
        now = time.monotonic()
        if len(self._settled_here) >= SETTLED_MEMORY:
            self._settled_here = {k: t for k, t in self._settled_here.items() if t > now}
        self._settled_here[message_key] = now + SETTLED_SECONDS

    def _joinable(self, key: str, message_key: str) -> Lease | None:
        """The run's lease at ``key`` if it is held here and may take ``message_key`` in
        without a claim: open, safe for a while, and the message not taken in or settled."""
        lease = self._held_here.get(key)
        if (
            lease is None
            or lease.members is None
            or message_key in lease.members
            or message_key in self._settled_here
            or not self.comfortably_held(lease)
        ):
            return None
        return lease

    def join_run(
        self, topic: str, lease_id: str, message_key: str, consumer_id: str
    ) -> Lease | None:
        """The run's lease held here by ``consumer_id`` that covers ``message_key``, with the
        message taken in as its member (to settle as any other); None if there is none."""
        lease = self._joinable(layout.lease_key(topic, lease_id), message_key)
        if lease is None or lease.body.consumer_id != consumer_id:
            return None
        lease.members.add(message_key)  # type: ignore[union-attr]
        lease.joined = True
        return lease

    def member_done(self, lease: Lease, message_key: str, *, unsettled: bool = False) -> None:
        """A message of the run ``lease`` covers (if it is a run's) is settled, or
        ``unsettled`` (its handler left it: it comes back once the lease expired). When it
        was the last one handed out, the lease is deleted ``RUN_GRACE_SECONDS`` after its
        second (a message of it may still land until then), or left to expire if one was
        left unsettled."""
        members = lease.members
        if members is None:
            return
        members.discard(message_key)
        if not unsettled:  # a listing made before its delete still shows it: not taken in
            self._note_settled(message_key)
        lease.left_unsettled |= unsettled
        if members or lease.lost or lease.released:
            return
        if lease.left_unsettled:
            self.let_expire(lease)
            return
        end = _run_end(lease)
        seconds = 0.0 if end is None else (end - self.clock()).total_seconds()
        self._closing_runs.keep(lease, max(0.0, seconds + RUN_GRACE_SECONDS))

    def closes_in_time(self, lease: Lease) -> bool:
        """Whether ``lease`` is a run's with no message handed out here that is deleted
        (``RUN_GRACE_SECONDS`` after its second) while still safely held: refreshing it
        meanwhile would be a write for nothing."""
        end = _run_end(lease)
        if end is None or lease.members:
            return False
        closes = end + timedelta(seconds=RUN_GRACE_SECONDS)
        return (lease.expires - closes).total_seconds() > 2 * self._window(lease)

    async def _close_run(self, lease: Lease) -> None:
        """Delete a run's lease that no message handed out here waits for (rule 4: they are
        all deleted); messages of its second that land later are claimed anew."""
        async with lease.lock:
            if lease.members or lease.lost or lease.released:
                return
            self._let_go(lease)  # no message is taken in from here on
        await self.release_gone(lease)

    def let_expire(self, lease: Lease) -> None:
        raise NotImplementedError

    async def release_gone(self, lease: Lease) -> None:
        raise NotImplementedError


def _run_end(lease: Lease) -> datetime | None:
    """When the second of a run's lease is over; None for any other lease."""
    return None if lease.members is None else layout.run_end(layout.lease_id_of(lease.key))
