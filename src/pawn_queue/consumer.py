"""Consumer: claims messages from its topics, in pull (poll) or push (listen) mode."""

from __future__ import annotations

import asyncio
import logging
import reprlib
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from pawn_queue._handling import handlers
from pawn_queue._handling.arguments import check_listen
from pawn_queue._handling.batching import BatchListener, BatchSource, check_batch
from pawn_queue._handling.failures import Failures
from pawn_queue._handling.flow import Flow, gated_batch, subscriber_flow
from pawn_queue._handling.handlers import Handler
from pawn_queue._internal.aio import IO_CONCURRENCY, cancel_and_wait, gather_limited
from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.acks import ack_together
from pawn_queue._protocol.claiming import Claimer
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.expiry import settled_if_expired
from pawn_queue._protocol.handout import Handout
from pawn_queue._protocol.lease_keeper import LeaseKeeper
from pawn_queue._protocol.registry import RegistryEntry
from pawn_queue._protocol.runtime import Runtime
from pawn_queue.config import PollingConfig
from pawn_queue.exceptions import (
    ArgumentError,
    LeaseLostError,
    StoreError,
)
from pawn_queue.retry import Retry

logger = logging.getLogger(__name__)

MessageHandler = Callable[[Message], Awaitable[Any]]  # the async kind of handlers.Handler

_DUE_SLACK = 0.01
_RETRY_SOON = 0.05  # after a poll that left candidates unclaimed (a race lost, a probe)
_RETRY_AFTER_FAILURE = 1.0  # after a poll whose claim failed (not sooner: the store may be down)

# Retry lived here once: still importable from here.
__all__ = ["Consumer", "MessageHandler", "Retry"]


