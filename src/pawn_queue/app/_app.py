"""App: handlers declared with a decorator and run as a service.

::

    app = App("file://./queue")

    @app.subscriber("orders", concurrency=8, publish_to="shipments")
    async def ship(order: Order) -> Shipment:
        return Shipment(order_id=order.id)

    asyncio.run(app.run())          # or: pawn-queue worker mymodule:app

Each subscriber is a consumer (named ``<app>.<handler>``) that calls its handler for each
message, up to ``concurrency`` at a time: its topics' own messages, or with
``subscription=`` a subscription of each topic (:mod:`pawn_queue.app._subscriptions`). A
handler that returns acks its message, and its result (when not None) is published to
``publish_to`` first; one that raises is retried as its :class:`~pawn_queue.retry.Retry`
says, or dead-lettered; a payload its annotation refuses is dead-lettered at once
(:mod:`pawn_queue._handling.binding`). Stopping lets running handlers finish within the
grace period and gives every other message back at once.

A batch subscriber (``batch=N``) calls its handler with lists of up to N messages or
payloads (:mod:`pawn_queue._handling.batching`); when it returns, the messages are acked together.

``@app.schedule`` declares a schedule, created at start, and :meth:`App.serve` runs the
queue's schedules beside the subscribers (:mod:`pawn_queue.app._schedules`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from pawn_queue._handling.arguments import check_concurrency
from pawn_queue._handling.batching import check_batch
from pawn_queue._handling.binding import Binding
from pawn_queue._handling.flow import check_flow
from pawn_queue._internal.daemon_pool import DaemonThreadPool
from pawn_queue._internal.durations import flag_argument
from pawn_queue._protocol import layout
from pawn_queue.app._schedules import declared_schedule, ensure_schedules, run_schedules
from pawn_queue.app._subscriber import Subscriber, batch_handler, message_handler
from pawn_queue.app._subscriptions import (
    declared_filter,
    declared_linger,
    ensure_subscriptions,
    warn_of_subscriptions,
)
from pawn_queue.client import PawnQueue
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.consumer import Consumer
from pawn_queue.exceptions import ArgumentError, PawnQueueError
from pawn_queue.observe import Observer
from pawn_queue.producer import Producer
from pawn_queue.retry import Retry
from pawn_queue.schedules import Schedule
from pawn_queue.store import open_store
from pawn_queue.store.base import Store

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
Hook = Callable[[], Any]  # a startup or shutdown function, plain or async
QueueSource = str | os.PathLike[str] | Mapping[str, Any] | PawnQueueConfig | None

DEFAULT_CONCURRENCY = 8
DEFAULT_RETRY = Retry(max_receives=5, base_delay=1.0, factor=2.0, max_delay=300.0, jitter=0.5)


class App:
    """Subscribers, startup and shutdown hooks over one queue.

    ``queue``: a store URL (``file://./queue``, ``s3://bucket/prefix?...``, ``memory://``),
    a YAML config path, a config mapping or a :class:`PawnQueueConfig`; None (the default)
    reads the ``PAWNQUEUE_*`` environment when the app starts. ``name`` prefixes the
    names its producer and consumers register with. ``create_topics``: create the topics
    the app consumes and publishes to when it starts, and a local directory that does not
    exist yet (default: both must exist, so a mistyped path fails instead of becoming a new
    empty queue).
    """

    def __init__(
        self,
        queue: QueueSource = None,
        *,
        name: str = "app",
        create_topics: bool = False,
        observers: Sequence[Observer] = (),
    ) -> None:
        layout.validate_name(name, "app name")
        self.name = name
        self.source = queue
        self.create_topics = create_topics
        self._subscribers: dict[str, Subscriber] = {}
        self._schedules: dict[str, Schedule] = {}
        self._on_startup: list[Hook] = []
        self._on_shutdown: list[Hook] = []
        self._observers: list[Observer] = list(observers)
        self._store_wrappers: list[Callable[[Store], Store]] = []
        self._queue: PawnQueue | None = None
        self._producer: Producer | None = None
        self._consumers: dict[str, Consumer] = {}
        self._listeners: dict[str, asyncio.Task[None]] = {}
        self._runner: asyncio.Task[None] | None = None
        self._executor: DaemonThreadPool | None = None
        # TestClient's: retries come back at once instead of after their backoff.
        self._instant_retries = False

    def __repr__(self) -> str:
        return f"App(name={self.name!r}, subscribers={list(self._subscribers)!r})"

    # -- declaring --------------------------------------------------------------------------

    def subscriber(
        self,
        topics: str | Sequence[str],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        retry: Retry | None = DEFAULT_RETRY,
        visibility_timeout: float | None = None,
        publish_to: str | None = None,
        name: str | None = None,
        batch: int | None = None,
        batch_wait: float | None = None,
        subscription: str | None = None,
        filter: Mapping[str, Any] | None = None,
        linger_seconds: float | None = None,
        max_in_flight: int | None = None,
        rate_limit: str | None = None,
    ) -> Callable[[F], F]:
        """Decorate a handler (``async def`` or plain) of the messages of ``topics``.

        ``concurrency``: handlers running at a time (plain functions run in threads).
        ``retry``: what a raising handler does to its message (None: dead-letter at once;
        the default retries up to 5 receives with backoff and jitter). ``visibility_timeout``:
        this subscriber's lease length. ``publish_to``: the topic a handler's result (when
        not None) is published to before its message is acked. ``name``: the consumer's
        name after the app's (default: the function's name, and ``.<subscription>`` with
        a subscription, so that one function can read several).

        ``subscription``: read that subscription of each topic (a copy of every message
        published to the topic since it was created; its consumers compete for them), not
        the topics' own messages; the app creates it at start if it is missing.
        ``filter``: the subscription's (attribute name to a string, a list of strings,
        ``{"exists": bool}`` or ``{"prefix": str}``); an existing subscription with another
        filter stops the app from starting (SubscriptionConflictError). Without ``filter``
        an existing subscription keeps its own, a new one takes every message (as ``{}``).
        ``linger_seconds``: the subscription's likewise (how long producers hold its copies
        back so that more share an object, for a sparse filter; 0 to 1 s).

        ``batch=N``: the handler takes lists of up to N payloads (``list[Order]``) and/or
        messages (``list[Message]``), what one poll brought or, with ``batch_wait`` seconds,
        what polls brought within that time; ``concurrency`` then counts batches. A payload
        its annotation refuses is dead-lettered alone; when the handler returns, the others
        are acked together (a returned list is published one message per element first).
        Raising :class:`~pawn_queue.exceptions.BatchFailureError` fails only the messages it
        names (positions in the list, or messages).

        ``max_in_flight`` and ``rate_limit`` (``"20/s"``): ``listen()``'s, shared by every
        process reading the same topics or subscription (docs/concepts/flow-control.md).
        """
        names = [topics] if isinstance(topics, str) else list(topics)
        for topic in names + ([publish_to] if publish_to is not None else []):
            layout.validate_name(topic, "topic name")
        if not names:
            raise ArgumentError("a subscriber needs at least one topic")
        wanted = declared_filter(self.subscribers, names, subscription, filter)
        linger = declared_linger(self.subscribers, names, subscription, linger_seconds)
        check_concurrency(concurrency)
        check_flow(max_in_flight, rate_limit)
        if batch is not None or batch_wait is not None:
            batch, batch_wait = check_batch(batch, batch_wait)
        if retry is not None and not isinstance(retry, Retry):
            raise ArgumentError(f"retry must be a Retry or None, got {type(retry).__name__}")

        def register(handler: F) -> F:
            if not callable(handler):
                raise ArgumentError(f"a subscriber decorates a function, not {handler!r}")
            label = name or getattr(handler, "__name__", None) or "handler"
            if name is None and subscription is not None:
                label = f"{label}.{subscription}"
            layout.validate_name(label, "subscriber name")
            if label in self._subscribers:
                raise ArgumentError(f"app {self.name!r} already has a subscriber {label!r}")
            self._subscribers[label] = Subscriber(
                name=label,
                topics=tuple(names),
                handler=handler,
                concurrency=concurrency,
                retry=retry,
                visibility_timeout=visibility_timeout,
                publish_to=publish_to,
                binding=Binding.of(handler, batch=batch is not None),
                batch=batch,
                batch_wait=batch_wait or 0.0,
                subscription=subscription,
                filter=wanted,
                linger_seconds=linger,
                max_in_flight=max_in_flight,
                rate_limit=rate_limit,
            )
            return handler

        return register

    def schedule(
        self,
        name: str,
        *,
        topic: str,
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
    ) -> Callable[[F], F]:
        """Declare a schedule that publishes ``payload`` and ``attributes`` to ``topic`` on each
        tick of ``cron`` or ``every`` seconds (the options are ``create_schedule``'s, checked
        now with its errors). The app creates it at start if it is missing; one that exists
        with another definition stops the start (ScheduleExistsError): change it with
        ``update_schedule``. Whether it is paused is left as it is.

        Decorating a function also makes it a subscriber of ``topic`` (as
        ``@app.subscriber(topic)`` with its defaults), which then receives every message of
        the topic: this schedule's ticks and whatever else is published there. A function
        that ``@app.subscriber`` below already subscribes to ``topic`` keeps that subscriber.
        Called without decorating, it only declares the schedule.
        """
        options: dict[str, Any] = {"cron": cron, "every": every, "payload": payload}
        options |= {"attributes": attributes, "timezone": timezone, "start": start, "end": end}
        options |= {"jitter_seconds": jitter_seconds, "catch_up_seconds": catch_up_seconds}
        options |= {"priority": priority, "expires_in": expires_in}
        declared = declared_schedule(self._schedules, name, topic, options)
        self._schedules[declared.name] = declared

        def handle(handler: F) -> F:
            subscribed = any(
                sub.handler is handler and declared.topic in sub.topics for sub in self.subscribers
            )
            if not subscribed:
                self.subscriber(declared.topic)(handler)
            return handler

        return handle

    def on_startup(self, hook: F) -> F:
        """Decorate a function (plain or async) run when the app starts, before consuming;
        ``app.queue`` and ``app.producer`` are ready then."""
        self._on_startup.append(hook)
        return hook

    def on_shutdown(self, hook: F) -> F:
        """Decorate a function (plain or async) run when the app stops, after consuming."""
        self._on_shutdown.append(hook)
        return hook

    @property
    def subscribers(self) -> tuple[Subscriber, ...]:
        return tuple(self._subscribers.values())

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules the app declares, as declared (``app.queue.schedule(name)`` reads
        the stored one, with its ``created_at`` and whether it is paused)."""
        return tuple(self._schedules.values())

    # -- what services add ------------------------------------------------------------------

    def add_observer(self, observer: Observer) -> None:
        """Observe the app's queue (metrics, logs); before :meth:`start`."""
        self._observers.append(observer)

    def wrap_store(self, wrapper: Callable[[Store], Store]) -> None:
        """Wrap the app's store (metrics, health); before :meth:`start`."""
        self._store_wrappers.append(wrapper)

    def set_limits(self, **limits: Any) -> None:
        """Give every subscriber these ``concurrency``, ``max_in_flight`` and ``rate_limit``
        (the worker's ``--concurrency``, ``--max-in-flight``, ``--rate-limit``), where not
        None; before :meth:`start`."""
        given = {name: value for name, value in limits.items() if value is not None}
        if "concurrency" in given:
            check_concurrency(given["concurrency"])
        check_flow(given.get("max_in_flight"), given.get("rate_limit"))
        for name, sub in self._subscribers.items():
            self._subscribers[name] = dataclasses.replace(sub, **given)

    # -- running ----------------------------------------------------------------------------

    @property
    def queue(self) -> PawnQueue:
        """The app's queue, once started."""
        if self._queue is None:
            raise PawnQueueError(f"app {self.name!r} is not started")
        return self._queue

    @property
    def producer(self) -> Producer:
        """The app's producer (named after the app), once started: handlers publish with it."""
        if self._producer is None:
            raise PawnQueueError(f"app {self.name!r} is not started")
        return self._producer

    @property
    def consuming(self) -> bool:
        """Whether every subscriber (an app of schedules alone: its runner) is running."""
        tasks = list(self._listeners.values())
        if not tasks and self._runner is not None:
            tasks = [self._runner]
        return bool(tasks) and all(not task.done() for task in tasks)

    async def start(self, config: PawnQueueConfig | None = None) -> None:
        """Open the queue (``config`` instead of the app's own, e.g. a test's memory store),
        create topics if asked, run the startup hooks and register the consumers."""
        if self._queue is not None:
            raise PawnQueueError(f"app {self.name!r} is already started")
        if not self._subscribers and not self._schedules:
            raise ArgumentError(f"app {self.name!r} has no subscriber and no schedule")
        config = config or _config_of(self.source)
        if not self.create_topics and config.backend == "filesystem" and config.filesystem:
            # A service on a mistyped path would register, and so create, a new empty queue.
            from pawn_queue.store.filesystem import require_root

            require_root(config.filesystem.path)
        store = open_store(config)
        for wrapper in self._store_wrappers:
            store = wrapper(store)
        queue = self._queue = PawnQueue(config, store=store, observers=self._observers)
        try:
            await queue.setup()
            if self.create_topics:
                for topic in self._topic_names():
                    await queue.create_topic(topic)
            await ensure_subscriptions(queue, self.subscribers)
            await ensure_schedules(queue, self.schedules)
            self._producer = await queue.register_producer(self.name)
            threads = sum(s.concurrency for s in self.subscribers if not s.is_async)
            if threads:
                self._executor = DaemonThreadPool(threads, self.name)
            for hook in self._on_startup:
                await _call_hook(hook)
            for sub in self.subscribers:
                self._consumers[sub.name] = await queue.register_consumer(
                    f"{self.name}.{sub.name}",
                    list(sub.topics),
                    visibility_timeout=sub.visibility_timeout,
                    subscription=sub.subscription,
                )
            await warn_of_subscriptions(queue, self.subscribers)
        except BaseException:
            await self._close()
            raise

    async def serve(self, grace: float | None = None, *, schedules: bool | None = None) -> None:
        """Consume until :meth:`stop_consuming` (or a cancel); raise if a subscriber fails.
        ``grace``: how long running handlers may finish when stopping (default
        ``polling.shutdown_grace_seconds``). ``schedules``: run the queue's schedules
        meanwhile (every schedule of the queue, each tick once across the processes that
        run them; a crash of the runner is logged and it starts again, the handlers go on);
        default: if the app declares any. An app of schedules alone serves its runner until
        cancelled (ArgumentError with ``schedules=False``; a store where schedules cannot
        run raises its ConfigError)."""
        if self._queue is None:
            raise PawnQueueError(f"app {self.name!r} is not started")
        if schedules is None:
            schedules = bool(self._schedules)
        if not flag_argument("schedules", schedules) and not self._subscribers:
            raise ArgumentError(f"app {self.name!r} has no subscriber, and schedules are off")
        served: list[asyncio.Task[None]] = []
        if schedules:
            self._runner = asyncio.create_task(
                run_schedules(self._queue, self.name, alone=not self._subscribers),
                name=f"{self.name}.schedules",
            )
            served = [self._runner]
        self._listeners = {
            sub.name: asyncio.create_task(self._listen(sub, grace), name=f"{self.name}.{sub.name}")
            for sub in self.subscribers
        }
        served = list(self._listeners.values()) or served
        try:
            await asyncio.wait(served, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            # A cancel of serve(), or one subscriber failing, stops them all (with grace).
            self.stop_consuming()
            runner, self._runner = self._runner, None
            results = await asyncio.gather(*self._listeners.values(), return_exceptions=True)
            if runner is not None:
                ran = await asyncio.gather(runner, return_exceptions=True)
                if not self._listeners:
                    results = [*ran]
        for result in results:
            if isinstance(result, Exception):
                raise result

    def stop_consuming(self) -> None:
        """Stop claiming and running schedules; running handlers get the grace period to
        finish, then every held message is given back. Called again, the grace is cut
        short."""
        if self._runner is not None:
            self._runner.cancel()
        for task in self._listeners.values():
            task.cancel()

    async def stop(self) -> None:
        """Run the shutdown hooks and close the queue (after :meth:`serve` returned)."""
        try:
            for hook in self._on_shutdown:
                try:
                    await _call_hook(hook)
                except Exception:
                    logger.exception("shutdown hook failed app=%s hook=%r", self.name, hook)
        finally:
            await self._close()

    async def run(self) -> None:
        """Start, consume until cancelled, stop."""
        await self.start()
        try:
            await self.serve()
        finally:
            await self.stop()

    async def _close(self) -> None:
        queue, self._queue = self._queue, None
        self._producer = None
        self._consumers.clear()
        self._listeners = {}
        try:
            if queue is not None:
                await queue.teardown()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def _topic_names(self) -> list[str]:
        names = [t for s in self.subscribers for t in (*s.topics, s.publish_to) if t]
        names += [schedule.topic for schedule in self.schedules]
        return list(dict.fromkeys(names))

    # -- handling ---------------------------------------------------------------------------

    async def _listen(self, sub: Subscriber, grace: float | None) -> None:
        consumer = self._consumers[sub.name]
        retry = sub.retry
        if retry is not None and self._instant_retries:
            retry = replace(retry, base_delay=0.0, max_delay=0.0)
        listen = functools.partial(
            consumer.listen,
            retry=retry,
            grace=grace,
            concurrency=sub.concurrency,
            max_in_flight=sub.max_in_flight,
            rate_limit=sub.rate_limit,
        )
        if sub.batch is not None:
            handler = batch_handler(sub, self.producer, self._executor)
            await listen(handler, batch=sub.batch, batch_wait=sub.batch_wait)
        else:
            handle = message_handler(sub, self.producer, self._executor)
            await listen(handle, executor=self._executor)


async def _call_hook(hook: Hook) -> None:
    result = hook()
    if inspect.isawaitable(result):
        await result


def _config_of(source: QueueSource) -> PawnQueueConfig:
    """The app's config: from the environment, a URL, a YAML path, a mapping or a config."""
    if source is None:
        return PawnQueueConfig.from_env()
    if isinstance(source, str) and "://" in source:
        return PawnQueueConfig.from_url(source)
    return load_config(source)
