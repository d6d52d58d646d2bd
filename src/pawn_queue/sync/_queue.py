"""The blocking PawnQueue and Registry (:mod:`pawn_queue.sync`)."""

from __future__ import annotations

import builtins
import contextlib
import os
import reprlib
import threading
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from types import EllipsisType
from typing import Any, TypeVar

from pawn_queue import client, registry
from pawn_queue._internal.loop_thread import CLOSED, LoopThread, blocking_context
from pawn_queue._protocol.layout import Role
from pawn_queue._protocol.lease_protocol import ResolvedStrategy
from pawn_queue._protocol.registry import Liveness, RegistryEntry
from pawn_queue._protocol.subscriptions import Subscription
from pawn_queue._protocol.topics import (
    DEFAULT_CLAIMS,
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION_ACTION,
    NO_LIMIT,
    NotGiven,
    PeekedMessage,
    TopicSettings,
    TopicStats,
    given_settings,
)
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.exceptions import ArgumentError, PawnQueueError
from pawn_queue.limits import LimitSlot
from pawn_queue.observe import Observer
from pawn_queue.schedules import Schedule, ScheduleStats
from pawn_queue.store.base import Store
from pawn_queue.sync._workers import (
    Consumer,
    Producer,
    handler_context,
    run_until_stopped,
)

T = TypeVar("T")


