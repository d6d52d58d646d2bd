"""Prometheus metrics for pawn-queue, built on the core's hooks (:mod:`pawn_queue.observe`).

Needs the ``metrics`` extra (``prometheus-client``), imported only here and only when a
:class:`QueueMetrics` is built. Two observation points:

- ``PawnQueue(config, observers=[metrics.observer])`` counts what the queue publishes,
  delivers, acks, nacks and dead-letters (for any reason), the leases it finds lost on
  settling, how long ``listen()`` handlers run, and the schedule ticks its
  ``run_schedules()`` fires and records as missed, with how late each fired.
- :class:`MetricsStore` wraps a store (``PawnQueue(config, store=metrics.wrap_store(...))``)
  and counts every request by operation and outcome, with its latency.

:meth:`QueueMetrics.poll` times a ``consumer.poll()`` (no hook sees the polls of
``listen()``, so a worker exports no poll durations). :meth:`QueueMetrics.handler` and
:meth:`QueueMetrics.observe_message` register the observer on the queue of the consumer or
message they see (for code written before observers); :meth:`QueueMetrics.published`
counts by hand (only for a queue without the observer, which counts publishes itself).
:meth:`QueueMetrics.set_topic_stats` sets the topic gauges (``pawn-queue metrics`` does).

``start_exporter(port)`` serves ``/metrics`` over HTTP from a daemon thread, on 127.0.0.1
unless told otherwise. What it serves (and the worker's ``/metrics``) goes through
:func:`only_sampled`: a metric shows once it has a sample, never as an empty family.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pawn_queue._protocol.delivery import Message
from pawn_queue.exceptions import (
    AccessDenied,
    AlreadyExists,
    BucketNotFound,
    NotFound,
    PreconditionFailed,
    StoreThrottledError,
    StoreUnavailable,
)
from pawn_queue.observe import Observer, Observers, Outcome, Publication
from pawn_queue.store.base import IfMatch, Store
from pawn_queue.store.throttling import throttle_backoff_of
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

    from pawn_queue._protocol.topics import TopicStats
    from pawn_queue.consumer import Consumer
    from pawn_queue.schedules import Schedule

T = TypeVar("T")

PREFIX = "pawnqueue"

# Seconds; store requests and polls are usually milliseconds, handlers anything.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Seconds after its tick a tick is published: a request or two on time, up to jitter_seconds
# with jitter, up to catch_up_seconds (60 by default, any length) after an outage.
_LATE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (NotFound, "not_found"),
    (AlreadyExists, "already_exists"),
    (PreconditionFailed, "precondition_failed"),
    (StoreThrottledError, "throttled"),
    (StoreUnavailable, "unavailable"),
    (AccessDenied, "access_denied"),
    (BucketNotFound, "bucket_not_found"),
)

METRIC_NAMES: dict[str, str] = {
    f"{PREFIX}_messages_published_total": "messages published, by topic",
    f"{PREFIX}_messages_delivered_total": "messages returned by poll or given to a handler",
    f"{PREFIX}_messages_acked_total": "messages acked, by topic",
    f"{PREFIX}_messages_nacked_total": "messages nacked, by topic and requeue (true/false)",
    f"{PREFIX}_messages_dead_lettered_total": "dead letters written (any reason), by topic",
    f"{PREFIX}_messages_expired_total": "messages removed undelivered past their own "
    "deadline (publish expires_in), by topic",
    f"{PREFIX}_lease_lost_total": "ack/nack that found its lease taken over, by topic",
    f"{PREFIX}_store_requests_total": "store requests, by operation and outcome",
    f"{PREFIX}_store_request_seconds": "store request latency (histogram), by operation",
    f"{PREFIX}_store_throttled_total": "answers refused for the store's request rate (429, "
    "503 SlowDown) and sent again, by operation",
    f"{PREFIX}_poll_seconds": "timed poll duration (histogram), by outcome (messages/empty)",
    f"{PREFIX}_handler_seconds": "handler duration (histogram), by topic and outcome",
    f"{PREFIX}_topic_pending": "pending objects (gauge, `pawn-queue metrics` only)",
    f"{PREFIX}_topic_in_flight": "leased objects (gauge)",
    f"{PREFIX}_topic_delayed": "delayed objects (gauge)",
    f"{PREFIX}_topic_dead_letters": "dead letters (gauge)",
    f"{PREFIX}_topic_oldest_age_seconds": "age of the oldest pending message (gauge)",
    f"{PREFIX}_schedule_ticks_fired_total": "schedule ticks this process published, by "
    "schedule (each tick is counted by one runner)",
    f"{PREFIX}_schedule_ticks_missed_total": "schedule ticks skipped as older than "
    "catch_up_seconds, by schedule (counted by the runner that recorded them)",
    f"{PREFIX}_schedule_late_seconds": "seconds from a tick's time to its publish "
    "(histogram), by schedule",
}
"""Every metric this module defines and what it counts (the README's table). One is
exported once it has a sample (:func:`only_sampled`)."""


def _outcome(exc: BaseException) -> str:
    for kind, name in _OUTCOMES:
        if isinstance(exc, kind):
            return name
    return "error"


class QueueMetrics:
    """The metric families, registered in ``registry`` (default: prometheus' global one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = registry if registry is not None else REGISTRY
        self.registry = reg

        def counter(name: str, labels: Sequence[str]) -> Counter:
            full = f"{PREFIX}_{name}"
            return Counter(full, METRIC_NAMES[f"{full}_total"], labels, registry=reg)

        def histogram(
            name: str, labels: Sequence[str], buckets: Sequence[float] = _LATENCY_BUCKETS
        ) -> Histogram:
            full = f"{PREFIX}_{name}"
            return Histogram(full, METRIC_NAMES[full], labels, buckets=buckets, registry=reg)

        def gauge(name: str) -> Gauge:
            full = f"{PREFIX}_{name}"
            return Gauge(full, METRIC_NAMES[full], ["topic"], registry=reg)

        self.published_total = counter("messages_published", ["topic"])
        self.delivered_total = counter("messages_delivered", ["topic"])
        self.acked_total = counter("messages_acked", ["topic"])
        self.nacked_total = counter("messages_nacked", ["topic", "requeue"])
        self.dead_lettered_total = counter("messages_dead_lettered", ["topic"])
        self.expired_total = counter("messages_expired", ["topic"])
        self.lease_lost_total = counter("lease_lost", ["topic"])
        self.store_requests_total = counter("store_requests", ["operation", "outcome"])
        self.store_throttled_total = counter("store_throttled", ["operation"])
        self.store_request_seconds = histogram("store_request_seconds", ["operation"])
        self.poll_seconds = histogram("poll_seconds", ["outcome"])
        self.handler_seconds = histogram("handler_seconds", ["topic", "outcome"])
        self.topic_pending = gauge("topic_pending")
        self.topic_in_flight = gauge("topic_in_flight")
        self.topic_delayed = gauge("topic_delayed")
        self.topic_dead_letters = gauge("topic_dead_letters")
        self.topic_oldest_age = gauge("topic_oldest_age_seconds")
        self.schedule_ticks_fired_total = counter("schedule_ticks_fired", ["schedule"])
        self.schedule_ticks_missed_total = counter("schedule_ticks_missed", ["schedule"])
        self.schedule_late_seconds = histogram("schedule_late_seconds", ["schedule"], _LATE_BUCKETS)
        self.observer = MetricsObserver(self)
        """Register it on a queue (``PawnQueue(config, observers=[metrics.observer])``)."""

    # -- observation helpers ----------------------------------------------------------------

    def published(self, topic: str, count: int = 1) -> None:
        """Count ``count`` messages published to ``topic`` by hand (a queue with
        :attr:`observer` counts its publishes itself)."""
        self.published_total.labels(topic).inc(count)

    def observe_message(self, message: Message) -> Message:
        """Make sure :attr:`observer` watches the queue this message came from, so its
        settlement counts; counts it as delivered if the observer was not watching yet."""
        if self._watch(message._claimed.observers):
            self.observer.delivered(message)
        return message

    async def poll(self, consumer: Consumer, wait: float | None = None) -> list[Message]:
        """``consumer.poll(wait)``, timed; :attr:`observer` watches the consumer's queue."""
        self._watch(consumer._observers)
        started = time.perf_counter()
        messages = await consumer.poll(wait=wait)
        outcome = "messages" if messages else "empty"
        self.poll_seconds.labels(outcome).observe(time.perf_counter() - started)
        return messages

    def handler(
        self, handler: Callable[[Message], Awaitable[Any]]
    ) -> Callable[[Message], Awaitable[Any]]:
        """Wrap a ``listen()`` handler so that :attr:`observer` watches the queue of the
        messages it gets (delivered, settlements, handler duration by outcome)."""

        async def observed(message: Message) -> Any:
            self.observe_message(message)
            return await handler(message)

        return observed

    def _watch(self, observers: Observers) -> bool:
        return observers.add(self.observer)

    def set_topic_stats(self, topic: str, stats: TopicStats) -> None:
        self.topic_pending.labels(topic).set(stats.pending)
        self.topic_in_flight.labels(topic).set(stats.in_flight)
        self.topic_delayed.labels(topic).set(stats.delayed)
        self.topic_dead_letters.labels(topic).set(stats.dead_letter)
        self.topic_oldest_age.labels(topic).set(stats.oldest_age_seconds or 0.0)

    def wrap_store(self, store: Store) -> MetricsStore:
        return MetricsStore(store, self)


class MetricsObserver(Observer):
    """The hooks behind :class:`QueueMetrics`' message counters and handler durations."""

    def __init__(self, metrics: QueueMetrics) -> None:
        self.metrics = metrics

    def __repr__(self) -> str:
        return "MetricsObserver()"

    def published(self, publication: Publication) -> None:
        self.metrics.published_total.labels(publication.topic).inc(len(publication.message_ids))

    def delivered(self, message: Message) -> None:
        self.metrics.delivered_total.labels(message.topic).inc()

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        outcome = "ok" if error is None else "error"
        self.metrics.handler_seconds.labels(message.topic, outcome).observe(seconds)

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        m, topic = self.metrics, message.topic
        if outcome == "ack":
            m.acked_total.labels(topic).inc()
        elif outcome == "nack_requeue":
            m.nacked_total.labels(topic, "true").inc()
        elif outcome == "expired":
            m.expired_total.labels(topic).inc()
        else:
            if reason == "nack":  # nack() without requeue dead-letters
                m.nacked_total.labels(topic, "false").inc()
            m.dead_lettered_total.labels(topic).inc()

    def quarantined(self, topic: str, key: str, error: str) -> None:
        self.metrics.dead_lettered_total.labels(topic).inc()

    def lease_lost(self, message: Message) -> None:
        self.metrics.lease_lost_total.labels(message.topic).inc()

    def schedule_fired(self, schedule: Schedule, tick: datetime, late_seconds: float) -> None:
        self.metrics.schedule_ticks_fired_total.labels(schedule.name).inc()
        self.metrics.schedule_late_seconds.labels(schedule.name).observe(late_seconds)

    def schedule_missed(self, schedule: Schedule, count: int) -> None:
        self.metrics.schedule_ticks_missed_total.labels(schedule.name).inc(count)


class MetricsStore(StoreWrapper):
    """Delegates to ``inner``; counts and times every request (a failure counts too), and
    the answers that the store's backoff beneath (an S3 or Azure store's) sent again."""

    def __init__(self, inner: Store, metrics: QueueMetrics) -> None:
        super().__init__(inner)
        self.metrics = metrics
        backoff = throttle_backoff_of(inner)
        if backoff is not None:
            backoff.listeners.append(self._throttled)

    def _throttled(self, call: StoreCall) -> None:
        self.metrics.store_throttled_total.labels(_operation(call)).inc()

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        operation = _operation(call)
        started = time.perf_counter()
        outcome = "ok"
        try:
            result = await run()
        except BaseException as exc:
            outcome = _outcome(exc)
            raise
        finally:
            self.metrics.store_request_seconds.labels(operation).observe(
                time.perf_counter() - started
            )
            self.metrics.store_requests_total.labels(operation, outcome).inc()
        return result


def _operation(call: StoreCall) -> str:
    """The ``operation`` label: puts are split by mode."""
    if call.operation != "put":
        return call.operation
    if isinstance(call.mode, IfMatch):
        return "put_if_match"
    return "put_create" if call.mode == "create" else "put"


_default: QueueMetrics | None = None


def default_metrics() -> QueueMetrics:
    """One :class:`QueueMetrics` on prometheus' global registry, per process (a metric can
    be registered there only once)."""
    global _default
    if _default is None:
        _default = QueueMetrics()
    return _default


def only_sampled(registry: Collector) -> Collector:
    """``registry`` as ``/metrics`` shows it: without the pawnqueue families that have no
    sample yet (a labelled metric nothing fed, such as the poll durations of a worker,
    whose ``listen()`` polls no hook sees), rather than as a HELP line and nothing."""
    sampled: Collector = _sampled_type()(registry)
    return sampled


@functools.cache
def _sampled_type() -> type[Any]:
    from prometheus_client.registry import Collector

    class Sampled(Collector):
        def __init__(self, registry: Collector) -> None:
            self._registry = registry

        def collect(self) -> Iterable[Metric]:
            for family in self._registry.collect():
                if family.samples or not family.name.startswith(f"{PREFIX}_"):
                    yield family

        def restricted_registry(self, names: Iterable[str]) -> Collector:
            # prometheus' HTTP server narrows the answer to ?name[]=... with it.
            restrict = getattr(self._registry, "restricted_registry", None)
            return self if restrict is None else Sampled(restrict(names))

    return Sampled


LOOPBACK = "127.0.0.1"
"""Where ``start_exporter``, ``pawn-queue metrics`` and the worker's ``/metrics`` listen
unless told otherwise: an exporter off the host is a choice (``addr`` / ``--addr``)."""


def start_exporter(
    port: int,
    addr: str = LOOPBACK,
    registry: CollectorRegistry | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` (:func:`only_sampled`) on ``addr:port`` (port 0: a free one) from
    a daemon thread, prometheus' HTTP server; returns it and its thread
    (``server.shutdown()`` stops it)."""
    from prometheus_client import REGISTRY, start_http_server

    source = registry if registry is not None else REGISTRY
    return start_http_server(port, addr=addr, registry=only_sampled(source))
