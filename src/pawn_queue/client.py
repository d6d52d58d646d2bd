"""PawnQueue: the entry point that opens a store and hands out producers and consumers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import reprlib
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any

from pawn_queue._internal.aio import Background
from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol.dedup import MarkerSweeper
from pawn_queue._protocol.envelope import now_utc
from pawn_queue._protocol.lease_protocol import ResolvedStrategy
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue._protocol.listings import SharedListings
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.strategy import known_conditional, resolve_strategy
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.consumer import Consumer
from pawn_queue.dead_letters import DeadLetter, DeadLetters
from pawn_queue.exceptions import ArgumentError, PawnQueueError, RootNotFound
from pawn_queue.observe import Observer, Observers
from pawn_queue.producer import Producer
from pawn_queue.registry import Registry
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.coalesce import DeleteCoalescer
from pawn_queue.topics import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_RETENTION_ACTION,
    NO_LIMIT,
    NotGiven,
    PeekedMessage,
    Topics,
    TopicSettings,
    TopicStats,
    given_settings,
    topic_stats,
)

logger = logging.getLogger(__name__)


class PawnQueue:
    """A queue on one store. Use ``async with`` (or ``setup()`` / ``teardown()``)."""

    def __init__(
        self,
        config: PawnQueueConfig,
        *,
        store: Store | None = None,
        clock: Callable[[], datetime] | None = None,
        observers: Iterable[Observer] = (),
    ) -> None:
        """``store`` replaces the one ``config`` selects (custom stores, fault injection);
        ``clock`` the host's UTC wall clock (tests of clock skew); ``observers`` are called
        as messages are published, delivered, handled and settled (:mod:`pawn_queue.observe`)."""
        self.config = config
        self._observers = Observers(observers)
        self._custom_store = store
        self._clock = clock or now_utc
        self._runtime: Runtime | None = None
        self._consumers: list[Consumer] = []
        self._heartbeat: asyncio.Task[None] | None = None

    @classmethod
    async def from_config(
        cls, config: str | os.PathLike[str] | dict[str, Any] | PawnQueueConfig
    ) -> PawnQueue:
        """Create from a YAML path, a dict or a PawnQueueConfig (not set up yet)."""
        return cls(load_config(config))

    @classmethod
    def from_url(cls, url: str) -> PawnQueue:
        """Create from a store URL: ``file:///dir``, ``memory://``, ``s3://bucket/prefix?...``."""
        return cls(PawnQueueConfig.from_url(url))

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        """Open the store, verify access and resolve the concurrency strategy. Idempotent.

        On S3: one LIST (a missing bucket or bad credentials fail here) and, for ``auto``,
        the probe. A local directory or memory gets no request: both enforce conditional
        writes, and a local directory is created by the first write, not by opening it.
        """
        if self._runtime is not None:
            return
        store = self._custom_store or open_store(self.config)
        try:
            if not known_conditional(store):
                with contextlib.suppress(RootNotFound):  # a local directory in a custom wrapper
                    await store.list("", limit=1)
            strategy = await resolve_strategy(store, self.config.concurrency.strategy)
        except BaseException:
            await store.close()
            raise
        background = Background()
        leases = LeaseManager(
            store,
            strategy,
            self.config.concurrency,
            clock=self._clock,
            deleter=DeleteCoalescer(store),  # one, so concurrent deletes share requests
            background=background,
            # Memory and a local directory always answer: no publish needs to look.
            keep_tombstones=strategy == "conditional_write" and not known_conditional(store),
        )
        signals = ChangeSignals(store, self.config.notify)
        leases.on_freed = signals.published  # a message given back wakes its consumers
        runtime = self._runtime = Runtime(
            config=self.config,
            store=store,
            leases=leases,
            topics=Topics(store),
            registry=Registry(store),
            signals=signals,
            listings=SharedListings(store, signals),
            dedup_sweeper=MarkerSweeper(store, background, self._clock, leases.margin),
            observers=self._observers,
            background=background,
        )
        self._heartbeat = asyncio.create_task(
            runtime.registry.run_heartbeat(self.config.registry.heartbeat_interval_seconds)
        )
        logger.info("pawn-queue ready store=%r strategy=%s", store, strategy)

    async def teardown(self) -> None:
        """Release held leases, stop background tasks and close the store. Idempotent."""
        runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        try:
            for consumer in self._consumers:
                await consumer.release_all()
            await runtime.signals.close()
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._heartbeat
            await runtime.registry.stop()
        finally:
            self._consumers.clear()
            await runtime.store.close()

    async def __aenter__(self) -> PawnQueue:
        await self.setup()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.teardown()

    # -- topics -----------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        max_pending: int | NotGiven | None = NO_LIMIT,
        dedup_window_seconds: float | NotGiven = DEFAULT_DEDUP_WINDOW,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
    ) -> None:
        """Create a topic, or make sure it exists. Never changes stored settings.

        A new topic gets the settings passed and the defaults for the rest. For an existing
        topic, the settings passed are compared with the stored ones: the same is fine, a
        difference raises TopicSettingsConflictError (nothing written). Settings left out
        are not compared, so ``create_topic(name)`` accepts any existing topic. Change
        settings with :meth:`update_topic`.

        ``max_receive_count``: dead-letter a message received more often than that.
        ``retention_seconds``: a message not consumed that long after it was due is expired
        (``retention_action``: ``"delete"`` or ``"dead_letter"``).
        ``max_pending``: ``publish`` waits for room, then raises QueueFullError.
        ``dedup_window_seconds``: how long a ``dedup_id`` is remembered.
        """
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            max_pending=max_pending,
            dedup_window_seconds=dedup_window_seconds,
            retention_action=retention_action,
        )
        await self._ready().topics.create(name, given)

    async def update_topic(
        self,
        name: str,
        *,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        max_pending: int | NotGiven | None = NO_LIMIT,
        dedup_window_seconds: float | NotGiven = DEFAULT_DEDUP_WINDOW,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
    ) -> TopicSettings:
        """Change the settings passed (None clears a limit) and keep the others; return the
        topic's new settings. Raises TopicNotFoundError for a missing topic.

        Other processes see the change within 30 s (they cache topic settings that long).
        """
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            max_pending=max_pending,
            dedup_window_seconds=dedup_window_seconds,
            retention_action=retention_action,
        )
        return await self._ready().topics.update(name, given)

    async def topic_settings(self, name: str) -> TopicSettings:
        """The topic's stored settings (read now); raises TopicNotFoundError if it is missing."""
        return await self._ready().topics.settings(name, fresh=True)

    async def purge_topic(self, name: str) -> int:
        """Delete the topic's messages (pending, in flight and delayed) and their leases, like
        SQS's PurgeQueue; return the number of message objects deleted (a batch counts once).
        Dead letters stay. A consumer holding a purged message learns it when it next writes
        its lease: see docs/protocol.md."""
        return await self._ready().topics.purge(name)

    async def list_topics(self) -> list[str]:
        """All topics in the store, sorted."""
        return await self._ready().topics.list()

    async def delete_topic(self, name: str) -> None:
        """Delete a topic with its messages, leases and dead letters."""
        await self._ready().topics.delete(name)

    async def topic_stats(self, name: str) -> TopicStats:
        """Approximate pending, in-flight, delayed and dead-letter counts and the age of the
        oldest pending message. Costs one LIST per 1,000 objects of each kind."""
        await self._ready().topics.settings(name)
        return await topic_stats(
            self._ready().store, name, self.config.polling.visibility_timeout_seconds
        )

    async def peek(self, topic: str, limit: int = 10) -> list[PeekedMessage]:
        """The topic's oldest messages (at most ``limit``), each with its state (``pending``,
        ``in_flight`` or ``delayed``), read without claiming them. Costs two LISTs and a GET
        per message object shown."""
        visibility = self.config.polling.visibility_timeout_seconds
        return await self._ready().topics.peek(topic, limit, visibility)

    # -- dead letters -----------------------------------------------------------------------

    async def dead_letters(self, topic: str, *, limit: int | None = None) -> list[DeadLetter]:
        """The topic's dead letters with why they ended there, oldest first."""
        return await self._dead_letters().list(topic, limit=limit)

    async def dead_letter(self, topic: str, message_id: str) -> DeadLetter | None:
        """One dead letter by its message id (one GET); None if the topic has none by that id."""
        return await self._dead_letters().get(topic, message_id)

    async def redrive(
        self,
        topic: str,
        *,
        ids: Collection[str] | None = None,
        limit: int | None = None,
        per_second: float | None = None,
    ) -> int:
        """Move dead letters back to the topic (same id, payload, attributes); returns how many."""
        return await self._dead_letters().redrive(
            topic, ids=ids, limit=limit, per_second=per_second
        )

    async def purge_dead_letters(self, topic: str) -> int:
        """Delete the topic's dead letters; returns how many."""
        return await self._dead_letters().purge(topic)

    def _dead_letters(self) -> DeadLetters:
        return DeadLetters(self._ready())

    # -- producers and consumers ------------------------------------------------------------

    async def register_producer(self, name: str) -> Producer:
        """Register a producer; the same name always gets the same id."""
        entry = await self.registry.register("producers", name)
        return Producer(entry, self._ready())

    async def register_consumer(
        self, name: str, topics: list[str], *, visibility_timeout: float | None = None
    ) -> Consumer:
        """Register a consumer of ``topics``; the same name always gets the same id.

        ``visibility_timeout`` (seconds) overrides ``polling.visibility_timeout_seconds`` for
        this consumer's leases; it must exceed the clock-skew margin and a lease refresh
        interval that was set (one that was not follows it: see ``consumer_polling``).
        """
        if not isinstance(topics, list | tuple) or not topics:
            raise ArgumentError(
                f"topics must be a non-empty list of topic names, got {reprlib.repr(topics)}"
            )
        polling = self.config.polling
        if visibility_timeout is not None:
            visibility = seconds_argument("visibility_timeout", visibility_timeout)
            polling = self.config.consumer_polling(visibility)
        for topic in topics:
            await self._ready().topics.settings(topic)
        entry = await self.registry.register("consumers", name)
        consumer = Consumer(entry, topics, self._ready(), polling)
        self._consumers.append(consumer)
        return consumer

    @property
    def registry(self) -> Registry:
        """The registry: ``await pq.registry.list("producers" | "consumers")``."""
        return self._ready().registry

    @property
    def strategy(self) -> ResolvedStrategy:
        """The concurrency strategy in use (resolved by the probe for ``auto``)."""
        return self._ready().leases.strategy

    @property
    def store(self) -> Store:
        """The underlying store (for tools and tests)."""
        return self._ready().store

    @property
    def runtime(self) -> Runtime:
        """The open store and the protocol objects over it (for tools and tests)."""
        return self._ready()

    def _ready(self) -> Runtime:
        if self._runtime is None:
            raise _not_set_up()
        return self._runtime


def _not_set_up() -> PawnQueueError:
    return PawnQueueError("PawnQueue is not set up: use 'async with' or await setup() first")