class PawnQueue:
    """A queue on one store, with blocking methods; share it between threads freely.

    Use ``with`` or ``setup()``/``close()``. ``close()`` (alias ``teardown()``) is final.
    """

    def __init__(
        self,
        config: PawnQueueConfig,
        *,
        store: Store | None = None,
        observers: Iterable[Observer] = (),
    ) -> None:
        """``store`` replaces the one ``config`` selects (custom stores, fault injection);
        ``observers`` see publishes, deliveries and settlements (:mod:`pawn_queue.observe`;
        their hooks run on the queue's loop thread)."""
        self.config = config
        self._queue = client.PawnQueue(config, store=store, observers=observers)
        self._runner = LoopThread(f"pawn-queue-loop-{id(self):x}")
        self._lifecycle = threading.Lock()
        self._ready = False

    @classmethod
    def from_config(
        cls, config: str | os.PathLike[str] | Mapping[str, Any] | PawnQueueConfig
    ) -> PawnQueue:
        """Create from a YAML path, a mapping or a PawnQueueConfig, not set up yet: ``with
        PawnQueue.from_config(...) as pq`` sets it up and closes it."""
        return cls(load_config(config))

    @classmethod
    def from_url(cls, url: str) -> PawnQueue:
        """Create from a store URL: ``file:///dir``, ``memory://``, ``s3://bucket/prefix?...``;
        not set up yet, as :meth:`from_config`."""
        return cls(PawnQueueConfig.from_url(url))

    def setup(self) -> None:
        """Open the store, verify access and resolve the concurrency strategy. Idempotent."""
        with self._lifecycle:
            self._runner.call(self._queue.setup())
            self._ready = True

    def close(self) -> None:
        """Cancel running calls (listeners release their leases; acks finish), tear down and
        join the loop thread. Idempotent; later calls raise PawnQueueError. Not in a handler."""
        self._runner.check_thread()
        if getattr(handler_context, "runner", None) is self._runner:
            raise PawnQueueError("close() in a listen() handler would deadlock; use stop=")
        with self._lifecycle:
            if self._runner.closed:
                return
            try:
                if self._ready:  # nothing runs before setup() succeeded
                    self._runner.call(self._runner.cancel_calls())
                    self._runner.call(self._queue.teardown())
            finally:
                self._runner.stop()

    teardown = close

    def __enter__(self) -> PawnQueue:
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ready_queue(self) -> client.PawnQueue:
        if self._runner.closed:
            raise PawnQueueError(CLOSED)
        if not self._ready:
            raise PawnQueueError("PawnQueue is not set up: use 'with' or call setup() first")
        return self._queue

    def create_topic(
        self,
        name: str,
        *,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        max_pending: int | NotGiven | None = NO_LIMIT,
        dedup_window_seconds: float | NotGiven = DEFAULT_DEDUP_WINDOW,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
        replay_window_seconds: float | NotGiven = DEFAULT_REPLAY_WINDOW,
        claims: str | NotGiven = DEFAULT_CLAIMS,
    ) -> None:
        """Create a topic, or make sure it exists; never changes stored settings (settings
        passed that differ from the stored ones raise TopicSettingsConflictError)."""
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            max_pending=max_pending,
            dedup_window_seconds=dedup_window_seconds,
            retention_action=retention_action,
            replay_window_seconds=replay_window_seconds,
            claims=claims,
        )
        self._runner.call(self._ready_queue().create_topic(name, **given))

    def update_topic(
        self,
        name: str,
        *,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        max_pending: int | NotGiven | None = NO_LIMIT,
        dedup_window_seconds: float | NotGiven = DEFAULT_DEDUP_WINDOW,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
        replay_window_seconds: float | NotGiven = DEFAULT_REPLAY_WINDOW,
        claims: str | NotGiven = DEFAULT_CLAIMS,
    ) -> TopicSettings:
        """Change the settings passed (None clears a limit), keep the others; return the new
        settings. Raises TopicNotFoundError for a missing topic."""
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            max_pending=max_pending,
            dedup_window_seconds=dedup_window_seconds,
            retention_action=retention_action,
            replay_window_seconds=replay_window_seconds,
            claims=claims,
        )
        return self._runner.call(self._ready_queue().update_topic(name, **given))

    def topic_settings(self, name: str) -> TopicSettings:
        """The topic's stored settings."""
        return self._runner.call(self._ready_queue().topic_settings(name))

    def purge_topic(self, name: str, *, subscription: str | None = None) -> int:
        """Delete the messages of the topic (or of one of its subscriptions) and their
        leases; returns how many message objects."""
        return self._runner.call(self._ready_queue().purge_topic(name, subscription=subscription))

    def dead_letter(
        self, topic: str, message_id: str, *, subscription: str | None = None
    ) -> DeadLetter | None:
        """One dead letter by its message id (of the topic, or of one of its subscriptions);
        None if there is none."""
        inner = self._ready_queue().dead_letter(topic, message_id, subscription=subscription)
        return self._runner.call(inner)

    def topic_stats(self, name: str, *, subscription: str | None = None) -> TopicStats:
        """Approximate pending, in-flight, delayed and dead-letter counts of the topic, or of
        one of its subscriptions."""
        return self._runner.call(self._ready_queue().topic_stats(name, subscription=subscription))

    def peek(
        self, topic: str, limit: int = 10, *, subscription: str | None = None
    ) -> list[PeekedMessage]:
        """The oldest messages of the topic (or of one of its subscriptions) with their
        state, read without claiming them."""
        return self._runner.call(self._ready_queue().peek(topic, limit, subscription=subscription))

    def dead_letters(
        self, topic: str, *, subscription: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """The dead letters of the topic (or of one of its subscriptions), with why they
        ended there."""
        inner = self._ready_queue().dead_letters(topic, subscription=subscription, limit=limit)
        return self._runner.call(inner)

    def redrive(
        self,
        topic: str,
        *,
        subscription: str | None = None,
        ids: Collection[str] | None = None,
        limit: int | None = None,
        per_second: float | None = None,
    ) -> int:
        """Move dead letters back to the topic, or to the subscription they came from;
        returns how many."""
        inner = self._ready_queue().redrive(
            topic, subscription=subscription, ids=ids, limit=limit, per_second=per_second
        )
        return self._runner.call(inner)

    def purge_dead_letters(self, topic: str, *, subscription: str | None = None) -> int:
        """Delete the dead letters of the topic (or of one subscription); returns how many."""
        inner = self._ready_queue().purge_dead_letters(topic, subscription=subscription)
        return self._runner.call(inner)

    def list_topics(self) -> list[str]:
        """All topics in the store, sorted."""
        return self._runner.call(self._ready_queue().list_topics())

    def delete_topic(self, name: str) -> None:
        """Delete a topic with its messages, leases and dead letters."""
        self._runner.call(self._ready_queue().delete_topic(name))

    def register_producer(self, name: str) -> Producer:
        """Register a producer; the same name always gets the same id."""
        return Producer(
            self._runner.call(self._ready_queue().register_producer(name)), self._runner
        )

    def register_consumer(
        self,
        name: str,
        topics: list[str],
        *,
        visibility_timeout: float | None = None,
        subscription: str | None = None,
    ) -> Consumer:
        """Register a consumer of ``topics`` (same name, same id); ``subscription``: read
        that subscription of each topic instead of the topics' own messages;
        ``visibility_timeout`` overrides ``polling.visibility_timeout_seconds`` for its
        leases."""
        inner = self._ready_queue().register_consumer(
            name, topics, visibility_timeout=visibility_timeout, subscription=subscription
        )
        return Consumer(
            self._runner.call(inner), self._runner, self.config.polling.max_messages_per_poll
        )

    # -- subscriptions ----------------------------------------------------------------------

    def create_subscription(
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
        """Create a subscription of ``topic`` (every message published from then on is
        copied to it when its attributes match ``filter``), or make sure it exists with this
        filter and the settings given (SubscriptionConflictError if not). Returns once every
        later publish copies to it: about 2 s after its creation. As the async
        :meth:`pawn_queue.client.PawnQueue.create_subscription`."""
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            retention_action=retention_action,
        )
        queue = self._ready_queue()
        inner = queue.create_subscription(
            topic, name, filter=filter, start=start, linger_seconds=linger_seconds, **given
        )
        return self._runner.call(inner)

    def list_subscriptions(self, topic: str) -> list[Subscription]:
        """The topic's subscriptions, by name."""
        return self._runner.call(self._ready_queue().list_subscriptions(topic))

    def subscription(self, topic: str, name: str) -> Subscription:
        """One subscription; raises SubscriptionNotFoundError."""
        return self._runner.call(self._ready_queue().subscription(topic, name))

    def update_subscription(
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
        rest; a new filter applies to messages published from about 2 s on."""
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            retention_action=retention_action,
        )
        queue = self._ready_queue()
        update = queue.update_subscription(
            topic, name, filter=filter, linger_seconds=linger_seconds, **given
        )
        return self._runner.call(update)

    def delete_subscription(self, topic: str, name: str) -> None:
        """Delete a subscription with the messages and dead letters waiting in it."""
        self._runner.call(self._ready_queue().delete_subscription(topic, name))

    def subscription_stats(self, topic: str, name: str) -> TopicStats:
        """The counts of :meth:`topic_stats` for one subscription."""
        return self._runner.call(self._ready_queue().subscription_stats(topic, name))

    def seek(self, topic: str, name: str, to: str | datetime, *, drop: bool = False) -> None:
        """Make a subscription receive the topic's retained messages from ``to`` on
        (``"earliest"``, a timezone-aware datetime, or ``"latest"``: nothing that waits now).
        As the async :meth:`pawn_queue.client.PawnQueue.seek`, which refuses to drop what it
        cannot bring back unless ``drop=True``."""
        self._runner.call(self._ready_queue().seek(topic, name, to, drop=drop))

    def create_schedule(
        self,
        name: str,
        topic: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        payload: Any = None,
        attributes: Mapping[str, str] | None = None,
        timezone: str = "UTC",
        jitter_seconds: float = 0,
        catch_up_seconds: float = 60,
        start: datetime | None = None,
        end: datetime | None = None,
        priority: int = 0,
        expires_in: float | None = None,
    ) -> Schedule:
        """Create a schedule; as the async :meth:`pawn_queue.client.PawnQueue.create_schedule`."""
        inner = self._ready_queue().create_schedule(
            name,
            topic,
            cron=cron,
            every=every,
            payload=payload,
            attributes=attributes,
            timezone=timezone,
            jitter_seconds=jitter_seconds,
            catch_up_seconds=catch_up_seconds,
            start=start,
            end=end,
            priority=priority,
            expires_in=expires_in,
        )
        return self._runner.call(inner)

    def list_schedules(self) -> builtins.list[Schedule]:
        """Every schedule of the queue, by name."""
        return self._runner.call(self._ready_queue().list_schedules())

    def schedule(self, name: str) -> Schedule:
        """One schedule; raises ScheduleNotFoundError."""
        return self._runner.call(self._ready_queue().schedule(name))

    def update_schedule(
        self,
        name: str,
        *,
        topic: str | EllipsisType = ...,
        cron: str | EllipsisType | None = ...,
        every: float | EllipsisType | None = ...,
        payload: Any = ...,
        attributes: Mapping[str, str] | EllipsisType | None = ...,
        timezone: str | EllipsisType = ...,
        jitter_seconds: float | EllipsisType = ...,
        catch_up_seconds: float | EllipsisType = ...,
        start: datetime | EllipsisType | None = ...,
        end: datetime | EllipsisType | None = ...,
        priority: int | EllipsisType = ...,
        expires_in: float | EllipsisType | None = ...,
    ) -> Schedule:
        """Change the options passed and keep the others; return the new schedule."""
        inner = self._ready_queue().update_schedule(
            name,
            topic=topic,
            cron=cron,
            every=every,
            payload=payload,
            attributes=attributes,
            timezone=timezone,
            jitter_seconds=jitter_seconds,
            catch_up_seconds=catch_up_seconds,
            start=start,
            end=end,
            priority=priority,
            expires_in=expires_in,
        )
        return self._runner.call(inner)

    def pause_schedule(self, name: str) -> None:
        """Stop firing (runners see it within a few seconds)."""
        self._runner.call(self._ready_queue().pause_schedule(name))

    def resume_schedule(self, name: str) -> None:
        """Fire again, from the next tick on."""
        self._runner.call(self._ready_queue().resume_schedule(name))

    def trigger_schedule(self, name: str) -> str:
        """Publish one tick now, once, from this process; return the message's id."""
        return self._runner.call(self._ready_queue().trigger_schedule(name))

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule and its tick markers."""
        self._runner.call(self._ready_queue().delete_schedule(name))

    def schedule_stats(self, name: str) -> ScheduleStats:
        """Last and next fire time, ticks fired and missed over the markers kept."""
        return self._runner.call(self._ready_queue().schedule_stats(name))

    def run_schedules(self, *, stop: threading.Event | None = None) -> None:
        """Fire the ticks of every schedule until ``stop`` is set (or Ctrl-C, SIGTERM, or
        ``close()`` from another thread); each tick fires once across processes."""
        if stop is not None and not isinstance(stop, threading.Event):
            raise ArgumentError(f"stop: got {reprlib.repr(stop)}, must be a threading.Event")
        call = self._runner.submit(self._ready_queue().run_schedules())
        run_until_stopped(self._runner, call, stop)

    def concurrency_limit(
        self, name: str, limit: int, *, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[LimitSlot]:
        """``with pq.concurrency_limit(name, limit):`` runs its block holding one of the
        ``limit`` slots of ``name`` shared by every process on the store; as the async
        :meth:`pawn_queue.client.PawnQueue.concurrency_limit`. Any thread may use it."""
        inner = self._ready_queue().concurrency_limit(name, limit, timeout=timeout)
        return blocking_context(self._runner, inner)

    def rate_limit(
        self, name: str, rate: str, *, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """``with pq.rate_limit(name, "100/s"):`` runs its block at the time of one permit
        of ``name``, a rate every process on the store shares; as the async
        :meth:`pawn_queue.client.PawnQueue.rate_limit`. Any thread may use it."""
        inner = self._ready_queue().rate_limit(name, rate, timeout=timeout)
        return blocking_context(self._runner, inner)

    @property
    def registry(self) -> Registry:
        """The registry: ``pq.registry.list("producers" | "consumers")``."""
        return Registry(self._ready_queue().registry, self._runner)

    @property
    def strategy(self) -> ResolvedStrategy:
        """The concurrency strategy in use (resolved by the probe for ``auto``)."""
        return self._ready_queue().strategy


class Registry:
    """The registry of producers and consumers, blocking."""

    def __init__(self, inner: registry.Registry, runner: LoopThread) -> None:
        self._inner = inner
        self._runner = runner

    def list(self, role: Role) -> list[RegistryEntry]:
        """Every entry of ``role`` ("producers" or "consumers"), by name."""
        return self._runner.call(self._inner.list(role))

    def liveness(self, role: Role, window: float) -> builtins.list[Liveness]:
        """Each entry of ``role`` once per process that registered it, alive, stopped or
        dead (see :meth:`pawn_queue.registry.Registry.liveness`)."""
        return self._runner.call(self._inner.liveness(role, window))
