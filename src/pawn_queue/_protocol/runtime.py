"""Runtime: what :meth:`PawnQueue.setup() <pawn_queue.client.PawnQueue.setup>` opens, handed
to the producers, consumers and messages it makes instead of a long list of arguments."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pawn_queue._internal.aio import Background
from pawn_queue._internal.config_sections import claim_seconds
from pawn_queue._protocol import layout
from pawn_queue._protocol.dedup import MarkerSweeper
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue._protocol.limits import Limits
from pawn_queue._protocol.listings import SharedListings
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue._protocol.observers import Observers
from pawn_queue._protocol.pauses import CHECK_SECONDS, Pauses
from pawn_queue._protocol.rates import Rates
from pawn_queue._protocol.registry import Registry
from pawn_queue._protocol.retained import RetainedSweeper
from pawn_queue._protocol.strategy import known_conditional, resolve_strategy
from pawn_queue._protocol.subscriptions import Subscriptions
from pawn_queue._protocol.topics import Topics
from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import RootNotFound
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.coalesce import DeleteCoalescer


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
    limits: Limits
    """The concurrency limits' slots held here (``concurrency_limit``)."""
    rates: Rates
    """The rate limits' chunks won here (``rate_limit``)."""
    pauses: Pauses
    """The subscribers' pauses (a handler raised ``RateLimited``)."""
    observers: Observers = field(default_factory=Observers)
    """The queue's observers (:mod:`pawn_queue.observe`), called by the core."""
    background: Background = field(default_factory=Background)
    """Work the queue's teardown waits for (lease and finished batch deletes)."""

    @property
    def clock(self) -> Callable[[], datetime]:
        """The UTC wall clock behind every time this queue writes or compares (one per
        queue: ``PawnQueue(config, clock=...)`` stands in another host's clock)."""
        return self.leases.clock


async def open_runtime(
    config: PawnQueueConfig,
    store: Store | None,
    clock: Callable[[], datetime],
    observers: Observers,
) -> Runtime:
    """Open ``store`` (the one ``config`` selects if None), verify access and resolve the
    concurrency strategy, then build the protocol objects over it.

    On S3: one LIST (a missing bucket or bad credentials fail here) and, for ``auto``,
    the probe. A local directory or memory gets no request: both enforce conditional
    writes, and a local directory is created by the first write, not by opening it.
    """
    store = store or open_store(config)
    try:
        if not known_conditional(store):
            with contextlib.suppress(RootNotFound):  # a local directory in a custom wrapper
                await store.list("", limit=1)
        strategy = await resolve_strategy(store, config.concurrency.strategy)
    except BaseException:
        await store.close()
        raise
    background = Background()
    leases = LeaseManager(
        store,
        strategy,
        config.concurrency,
        clock=clock,
        deleter=DeleteCoalescer(store),  # one, so concurrent deletes share requests
        background=background,
        # Memory and a local directory always answer: no publish needs to look.
        keep_tombstones=strategy == "conditional_write" and not known_conditional(store),
    )
    registry = Registry(store)
    leases.shares = registry.shares  # consumer processes split new messages
    signals = ChangeSignals(store, config.notify, registry.shares)
    registry.shares.on_change = signals.local.changed
    registry.on_listeners_changed = lambda: signals.published(layout.LISTENERS_CHANGED)
    signals.on_signal(layout.LISTENERS_CHANGED, registry.shares.stale_seen.set)
    request_seconds = claim_seconds(config.polling.visibility_timeout_seconds)
    # With signals, a pause is read when one says it was written (and at the backfill
    # interval all the same), not every second by each busy process.
    pauses = Pauses(
        store,
        clock,
        request_seconds,
        config.notify.backfill_interval_seconds if config.notify.enabled else CHECK_SECONDS,
    )
    pauses.on_paused = lambda: signals.published(layout.PAUSES_CHANGED)
    signals.on_signal(layout.PAUSES_CHANGED, pauses.stale)
    topics = Topics(store)
    leases.on_freed = signals.published  # a message given back wakes its consumers
    leases.on_look = signals.local.changed  # a run's holder lists its topic after its second
    return Runtime(
        config=config,
        store=store,
        leases=leases,
        topics=topics,
        subscriptions=Subscriptions(store, topics),
        registry=registry,
        signals=signals,
        listings=SharedListings(store, signals),
        dedup_sweeper=MarkerSweeper(store, background, clock, leases.margin),
        retained_sweeper=RetainedSweeper(store, background, clock, leases.margin),
        limits=Limits(store, leases, config.polling),
        rates=Rates(store, clock, request_seconds, background),
        pauses=pauses,
        observers=observers,
        background=background,
    )
