"""The blocking Producer, Consumer and Message (:mod:`pawn_queue.sync`), and how a blocking
handler runs in its thread."""

from __future__ import annotations

import concurrent.futures
import reprlib
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pawn_queue import consumer, producer
from pawn_queue._handling import handlers
from pawn_queue._handling.arguments import check_listen
from pawn_queue._handling.flow import check_flow
from pawn_queue._handling.handlers import Forwarded
from pawn_queue._internal.daemon_pool import DaemonThreadPool
from pawn_queue._internal.durations import count_argument
from pawn_queue._internal.loop_thread import Call, LoopThread, sigterm_raises
from pawn_queue.exceptions import ArgumentError

_STOP_CHECK_SECONDS = 0.05  # how often listen() looks at its stop event
handler_context = threading.local()  # .runner: the LoopThread whose handler this thread runs


class Producer:
    """Publishes messages, blocking. Obtain one with ``PawnQueue.register_producer()``.

    ``id`` (stable UUIDv4) and ``name`` as in the async API."""

    id = Forwarded[str]()
    name = Forwarded[str]()

    def __init__(self, inner: producer.Producer, runner: LoopThread) -> None:
        self._inner = inner
        self._runner = runner

    def __repr__(self) -> str:
        return repr(self._inner)

    def publish(
        self,
        topic: str,
        payload: Any,
        *,
        delay: float | None = None,
        attributes: Mapping[str, str] | None = None,
        group: str | None = None,
        dedup_id: str | None = None,
        wait_for_room: float = 30.0,
        expires_in: float | None = None,
        priority: int = 0,
    ) -> str:
        """Publish ``payload`` (any JSON value) to ``topic``; return the id once durable.
        The options are those of the async ``Producer.publish``."""
        inner = self._inner.publish(
            topic,
            payload,
            delay=delay,
            attributes=attributes,
            group=group,
            dedup_id=dedup_id,
            wait_for_room=wait_for_room,
            expires_in=expires_in,
            priority=priority,
        )
        return self._runner.call(inner)

    def publish_batch(
        self,
        topic: str,
        payloads: Iterable[Any],
        *,
        attributes: Mapping[str, str] | None = None,
        expires_in: float | None = None,
        priority: int = 0,
    ) -> list[str]:
        """Publish many messages as one batch object (one write); return their ids."""
        # Iterated here: a generator must not run on the loop thread.
        items = producer.payloads_argument(payloads)
        inner = self._inner.publish_batch(
            topic, items, attributes=attributes, expires_in=expires_in, priority=priority
        )
        return self._runner.call(inner)


