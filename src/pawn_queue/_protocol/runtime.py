"""Runtime: what :meth:`PawnQueue.setup() <pawn_queue.client.PawnQueue.setup>` opens, handed
to the producers, consumers and messages it makes instead of a long list of arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pawn_queue._internal.aio import Background
from pawn_queue._protocol.dedup import MarkerSweeper
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue._protocol.listings import SharedListings
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue._protocol.observers import Observers
from pawn_queue._protocol.retained import RetainedSweeper
from pawn_queue.config import PawnQueueConfig
from pawn_queue.registry import Registry
from pawn_queue.store.base import Store
from pawn_queue.subscriptions import Subscriptions
from pawn_queue.topics import Topics


@dataclass(frozen=True, slots=True)
class Runtime:
    """One queue's open store and the protocol objects over it."""

    config: PawnQueueConfig
    store: Store
    leases: LeaseManager
    topics: Topics
    subscriptions: Subscriptions
    registry: Registry
    signals: ChangeSignals
    listings: SharedListings
    dedup_sweeper: MarkerSweeper
    retained_sweeper: RetainedSweeper
    observers: Observers = field(default_factory=Observers)
    """The queue's observers (:mod:`pawn_queue.observe`), called by the core."""
    background: Background = field(default_factory=Background)
    """Work the queue's teardown waits for (lease and finished batch deletes)."""

    @property
    def clock(self) -> Callable[[], datetime]:
        """The UTC wall clock behind every time this queue writes or compares (one per
        queue: ``PawnQueue(config, clock=...)`` stands in another host's clock)."""
        return self.leases.clock
