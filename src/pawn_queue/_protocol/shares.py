"""Shares: how the consumer processes of one queue split its new messages between them.

Each process says in its registry record which queues its ``listen()`` calls consume
(:mod:`pawn_queue._protocol.registry`). Every process reads those records once per
heartbeat, and when a change signal says a listener started or ended somewhere, and so
knows, per queue, the live processes consuming it, in the order of their ids: ``n`` of
them, itself at ``rank``. A message belongs to the process at ``hash(lease id) % n``. A new
message is claimed by its owner; the process after it in the order may take it once it is
``SHARE_WAIT_SECONDS`` old (the owner is busy, or died), the one after that once it is twice
that old, and so on: each process tries its own share first and takes another's only when it
has waited. A backlog, older than every wait, is everyone's, each process taking its own
share of it first (:mod:`pawn_queue._protocol.claiming`).

So consumer processes do not all race for the newest message, and each can watch the change
signals less often (:meth:`Shares.fewest`, :mod:`pawn_queue._protocol.notify`): n processes
that each check every n-th interval check as often, together, as one. Correctness does not
rest on shares: a claim is won or lost as always (docs/protocol.md, rules 3 and 4), and views
that differ for a moment (a process joining or leaving) cost a race or a wait, never a
message (docs/protocol.md, strategy ``conditional_write``).
"""

from __future__ import annotations

import asyncio
import math
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

from pawn_queue._protocol import layout

SHARE_WAIT_SECONDS = 2.0
"""How old a message of another process's share must be before the next process in the
order may take it (twice that for the one after, and so on)."""

LOOK_STEP_SECONDS = 5.0
"""The grid on which a process looks for the messages of others' shares it may take."""

_STALE_SPACING_SECONDS = 10.0
_SALT = 0x5A17  # independent of the lanes' hash (lanes.py), which uses the same lease id


class Shares:
    """This process's view of who consumes each queue (refreshed from the registry)."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._peers: dict[str, tuple[str, ...]] = {}  # queue -> live instance ids, sorted
        # Told of each queue whose sharing changed: what its listings left for another
        # process may be this one's now (the queue's change signals).
        self.on_change: Callable[[str], None] | None = None
        self.stale_seen = asyncio.Event()
        """Set when a claim suggests the view is stale: the registry reads it again soon."""
        self._stale_at = -math.inf

    def update(self, consuming: Mapping[str, Iterable[str]], own: Iterable[str]) -> None:
        """The live processes consuming each queue (``consuming``: queue -> instance ids);
        ``own``: the queues consumed here (this process counts for them, seen or not)."""
        peers: dict[str, set[str]] = {queue: set(ids) for queue, ids in consuming.items()}
        for queue in own:
            peers.setdefault(queue, set()).add(self.instance_id)
        before, self._peers = (
            self._peers,
            {queue: tuple(sorted(ids)) for queue, ids in peers.items() if self.instance_id in ids},
        )
        if self.on_change is not None:
            for queue in before.keys() | self._peers.keys():
                if before.get(queue) != self._peers.get(queue):
                    self.on_change(queue)

    def stale(self, queue: str) -> None:
        """Another process won a claim of ``queue`` that this view gave this one: read the
        registry again (at most every ``_STALE_SPACING_SECONDS``: races for a backlog,
        which everyone may claim, are lost all the time)."""
        if self.size(queue) > 1 and time.monotonic() - self._stale_at >= _STALE_SPACING_SECONDS:
            self._stale_at = time.monotonic()
            self.stale_seen.set()

    def size(self, queue: str) -> int:
        """How many processes consume ``queue`` (1 when only this one, or not known)."""
        return max(1, len(self._peers.get(queue, ())))

    def fewest(self, queues: Iterable[str]) -> int:
        """The smallest number of processes sharing any of ``queues`` (1 if none)."""
        return min((self.size(queue) for queue in queues), default=1)

    def _distance(self, queue: str, lease_id: str) -> int | None:
        """How far after the owner of ``lease_id``'s message this process comes in the
        order (0: it owns it); None where no other process consumes ``queue``."""
        peers = self._peers.get(queue)
        if peers is None or len(peers) < 2:
            return None
        owner = zlib.crc32(lease_id.encode(), _SALT) % len(peers)
        return (peers.index(self.instance_id) - owner) % len(peers)

    def owns(self, queue: str, lease_id: str) -> bool:
        """Whether the message (or group) of ``lease_id`` is in this process's share; False
        where no other process consumes ``queue`` (there are no shares)."""
        return self._distance(queue, lease_id) == 0

    def free_at(self, queue: str, lease_id: str, message_key: str) -> tuple[datetime, bool] | None:
        """When this process may claim the message at ``message_key`` (lease ``lease_id``),
        and whether it is the next in line after the owner; None if at once (its own share,
        or no other process consumes ``queue``)."""
        distance = self._distance(queue, lease_id)
        due = layout.due_from_key(message_key) if distance else None
        if distance is None or due is None:
            return None
        return due + timedelta(seconds=distance * SHARE_WAIT_SECONDS), distance == 1

    def look_at(self, free: datetime) -> datetime:
        """When to look for a message this process may take at ``free``: on a grid of
        ``LOOK_STEP_SECONDS``, so that such looks are that far apart whatever the rate. (On
        a busy queue, the listings that come anyway take them sooner.)"""
        step = LOOK_STEP_SECONDS
        return datetime.fromtimestamp(math.ceil(free.timestamp() / step) * step, free.tzinfo)