class Consumer:
    """Consumes topics, blocking. Obtain one with ``PawnQueue.register_consumer()``.

    ``id``, ``name``, ``topics`` and ``subscription`` as in the async API."""

    id = Forwarded[str]()
    name = Forwarded[str]()
    topics = Forwarded[list[str]]()
    subscription = Forwarded[str | None]()

    def __init__(self, inner: consumer.Consumer, runner: LoopThread, workers: int) -> None:
        """``workers``: the threads ``listen()`` runs handlers in unless told."""
        self._inner = inner
        self._runner = runner
        self._workers = workers

    def __repr__(self) -> str:
        return repr(self._inner)

    def poll(self, wait: float | None = None) -> list[Message]:
        """Claim up to ``polling.max_messages_per_poll`` messages (waiting up to ``wait`` s)."""
        return [Message(m, self._runner) for m in self._runner.call(self._inner.poll(wait))]

    def ack_all(self, messages: Iterable[Message]) -> None:
        """Ack ``messages`` together (as ``Consumer.ack_all``): the members of one batch
        object share one write, where ``ack()`` on each costs a write each."""
        batch = handlers.messages_argument("ack_all", messages, Message)
        self._runner.call(self._inner.ack_all([m._inner for m in batch]), on_close=False)

    def release_all(self) -> None:
        """Release every lease this consumer holds (their messages are redelivered)."""
        self._runner.call(self._inner.release_all())

    def listen(
        self,
        handler: handlers.Handler,
        *,
        stop: threading.Event | None = None,
        retry: consumer.Retry | None = None,
        workers: int | None = None,
        grace: float | None = None,
        concurrency: int | None = None,
        batch: int | None = None,
        batch_wait: float | None = None,
        max_in_flight: int | None = None,
        rate_limit: str | None = None,
    ) -> None:
        """Poll and call ``handler(message)`` for each message until ``stop`` is set, Ctrl-C
        or SIGTERM.

        A plain function runs in a pool of ``workers`` threads (default ``concurrency``, else
        ``max_messages_per_poll``) with a blocking :class:`Message`; an ``async def`` one
        runs on the loop thread with the async message. As in the async API, the messages of
        one poll are handled concurrently (with ``concurrency``: up to that many handlers, or
        batches, at a time, a free slot filled at once), a raising handler dead-letters its
        message (with ``retry``: requeues it with backoff), and an unsettled one is
        redelivered after the visibility timeout. Stopping (``stop``,
        Ctrl-C or SIGTERM, the latter two re-raised as ``KeyboardInterrupt`` and
        ``SystemExit(143)``) stops claiming, lets running handlers finish within ``grace``
        seconds (default ``polling.shutdown_grace_seconds``), and releases every other lease
        at once without counting a receive. A second Ctrl-C or SIGTERM stops at once. A
        closed queue raises :class:`PawnQueueError` here.

        With ``batch=N`` (and ``batch_wait`` seconds), ``handler`` takes a list of up to N
        messages, and those it left unsettled are acked together when it returns, as in
        the async API (:mod:`pawn_queue._handling.batching`). ``max_in_flight`` and
        ``rate_limit`` limit the handlers across processes, as in the async API. A bad
        argument raises ArgumentError before anything is claimed.
        """
        # Checked here, before the listener starts: a stop set meanwhile would hide its error.
        check_listen(
            handler,
            retry=retry,
            grace=grace,
            concurrency=concurrency,
            batch=batch,
            batch_wait=batch_wait,
        )
        check_flow(max_in_flight, rate_limit)
        if stop is not None and not isinstance(stop, threading.Event):
            raise ArgumentError(f"stop: got {reprlib.repr(stop)}, must be a threading.Event")
        if workers is not None:
            count_argument("workers", workers, minimum=1)
        runner = self._runner
        # Threads start as handlers need them: as many as may run at once costs nothing idle.
        threads = workers or concurrency or self._workers
        pool = DaemonThreadPool(threads, f"pawn-queue-{self.name}")
        listening: list[Call[None]] = []

        def inhandler_context(call: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                try:
                    return _run_handler(runner, call)
                finally:
                    if stop is not None and stop.is_set():
                        # Stopped by its own handler: the stop begins before this handler's
                        # message is looked at, so an unsettled one is released at once.
                        runner.cancel_soon(listening[0], once=True)

            return run

        call = runner.submit(
            self._inner.listen(
                handlers.as_async(handler, executor=pool, runner=runner, wrap=inhandler_context),
                retry=retry,
                grace=grace,
                concurrency=concurrency,
                batch=batch,
                batch_wait=batch_wait,
                max_in_flight=max_in_flight,
                rate_limit=rate_limit,
            )
        )
        listening.append(call)
        try:
            run_until_stopped(runner, call, stop)
        finally:
            pool.shutdown(wait=False)


def _run_handler(runner: LoopThread, call: Callable[[], object]) -> object:
    handler_context.runner = runner
    try:
        return call()
    finally:
        handler_context.runner = None


Message = handlers.BlockingMessage


def run_until_stopped(runner: LoopThread, call: Call[None], stop: threading.Event | None) -> None:
    """Wait for ``call`` (a listener, the schedule runner) until ``stop`` is set, Ctrl-C or
    SIGTERM, then cancel it: a graceful stop, which a second signal cuts short. A call that
    ended by itself, unasked, raises why."""
    try:
        with sigterm_raises():
            while not call.future.done():
                if stop is not None and stop.wait(_STOP_CHECK_SECONDS):
                    break
                if stop is None:
                    concurrent.futures.wait([call.future], _STOP_CHECK_SECONDS)
            if stop is None or not stop.is_set():
                call.future.result()
                return
            runner.cancel(call, once=True)  # a handler that set ``stop`` may have asked too
    except BaseException:
        with sigterm_raises():
            runner.cancel(call)
        raise
