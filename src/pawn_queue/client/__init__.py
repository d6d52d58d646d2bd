"""PawnQueue: the entry point that opens a store and hands out producers and consumers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import reprlib
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from datetime import datetime
from types import EllipsisType, TracebackType
from typing import Any

from pawn_queue._internal.durations import (
    count_argument,
    flag_argument,
    rate_argument,
    seconds_argument,
)
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue._protocol.lease_protocol import ResolvedStrategy
from pawn_queue._protocol.registry import Registry
from pawn_queue._protocol.replay import replay, seek
from pawn_queue._protocol.runtime import Runtime, open_runtime
from pawn_queue._protocol.subscriptions import Subscription, parse_start
from pawn_queue._protocol.topics import (
    DEFAULT_RETENTION_ACTION,
    NO_LIMIT,
    NotGiven,
    TopicStats,
    given_settings,
)
from pawn_queue.client._limits import LimitMethods
from pawn_queue.client._schedules import ScheduleMethods
from pawn_queue.client._topics import TopicMethods
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.consumer import Consumer
from pawn_queue.dead_letters import DeadLetter, DeadLetters
from pawn_queue.exceptions import ArgumentError, ConfigError, PawnQueueError
from pawn_queue.observe import Observer, Observers
from pawn_queue.producer import Producer
from pawn_queue.store.base import Store

logger = logging.getLogger(__name__)

_BACKGROUND_CLOSE_SECONDS = 10.0  # a teardown waits this long at most for background work


class PawnQueue(TopicMethods, ScheduleMethods, LimitMethods):
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
        as messages are published, delivered, handled and settled (:mod:`pawn_queue.observe`).
        A bad value raises ConfigError (``config``) or ArgumentError (the others)."""
        if not isinstance(config, PawnQueueConfig):
            raise ConfigError(
                f"config: got {type(config).__name__}, must be a PawnQueueConfig "
                "(PawnQueue.from_config takes a YAML path or a mapping)"
            )
        if store is not None and not isinstance(store, Store):
            raise ArgumentError(f"store: got {reprlib.repr(store)}, must be a Store or None")
        if clock is not None and not callable(clock):
            raise ArgumentError(f"clock: got {reprlib.repr(clock)}, must be a function or None")
        self.config = config
        self._observers = Observers(_observers_argument(observers))
        self._custom_store = store
        self._clock = clock or now_utc
        self._runtime: Runtime | None = None
        self._consumers: list[Consumer] = []
        self._heartbeat: asyncio.Task[None] | None = None

    @classmethod
    def from_config(
        cls, config: str | os.PathLike[str] | Mapping[str, Any] | PawnQueueConfig
    ) -> PawnQueue:
        """Create from a YAML path, a mapping or a PawnQueueConfig; not set up yet.

        ``async with PawnQueue.from_config(...) as pq`` sets it up and tears it down; awaited
        (``pq = await PawnQueue.from_config(...)``) or not, it is the queue itself. The same
        holds for :meth:`from_url`."""
        return cls(load_config(config))

    @classmethod
    def from_url(cls, url: str) -> PawnQueue:
        """Create from a store URL: ``file:///dir``, ``memory://``, ``s3://bucket/prefix?...``;
        not set up yet. Used as :meth:`from_config` is: in ``async with``, awaited or not."""
        return cls(PawnQueueConfig.from_url(url))

    def __await__(self) -> Generator[None, None, PawnQueue]:
        """``await pq`` is ``pq`` (not set up), so that ``await PawnQueue.from_config(...)``
        and ``await PawnQueue.from_url(...)`` both work."""
        yield from ()
        return self

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        """Open the store, verify access and resolve the concurrency strategy. Idempotent.

        On S3: one LIST (a missing bucket or bad credentials fail here) and, for ``auto``,
        the probe. A local directory or memory gets no request: both enforce conditional
        writes, and a local directory is created by the first write, not by opening it."""
        if self._runtime is not None:
            return
        runtime = self._runtime = await open_runtime(
            self.config, self._custom_store, self._clock, self._observers
        )
        self._heartbeat = asyncio.create_task(
            runtime.registry.run_heartbeat(self.config.registry.heartbeat_interval_seconds)
        )
        logger.info("pawn-queue ready store=%r strategy=%s", runtime.store, runtime.leases.strategy)

    async def teardown(self) -> None:
        """Release held leases and slots, stop background tasks and close the store. Idempotent."""
        runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        try:
            for consumer in self._consumers:
                await consumer.release_all()
            await runtime.limits.close()
            # What publishes began (sweeps; a one-shot process's first), within the close wait.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.background.done(), _BACKGROUND_CLOSE_SECONDS)
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

    # -- subscriptions ----------------------------------------------------------------------

    async def create_subscription(
        self,
        topic: str,
        name: str,
        *,
        filter: Mapping[str, Any] | None = None,
        start: str | datetime = "latest",
        linger_seconds: float | None = None,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
    ) -> Subscription:
        """Create a subscription of ``topic``, or make sure it exists with this filter.

        From then on every message published to the topic is also delivered to the
        subscription, whatever its other subscriptions and its own consumers do; consumers
        registered with ``subscription=name`` compete for them. Once a topic has
        subscriptions, its messages go to them only (each takes those its filter matches).

        ``filter`` maps attribute names to a string (equals), a list of strings (any of),
        ``{"exists": bool}`` or ``{"prefix": str}``, all of which must hold. The settings
        are a topic's (see :meth:`create_topic`); like there, those given are compared with
        an existing subscription's: a difference raises SubscriptionConflictError.
        ``start``: ``"latest"`` (what is published after this call returns), or
        ``"earliest"`` or a timezone-aware datetime: a new subscription first receives what
        the topic's replay log holds from then on (see ``replay_window_seconds``).
        ``linger_seconds`` (0 to 1; 0 when created without): producers hold the
        subscription's copies back that long, so that more share one object; fewer requests
        for a subscription whose filter takes few messages, for that much more latency on
        the publishes it takes. Compared with an existing subscription's when given.

        Returns once every publish that starts afterwards, in any process, copies to it:
        about 2 s after the subscription was first created.
        """
        since = parse_start(start, "start")
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            retention_action=retention_action,
        )
        runtime = self._ready()
        subscription, created = await runtime.subscriptions.create(
            topic, name, filter, given, linger_seconds
        )
        if created and since != "latest":
            await replay(runtime, subscription, since)
        return subscription

    async def seek(self, topic: str, name: str, to: str | datetime, *, drop: bool = False) -> None:
        """Make a subscription receive the topic's messages from ``to`` on: ``"earliest"``,
        a timezone-aware datetime, or ``"latest"`` (nothing of what waits now).

        What waits in the subscription (pending, in flight, delayed) is dropped, then what
        the topic's replay log holds from ``to`` on (messages are kept there
        ``replay_window_seconds`` after publish, acked or not) is delivered again, oldest
        first, as the subscription's filter takes it. Consumers receive the first messages
        while the rest are copied; this returns once all are. A seek that fails half-way is
        finished by calling it again. Deliveries of the dropped messages in progress in this
        process can no longer be settled (LeaseLostError); elsewhere, from their next lease
        refresh.

        A seek that would drop a message it cannot bring back raises ReplayUnavailableError
        and changes nothing: to ``"earliest"`` or a time on a topic with no replay window,
        to a time before the window, or while a message from before the log's oldest waits.
        ``drop=True`` seeks all the same.
        """
        since = parse_start(to, "to")
        flag_argument("drop", drop)
        await seek(self._ready(), topic, name, since, drop=drop)

    async def list_subscriptions(self, topic: str) -> list[Subscription]:
        """The topic's subscriptions, by name."""
        return await self._ready().subscriptions.list(topic)

    async def subscription(self, topic: str, name: str) -> Subscription:
        """One subscription; raises SubscriptionNotFoundError."""
        return await self._ready().subscriptions.get(topic, name)

    async def update_subscription(
        self,
        topic: str,
        name: str,
        *,
        filter: Mapping[str, Any] | EllipsisType | None = ...,
        linger_seconds: float | None = None,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
    ) -> Subscription:
        """Change what is passed (``filter=None`` takes every message again) and keep the
        rest. A new filter applies to messages published from about 2 s on (and returns
        then), a new ``linger_seconds`` as producers next read the topic's subscriptions."""
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            retention_action=retention_action,
        )
        return await self._ready().subscriptions.update(topic, name, filter, given, linger_seconds)

    async def delete_subscription(self, topic: str, name: str) -> None:
        """Delete a subscription with the messages and dead letters waiting in it."""
        await self._ready().subscriptions.delete(topic, name)

    async def subscription_stats(self, topic: str, name: str) -> TopicStats:
        """The counts of :meth:`topic_stats` for one subscription (its lag: the age of its
        oldest pending message)."""
        return await self.topic_stats(topic, subscription=name)

    # -- dead letters -----------------------------------------------------------------------

    async def dead_letters(
        self, topic: str, *, subscription: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """The dead letters of the topic (or of one of its subscriptions), oldest first,
        with why they ended there."""
        if limit is not None:
            count_argument("limit", limit, minimum=0)
        return await self._dead_letters().list(layout.queue(topic, subscription), limit=limit)

    async def dead_letter(
        self, topic: str, message_id: str, *, subscription: str | None = None
    ) -> DeadLetter | None:
        """One dead letter by its message id (one GET); None if the topic has none by that id."""
        if not isinstance(message_id, str):
            raise ArgumentError(f"message_id: got {reprlib.repr(message_id)}, must be a string")
        return await self._dead_letters().get(layout.queue(topic, subscription), message_id)

    async def redrive(
        self,
        topic: str,
        *,
        subscription: str | None = None,
        ids: Collection[str] | None = None,
        limit: int | None = None,
        per_second: float | None = None,
    ) -> int:
        """Move dead letters back to the topic, or to the subscription they came from (same
        id, payload, attributes); returns how many. ``ids``: only those; ``limit``: that many
        at most; ``per_second``: at most that many a second."""
        if limit is not None:
            count_argument("limit", limit, minimum=0)
        if per_second is not None:
            rate_argument("per_second", per_second)
        return await self._dead_letters().redrive(
            layout.queue(topic, subscription), ids=ids, limit=limit, per_second=per_second
        )

    async def purge_dead_letters(self, topic: str, *, subscription: str | None = None) -> int:
        """Delete the dead letters of the topic (or of one subscription); returns how many."""
        return await self._dead_letters().purge(layout.queue(topic, subscription))

    def _dead_letters(self) -> DeadLetters:
        return DeadLetters(self._ready())

    # -- producers and consumers ------------------------------------------------------------

    async def register_producer(self, name: str) -> Producer:
        """Register a producer; the same name always gets the same id."""
        entry = await self.registry.register("producers", name)
        return Producer(entry, self._ready())

    async def register_consumer(
        self,
        name: str,
        topics: list[str],
        *,
        visibility_timeout: float | None = None,
        subscription: str | None = None,
    ) -> Consumer:
        """Register a consumer of ``topics``; the same name always gets the same id.

        ``subscription``: read that subscription of each topic (it must exist) instead of
        competing for the topic's own messages.
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
        runtime = self._ready()
        queues = [layout.queue(topic, subscription) for topic in topics]
        for topic, queue in zip(topics, queues, strict=True):
            if subscription is None:
                await runtime.topics.settings(queue)
            else:
                await runtime.subscriptions.get(topic, subscription)
        entry = await self.registry.register("consumers", name)
        consumer = Consumer(entry, queues, runtime, polling)
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
            raise PawnQueueError("PawnQueue is not set up: use 'async with' or await setup() first")
        return self._runtime


def _observers_argument(observers: object) -> list[Observer]:
    """``observers`` as a list of :class:`Observer`; else ArgumentError."""
    if isinstance(observers, Iterable) and not isinstance(observers, str | bytes):
        found = list(observers)
        if all(isinstance(observer, Observer) for observer in found):
            return found
    raise ArgumentError(
        f"observers: got {reprlib.repr(observers)}, must be a list of pawn_queue.observe.Observer"
    )
