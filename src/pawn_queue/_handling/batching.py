"""Batch handlers: ``Consumer.listen(handler, batch=N)`` hands the handler lists of messages.

A batch is what one poll returned, up to ``N`` messages (with ``batch_wait``: what further
polls brought within that many seconds, until ``N``). When the handler returns, every message
it left unsettled is acked at once (:func:`pawn_queue.message.ack_together`: the members of
one batch object share one write), so a message costs no task, no lock wait and no future of
its own: that per-message work bounds ``listen()`` on batch objects. A handler that raises
fails each unsettled message as a handler failure would (its ``Retry``, else a dead letter);
one that raises :class:`~pawn_queue.exceptions.BatchFailureError` fails those it names and
the rest are acked. Messages the handler settled itself (``ack``, ``nack``) stay as it left
them. The lease keeper refreshes every member's lease until it is settled, as for any
message handed out.

Internal to :class:`~pawn_queue.consumer.Consumer`, which gives it what it needs
(:class:`BatchSource`): it never imports the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pawn_queue._handling.handlers import AsyncBatchHandler, BlockingMessage
from pawn_queue._internal.aio import IO_CONCURRENCY, gather_limited
from pawn_queue._internal.durations import MAX_SECONDS
from pawn_queue._protocol.acks import ack_together
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.handout import Handout
from pawn_queue._protocol.observers import Observers
from pawn_queue.exceptions import (
    ArgumentError,
    BatchFailureError,
    PawnQueueError,
    RateLimited,
    StoreError,
)

logger = logging.getLogger("pawn_queue.consumer")

__all__ = ["BatchListener", "BatchSource", "check_batch"]


def check_batch(batch: object, batch_wait: object) -> tuple[int, float]:
    """``batch`` (an int >= 1) and ``batch_wait`` (seconds >= 0, finite; None: 0) as given to
    ``listen()`` or ``App.subscriber()``; ArgumentError for anything else."""
    if batch is None:
        raise ArgumentError(f"batch_wait={batch_wait!r} needs batch=N (the most per batch)")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ArgumentError(f"batch must be a positive integer, got {batch!r}")
    wait = 0.0 if batch_wait is None else batch_wait
    if (
        isinstance(wait, bool)
        or not isinstance(wait, int | float)
        or not math.isfinite(wait)
        or not 0 <= wait < MAX_SECONDS
    ):
        raise ArgumentError(f"batch_wait: got {batch_wait!r}, must be a number of seconds >= 0")
    return batch, float(wait)


@dataclass(frozen=True, slots=True)
class BatchSource:
    """What a batch listener uses of its consumer."""

    poll: Callable[[int], Awaitable[list[Message]]]  # up to n messages, listening
    snapshot: Callable[[], dict[str, int]]  # the change signals seen so far
    idle: Callable[[dict[str, int], set[asyncio.Task[None]]], Awaitable[None]]
    wait: Callable[[dict[str, int], float], Awaitable[object]]  # a change, or n seconds
    handout: Handout
    observers: Observers
    fail: Callable[[Message, Exception], Awaitable[None]]  # retry or dead-letter one message
    name: str  # the consumer's, for the logs


class BatchListener:
    """Claims messages and hands them to a batch handler, ``size`` at most at a time."""

    def __init__(
        self, source: BatchSource, call: AsyncBatchHandler, size: int, wait: float
    ) -> None:
        self._source = source
        self._call = call
        self._size = size
        self._wait = wait

    async def serve(self, running: set[asyncio.Task[None]], concurrency: int | None) -> None:
        """Hand out batches until cancelled: one at a time, or up to ``concurrency`` in
        flight (one poll claims enough for every free slot). A batch whose handler returned
        and whose acks wait only for the write that makes them durable frees its slot and
        the next poll, as in ``listen()``: the acks of one object then share that write."""
        source = self._source
        handout = source.handout
        slots = concurrency or 1
        settling: dict[asyncio.Task[None], Callable[[], bool]] = {}

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            del settling[task]
            handout.progressed()

        loop = asyncio.get_running_loop()
        handout.start()
        while True:
            # A task may be done before its callbacks took it out of ``running``.
            busy = [task for task in running if not (task.done() or settling[task]())]
            if len(busy) >= slots:
                handout.round_settled()
                await handout.until_settling(busy, [settling[t] for t in busy], 1)
                continue
            seen = source.snapshot()
            messages = await self._poll(self._size * (slots - len(busy)))
            if messages and self._wait and len(messages) < self._size:
                messages += await self._collect(self._size - len(messages))
            if not messages:
                handout.round_settled()
                await source.idle(seen, running if concurrency is not None else set())
                continue
            tasks = []
            for start in range(0, len(messages), self._size):
                batch = _Batch(messages[start : start + self._size])
                task = loop.create_task(self._dispatch(batch))
                tasks.append(task)
                running.add(task)
                settling[task] = batch.check
                task.add_done_callback(finished)
            if concurrency is None:
                await handout.until_settling(tasks, [settling[t] for t in tasks])
                handout.round_settled()

    async def _poll(self, wanted: int) -> list[Message]:
        try:
            return await self._source.poll(wanted)
        except StoreError as exc:
            logger.warning("poll failed consumer=%s error=%s", self._source.name, exc)
            return []

    async def _collect(self, wanted: int) -> list[Message]:
        """Up to ``wanted`` more messages from the polls of the next ``batch_wait`` seconds
        (a poll when a change signal says messages arrived, or when the idle wait is over);
        what it has when the time is up."""
        deadline = time.monotonic() + self._wait
        found: list[Message] = []
        while len(found) < wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            seen = self._source.snapshot()
            more = await self._poll(wanted - len(found))
            found += more
            if not more:
                await self._source.wait(seen, deadline - time.monotonic())
        return found

    async def _dispatch(self, handed: _Batch) -> None:
        batch = handed.messages
        observers = self._source.observers
        if observers.wants("delivered", "handler_started"):
            for message in batch:
                observers.delivered(message)
                observers.handler_started(message)
        started = time.perf_counter()
        try:
            await self._call(batch)
        except BaseException as exc:
            handed.returned = True
            failures = self._failures(batch, exc) if isinstance(exc, Exception) else {}
            if observers.wants("handler_finished"):
                seconds = time.perf_counter() - started
                # Last started, first finished: what a hook set up per message unwinds in order.
                for message in reversed(batch):
                    error = failures.get(message) if isinstance(exc, BatchFailureError) else exc
                    observers.handler_finished(message, seconds, error)
            if not isinstance(exc, Exception):
                raise
            await self._settle(batch, failures)
            return
        handed.returned = True
        if observers.wants("handler_finished"):
            seconds = time.perf_counter() - started
            for message in reversed(batch):
                observers.handler_finished(message, seconds, None)
        await self._settle(batch, {})

    def _failures(self, batch: list[Message], exc: Exception) -> dict[Message, Exception]:
        """The messages ``exc`` fails, with the error each is failed with: those a
        BatchFailureError names, else every one."""
        if isinstance(exc, RateLimited):
            return dict.fromkeys(batch, exc)  # a pause, said once by the failures
        if not isinstance(exc, BatchFailureError):
            logger.error(
                "batch handler failed messages=%d topics=%s error=%r",
                len(batch),
                ",".join(sorted({m.topic for m in batch})),
                exc,
                exc_info=exc,
            )
            return dict.fromkeys(batch, exc)
        failures: dict[Message, Exception] = {}
        for key, error in exc.failures.items():
            message = _member(batch, key)
            if message is None or not isinstance(error, Exception):
                # A mistake in the handler: no message is acked on a guess.
                logger.error(
                    "batch handler raised BatchFailureError naming %r (with %r), which is "
                    "not a message of its batch of %d or not an exception: every message fails",
                    key,
                    error,
                    len(batch),
                )
                return dict.fromkeys(batch, exc)
            failures[message] = error
        for message, error in failures.items():
            logger.error(
                "handler failed message=%s topic=%s receive_count=%d error=%r",
                message.id,
                message.topic,
                message.receive_count,
                error,
                exc_info=error,
            )
        return failures

    async def _settle(self, batch: list[Message], failures: dict[Message, Exception]) -> None:
        """Ack every unsettled message but the failed ones; fail those (retry or dead letter)."""
        # ack_together skips the messages the handler settled itself.
        acks = [m for m in batch if m not in failures] if failures else batch
        failed = [(m, e) for m, e in failures.items() if not m.settled]
        work: list[Awaitable[None]] = [self._source.fail(m, e) for m, e in failed]
        if acks:
            work.append(ack_together(acks))
        results: list[Any]
        if len(work) == 1:  # the common case: one ack_together, no task for it
            try:
                await work[0]
                results = [None]
            except Exception as exc:
                results = [exc]
        else:
            results = await gather_limited(IO_CONCURRENCY, work)
        for result in results:
            if isinstance(result, PawnQueueError):
                logger.error(
                    "settling a batch failed consumer=%s messages=%d error=%s; those not "
                    "settled are redelivered after the visibility timeout",
                    self._source.name,
                    len(batch),
                    result,
                )
            elif isinstance(result, BaseException):
                raise result


def _member(batch: list[Message], key: Any) -> Message | None:
    """The message of ``batch`` a BatchFailureError's key names: the message (async or
    blocking) or its position in the list."""
    if isinstance(key, BlockingMessage):
        key = key._inner
    if isinstance(key, Message):
        return key if any(m is key for m in batch) else None
    if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(batch):
        return batch[key]
    return None


class _Batch:
    """A batch handed out, as its listener sees it."""

    __slots__ = ("messages", "returned", "settling")

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.returned = False  # its handler returned (or raised)
        self.settling = False

    def check(self) -> bool:
        """True once every message is settled or waits only for the write that makes its
        ack durable. Looked at only once the handler returned, and true for good once true
        (a member leaves the write's waiters as it becomes settled), so a batch is scanned
        a few times, not at every turn of the listener."""
        if self.returned and not self.settling:
            self.settling = all(m.settled or m._waits_for_write() for m in self.messages)
        return self.settling