class Consumer:
    """Consumes one or more topics. Obtain one with ``PawnQueue.register_consumer()``.

    Every message returned by :meth:`poll` is leased to this consumer, and the lease is
    refreshed in the background until the message is acked or nacked.
    """

    def __init__(
        self, entry: RegistryEntry, topics: list[str], runtime: Runtime, polling: PollingConfig
    ) -> None:
        """``polling``: this consumer's settings (its own visibility timeout, if it has one)."""
        self._entry = entry
        self._signals = runtime.signals
        self._topics = list(topics)
        self._leases = runtime.leases
        self._clock = runtime.clock
        self._observers = runtime.observers
        self._runtime = runtime  # for the limits of listen()
        self._limits_name = layout.subscriber_limit_name(self.topics, self.subscription)
        self._failures = Failures(runtime, self._limits_name)
        self._polling = polling
        # The leases of the messages handed out or buffered.
        self._keeper = LeaseKeeper(runtime.leases, polling.lease_refresh_interval_seconds)
        self._handout = Handout()
        self._claimer = Claimer(
            entry.entity_id,
            runtime,
            polling.visibility_timeout_seconds,
            self._keeper,
            self._handout,
        )
        self._next_topic = 0
        self._stopping = False  # listen() was cancelled and waits for its handlers
        runtime.signals.watch(self._topics)

    @property
    def id(self) -> str:
        """Stable UUIDv4 assigned at registration."""
        return self._entry.entity_id

    @property
    def name(self) -> str:
        return self._entry.name

    @property
    def topics(self) -> list[str]:
        return [layout.split_queue(queue)[0] for queue in self._topics]

    @property
    def subscription(self) -> str | None:
        """The subscription it reads of each topic; None when it competes on the topics."""
        return layout.split_queue(self._topics[0])[1]

    def __repr__(self) -> str:
        shown = f", subscription={self.subscription!r}" if self.subscription else ""
        return f"Consumer(name={self.name!r}, id={self.id!r}, topics={self.topics!r}{shown})"

    # -- pull -------------------------------------------------------------------------------

    async def poll(self, wait: float | None = None) -> list[Message]:
        """Claim and return up to ``polling.max_messages_per_poll`` messages, FIFO per topic.

        With change signals on, a topic is listed only if it may have changed since this
        consumer's last listing of it (a signal, something coming due, the sweep), so ``[]``
        may come back while another process's message waits, until this process saw its
        signal (about ``notify.idle_check_interval_seconds``; bounds in
        docs/protocol.md, rule 14). With ``wait`` (seconds), an empty poll waits on the
        signals as ``listen()`` does: it returns as soon as a poll finds a message, or ``[]``
        when ``wait`` has passed (a number of seconds >= 0, else ArgumentError). Messages of
        a batch object beyond the maximum stay leased here and come first in the next poll.
        """
        wait = 0.0 if wait is None else seconds_argument("wait", wait, zero=True)
        deadline = time.monotonic() + wait
        while True:
            seen = self._signals.snapshot(self._topics)
            messages = await self._poll_once()
            remaining = deadline - time.monotonic()
            if messages or remaining <= 0:
                if self._observers:
                    for message in messages:
                        self._observers.delivered(message)
                return messages
            await self._wait_for_change(seen, min(remaining, self._idle_seconds()))

    async def ack_all(self, messages: Iterable[Message]) -> None:
        """Ack ``messages`` together, as ``ack()`` on each would: the members of one batch
        object share one write (a lease write, or the object's delete when none is left),
        where acking them one after another costs a write each. Messages already settled
        are skipped. Raises the first error once every message was tried; the others stay
        acked."""
        batch = handlers.messages_argument("ack_all", messages, Message)
        await ack_together(list({id(m): m for m in batch}.values()))

    async def _wait_for_change(
        self, seen: dict[str, int], seconds: float, running: Iterable[asyncio.Task[None]] = ()
    ) -> None:
        """Wait until a signal says one of the topics changed since ``seen``, a late claim
        kept messages for the next poll, one of the handlers ``running`` ends, or
        ``seconds`` pass."""
        if self._claimer.arrived.is_set():
            return
        signal = asyncio.ensure_future(self._signals.wait(self._topics, seconds, seen))
        arrived = asyncio.ensure_future(self._claimer.arrived.wait())
        try:
            await asyncio.wait({signal, arrived, *running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (signal, arrived):
                waiting.cancel()
            await asyncio.gather(signal, arrived, return_exceptions=True)

    def _idle_seconds(self) -> float:
        """How long to wait before polling again when idle: until the backfill, or until a
        delayed message or a lease held elsewhere (a requeue delay, a crash) comes due."""
        idle = self._signals.idle_wait(self._polling.interval_seconds)
        if self._claimer.candidates_left:
            return min(idle, _RETRY_SOON)
        if self._claimer.claim_failed:
            return min(idle, _RETRY_AFTER_FAILURE)
        due = [
            t
            for t in (
                self._claimer.next_due,
                self._leases.next_expiry(),
                self._claimer.memory.next_due(self._topics),  # seen by listings before
            )
            if t is not None
        ]
        if due:
            idle = min(idle, max(0.0, (min(due) - self._clock()).total_seconds()) + _DUE_SLACK)
        return idle

    async def _poll_once(self, wanted: int | None = None, listening: bool = False) -> list[Message]:
        """Up to ``wanted`` messages: those kept from earlier claims first, then claims.
        For ``listen()`` (``listening``), a poll that found kept messages claims only in the
        topics that had none (:mod:`pawn_queue._protocol.handout`), and listings may be shared
        (:mod:`pawn_queue._protocol.listings`)."""
        wanted = wanted or self._polling.max_messages_per_poll
        self._claimer.start_poll()
        # Watched signals tell which topics may have changed since their last listing: the
        # others are not listed (pawn_queue._protocol.freshness; docs/protocol.md, rule 14).
        watched = await self._signals.refresh()
        count = len(self._topics)
        start, self._next_topic = self._next_topic, (self._next_topic + 1) % max(count, 1)
        order = [self._topics[(start + i) % count] for i in range(count)]
        messages: list[Message] = []
        dry: set[str] = set()  # listed in this poll, and nothing more to claim there
        waiting = self._claimer.buffered_topics
        if waiting and count > 1:
            # The members of a batch object wait here: each topic gets its share of the poll,
            # so a big batch in one topic does not hold back the others until it is done.
            share = max(1, wanted // count)
            for topic in order:
                room = min(share, wanted - len(messages))
                if room <= 0:
                    break
                if topic in waiting:
                    messages += self._claimer.buffered(room, topic)
                else:
                    claimed = await self._claimer.claim(topic, room, listening, watched)
                    if len(claimed) < room:
                        dry.add(topic)
                    messages += claimed
        messages += self._claimer.buffered(wanted - len(messages))
        if messages and listening:
            return await self._still_held(messages)
        for topic in order:
            if len(messages) >= wanted:
                break
            if topic not in dry:
                messages += await self._claimer.claim(
                    topic, wanted - len(messages), listening, watched
                )
        self._claimer.keep(messages[wanted:])
        return await self._still_held(messages[:wanted])

    async def _still_held(self, messages: list[Message]) -> list[Message]:
        """The messages whose lease stays ours a while. A slow poll, or a wait in the buffer
        (a stalled process), can leave little of a lease or none: it is renewed first, and
        a message taken over meanwhile is dropped (its new holder has it). One that cannot
        be checked now waits in the buffer."""
        # One check per lease (a batch object's members share one), and none that needs a
        # request while a lease is far from expiry: the common case stays cheap.
        objects = {id(m._claimed): m._claimed for m in messages}
        unsure = [o for o in objects.values() if not self._leases.comfortably_held(o.lease)]
        results = await gather_limited(IO_CONCURRENCY, (o.ensure_held() for o in unsure))
        outcome: dict[int, BaseException | None] = {
            id(o): r for o, r in zip(unsure, results, strict=True)
        }
        held = []
        for message in messages:
            result = outcome.get(id(message._claimed))
            if result is None:
                held.append(message)
            elif isinstance(result, StoreError):
                self._claimer.keep([message])
            elif not isinstance(result, LeaseLostError):
                raise result
        return held

    # -- push -------------------------------------------------------------------------------

    async def listen(
        self,
        handler: Handler,
        *,
        retry: Retry | None = None,
        grace: float | None = None,
        executor: Executor | None = None,
        concurrency: int | None = None,
        batch: int | None = None,
        batch_wait: float | None = None,
        max_in_flight: int | None = None,
        rate_limit: str | None = None,
    ) -> None:
        """Poll and call ``handler`` for each message until cancelled.

        ``handler`` is an ``async def`` function, run on the loop, or a plain function, run
        in a worker thread of ``executor`` (default: the loop's) with a blocking message
        whose ``ack()``/``nack()`` work from that thread (:mod:`pawn_queue._handling.handlers`).
        Messages of one poll are handled concurrently, and the next poll waits until each
        handler returned or waits only for the write that makes its ack durable (the
        members of a batch object then share that write, :mod:`pawn_queue._protocol.handout`); with
        ``concurrency``, up to that many handlers run at a time and a free slot is
        filled at once. A handler that raises dead-letters its message (the README's
        behaviour), unless ``retry`` is given: then the message is requeued with
        exponential backoff as the :class:`~pawn_queue.retry.Retry` says. A message the
        handler neither acked nor nacked is redelivered after the visibility timeout.

        Cancelling it stops claiming, lets running handlers finish (and settle) within
        ``grace`` seconds (default ``polling.shutdown_grace_seconds``), cancels those still
        running, then releases every lease still held so others take those messages at
        once, without counting a receive. A second cancel cuts the grace short.

        With ``batch=N``, ``handler`` takes a list of up to N messages (what one poll
        returned; with ``batch_wait`` seconds, what polls brought within that time, until
        N) and ``concurrency`` counts batches; when it returns, the messages it left
        unsettled are acked together (:mod:`pawn_queue._handling.batching`).

        ``max_in_flight`` caps the handlers running at once, ``rate_limit`` (``"20/s"``) their
        starts, across the processes reading the same topics or subscription (flow-control.md).

        A bad argument (a handler that cannot take a message, a ``retry`` that is not a
        :class:`~pawn_queue.retry.Retry`, a negative ``grace``...) raises ArgumentError
        before anything is claimed.
        """
        check_listen(
            handler,
            retry=retry,
            grace=grace,
            concurrency=concurrency,
            batch=batch,
            batch_wait=batch_wait,
        )
        if executor is not None and not isinstance(executor, Executor):
            raise ArgumentError(
                f"executor: got {reprlib.repr(executor)}, must be a concurrent.futures.Executor"
            )
        flow = subscriber_flow(self._runtime, self._limits_name, max_in_flight, rate_limit)
        concurrency = flow.concurrency(concurrency)
        batches: BatchListener | None = None
        if batch is not None or batch_wait is not None:
            size, wait = check_batch(batch, batch_wait)
            call_batch = handlers.as_async_batch(handler, executor=executor)
            call_batch = gated_batch(call_batch, flow)
            batches = BatchListener(self._batch_source(retry), call_batch, size, wait)
        call = handlers.as_async(handler, executor=executor)
        grace = self._polling.shutdown_grace_seconds if grace is None else grace
        running: set[asyncio.Task[None]] = set()
        registry = self._runtime.registry
        await registry.listening(self._topics, started=True)  # listeners share new messages
        try:
            try:
                if batches is not None:
                    await batches.serve(running, concurrency)
                else:
                    await self._serve(call, retry, running, concurrency, flow)
            except asyncio.CancelledError:
                self._stopping = True
                self._handout.stop()
                if running:
                    _, late = await asyncio.wait(running, timeout=grace)
                    for task in late:
                        task.cancel()
                raise
            finally:
                await cancel_and_wait(running)  # no handler outlives the listener
        finally:
            self._handout.stop()
            try:
                await asyncio.shield(self.release_all())
            finally:
                self._stopping = False
                await asyncio.shield(registry.listening(self._topics, started=False))

    async def _serve(
        self,
        call: handlers.AsyncHandler,
        retry: Retry | None,
        running: set[asyncio.Task[None]],
        concurrency: int | None,
        flow: Flow,
    ) -> None:
        """Claim and hand out messages until cancelled: a poll at a time, or (with
        ``concurrency``) as many as there are free slots. A handler that waits only for the
        write making its ack durable holds no next poll back, and, if its object's members
        share that write, no slot either: their acks then share it across polls
        (:mod:`pawn_queue._protocol.handout`)."""
        wanted = self._polling.max_messages_per_poll
        settling: dict[asyncio.Task[None], Callable[[], bool]] = {}

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            del settling[task]
            self._handout.progressed()

        loop = asyncio.get_running_loop()
        self._handout.start()
        while True:
            if concurrency is not None:
                # A task may be done before its callbacks took it out of ``running``.
                busy = [task for task in running if not (task.done() or settling[task]())]
                if len(busy) >= concurrency:
                    self._handout.round_settled()
                    await self._handout.until_settling(busy, [settling[t] for t in busy], 1)
                    continue
                wanted = min(concurrency - len(busy), self._polling.max_messages_per_poll)
            seen = self._signals.snapshot(self._topics)
            try:
                messages = await self._poll_once(wanted, listening=True)
            except StoreError as exc:
                logger.warning("poll failed consumer=%s error=%s", self.name, exc)
                messages = []
            if not messages:
                # Idle: wake on a change signal, or poll anyway after the backfill interval;
                # with handlers running, also when one ends (it may have requeued a message).
                self._handout.round_settled()
                await self._idle(seen, running if concurrency is not None else set())
                continue
            # Plain tasks, not a TaskGroup's: its bookkeeping cost a tenth of a member's ack.
            tasks = [loop.create_task(self._dispatch(call, m, retry, flow)) for m in messages]
            running.update(tasks)
            for task, message in zip(tasks, messages, strict=True):
                settling[task] = message._waits_for_write
                task.add_done_callback(finished)
            if concurrency is None:
                # A handler waiting for its own ack's delete (under a per-key write limit,
                # for its key's second) holds no poll back; with ``concurrency`` its slot
                # is held: the handler may go on once the ack returned.
                durable = [m._waits_for_durable for m in messages]
                await self._handout.until_settling(tasks, durable)
                self._handout.round_settled()

    async def _idle(self, seen: dict[str, int], running: set[asyncio.Task[None]]) -> None:
        await self._wait_for_change(seen, self._idle_seconds(), running)

    async def _dispatch(
        self, call: handlers.AsyncHandler, message: Message, retry: Retry | None, flow: Flow | None
    ) -> None:
        if await settled_if_expired(message, self._runtime):
            return  # it waited here past its own deadline (a pause, a limit)
        if flow is not None and not flow.open():
            async with flow.turn():
                return await self._dispatch(call, message, retry, None)
        observers = self._observers
        if observers:
            observers.delivered(message)
            observers.handler_started(message)
        started = time.perf_counter()
        try:
            await call(message)
        except BaseException as exc:
            if observers:  # an observer added by the handler sees it finish, not start
                observers.handler_finished(message, time.perf_counter() - started, exc)
            if not isinstance(exc, Exception):
                raise
            await self._failures.failed(message, exc, retry)
            return
        if observers:
            observers.handler_finished(message, time.perf_counter() - started, None)
        if not message.settled and not self._stopping:
            logger.warning(
                "handler returned without ack or nack message=%s; redelivered after the "
                "visibility timeout",
                message.id,
            )
            message.abandon()
        # Stopping: the lease stays held until the stop releases it, for redelivery at once.

    def _batch_source(self, retry: Retry | None) -> BatchSource:
        async def fail(message: Message, exc: Exception) -> None:
            await self._failures.settle(message, exc, retry)

        return BatchSource(
            poll=lambda wanted: self._poll_once(wanted, listening=True),
            snapshot=lambda: self._signals.snapshot(self._topics),
            idle=self._idle,
            wait=lambda seen, seconds: self._wait_for_change(
                seen, max(0.0, min(seconds, self._idle_seconds()))
            ),
            handout=self._handout,
            observers=self._observers,
            fail=fail,
            name=self.name,
        )

    # -- leases -----------------------------------------------------------------------------

    @property
    def held_leases(self) -> LeaseKeeper:
        """The leases of the messages this consumer handed out or holds for its next poll,
        refreshed in the background until they are settled or released."""
        return self._keeper

    async def release_all(self) -> None:
        """Release every lease this consumer holds and stop refreshing. Their messages can be
        claimed again at once, and this delivery does not count as a receive. The leases of
        messages acked lately, kept as tombstones, are deleted now too."""
        # Claims still in flight may yet win a lease: let them finish, then release it too.
        await self._claimer.close()
        await self._keeper.release_all()
        await self._leases.flush_tombstones()  # and the rest of the background work
