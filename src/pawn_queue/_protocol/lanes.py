"""Lanes: how competing consumers of one topic spread out without coordination.

Messages are split into ``LANES`` lanes by a hash of their lease id. Alone, a consumer
claims in key order; once it met a competitor (a claim refused, or a claimed message gone),
it works one lane for ``_CONTENTION_MEMORY_SECONDS``: it claims only candidates of that lane,
oldest first, until it loses a race there (the lane is then avoided for
``_CROWDED_SECONDS``) or the lane runs dry, and moves to the lane that looks least worked,
or at once to a lane whose oldest message waits ``_LANE_LAG`` longer than its own (nobody
works that lane), or whose first message has a higher priority than its own. See
docs/protocol.md, strategy ``conditional_write``.
"""

from __future__ import annotations

import random
import time
import zlib
from datetime import timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.runtime import Runtime

LANES = 8
LANE_WIDTH = 4  # page size under contention, in claims per poll and lane
_CONTENTION_MEMORY_SECONDS = 30.0
_CROWDED_SECONDS = 5.0  # how long a lane where a claim was lost is avoided
_LANE_LAG = timedelta(seconds=1)  # how much longer another lane's oldest message may wait

Candidates = list[tuple[layout.PendingKey, str]]  # (what a key holds, the key), in key order


def claims_for(candidates: list[tuple[layout.PendingKey, str]], wanted: int) -> int:
    """How many of ``candidates`` to claim at once for ``wanted`` messages when consumers
    compete: up to the first batch object. It may hold them all; claiming past it would take
    messages the poll does not need from the others, and lose races for them. (Alone, a
    consumer claims a poll's worth of candidates at once: no race, one round trip.)"""
    for count, (pending, _) in enumerate(candidates[:wanted], start=1):
        if pending.kind == "batch":
            return count
    return wanted


def lane_of(lease_id: str) -> int:
    """The lane of the message (or group) whose lease is ``lease_id``."""
    return zlib.crc32(lease_id.encode()) % LANES


def _lane(pending: layout.PendingKey) -> int:
    return lane_of(pending.lease_id())


def _of_lane(candidates: Candidates, lane: int) -> Candidates:
    return [c for c in candidates if _lane(c[0]) == lane]


def _waits_longer(first_key: str, key: str) -> bool:
    """Whether the message at ``first_key`` (the listing's first) has a higher priority
    than the one at ``key``, or became due ``_LANE_LAG`` before it."""
    if layout.priority_of(first_key) != layout.priority_of(key):
        return layout.priority_of(first_key) > layout.priority_of(key)
    oldest, due = layout.due_from_key(first_key), layout.due_from_key(key)
    return oldest is not None and due is not None and due - oldest > _LANE_LAG


class Lanes:
    """One consumer's lanes, per topic."""

    def __init__(self, runtime: Runtime, visibility: float) -> None:
        self._store = runtime.store
        self._leases = runtime.leases
        self._clock = runtime.clock
        self._visibility = visibility
        self._contended_until: dict[str, float] = {}
        self._lane: dict[str, int] = {}  # topic -> the lane claimed in while contended
        self._crowded: dict[str, dict[int, float]] = {}  # topic -> lane -> avoided until

    def contended(self, topic: str) -> bool:
        """Whether other consumers competed for this topic's messages lately."""
        return time.monotonic() < self._contended_until.get(topic, 0.0)

    def met_competitor(self, topic: str) -> None:
        """Another consumer won a claim here: this lane is crowded, the next poll moves."""
        now = time.monotonic()
        self._contended_until[topic] = now + _CONTENTION_MEMORY_SECONDS
        lane = self._lane.pop(topic, None)
        if lane is not None:
            self._crowded.setdefault(topic, {})[lane] = now + _CROWDED_SECONDS

    def work_in(self, topic: str, lane: int) -> None:
        """Work ``lane`` of a contended ``topic``: the state a lost claim race leaves."""
        self.met_competitor(topic)
        self._lane[topic] = lane

    def in_lane(self, topic: str, candidates: Candidates) -> Candidates | None:
        """The candidates in this consumer's lane; None if it has no lane or the lane ran dry."""
        lane = self._lane.get(topic)
        if lane is None:
            return None
        return _of_lane(candidates, lane) or None

    async def candidates(self, topic: str, candidates: Candidates) -> Candidates:
        """The candidates of this consumer's lane. It moves when the lane ran dry or another
        lane's oldest message waits ``_LANE_LAG`` longer than its own (nobody works that
        lane: it goes there, oldest first) or has a higher priority; otherwise to the lane
        with candidates that looks least worked (not crowded for us lately, with the fewest
        fresh leases). One LIST of the lease prefix shows that, and costs less than the
        create-only PUTs (and GETs) a race with another consumer would waste."""
        if not candidates:
            return []
        mine = self.in_lane(topic, candidates)
        neglected = mine is not None and _waits_longer(candidates[0][1], mine[0][1])
        if mine is not None and not neglected:
            return mine
        fresh_after = self._clock() - timedelta(seconds=self._visibility)
        occupied: dict[int, int] = {}
        leased: set[str] = set()
        for meta in await self._store.list(layout.leases_prefix(topic)):
            if meta.last_modified > fresh_after:
                lease_id = layout.lease_id_of(meta.key)
                leased.add(lease_id)
                lane = lane_of(lease_id)
                occupied[lane] = occupied.get(lane, 0) + 1
        candidates = [
            (pending, key)
            for pending, key in candidates
            if pending.lease_id() not in leased
            or self._leases.expiry_known(topic, pending.lease_id())
        ]
        if not candidates:
            return []
        if neglected:
            self._lane[topic] = lane = _lane(candidates[0][0])
            return _of_lane(candidates, lane)
        now = time.monotonic()
        crowded = self._crowded.get(topic, {})
        lanes = sorted({_lane(pending) for pending, _ in candidates})
        score = {n: (crowded.get(n, 0.0) > now, occupied.get(n, 0)) for n in lanes}
        best = min(score.values())
        self._lane[topic] = lane = random.choice([n for n in lanes if score[n] == best])
        mine = _of_lane(candidates, lane)
        # Start at a random place: another consumer that moved here too starts elsewhere.
        start = random.randrange(len(mine))
        return mine[start:] + mine[:start]
