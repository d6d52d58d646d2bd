"""Consumer: claims messages from its topics, in pull (poll) or push (listen) mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pawn_queue import layout
from pawn_queue._aio import gather_limited
from pawn_queue.config import PollingConfig
from pawn_queue.envelope import (
    CorruptObject,
    DeadLetterInfo,
    Envelope,
    decode_pending,
    encode_unreadable,
    now_utc,
)
from pawn_queue.exceptions import ConfigError, LeaseLostError, NotFound, PawnQueueError, StoreError
from pawn_queue.leases import Lease, LeaseManager
from pawn_queue.message import ClaimedObject, Message
from pawn_queue.notify import ChangeSignals
from pawn_queue.registry import RegistryEntry
from pawn_queue.store.base import Store
from pawn_queue.topics import Topics

logger = logging.getLogger(__name__)

MessageHandler = Callable[[Message], Awaitable[Any]]

_LIST_PAGE = 1000  # one S3 LIST request
_MIN_PAGE = 100
_CONTENDED_WIDTH = 30  # page size under contention, in claims per poll
_CONTENTION_MEMORY_SECONDS = 30.0
_MIN_PATIENCE_SECONDS = 0.05
_DUE_SLACK = 0.01
_REMEMBER_SECONDS = 1.0
_SWEEP_SECONDS = 600.0  # how often a consumer looks for orphan leases in each topic
_IO_CONCURRENCY = 32


@dataclass(frozen=True, slots=True)
class Retry:
    """Retry policy for :meth:`Consumer.listen`: requeue a failed message after
    ``base_delay * factor ** (receives - 1)`` seconds (at most ``max_delay``), and dead-letter
    it once it was received ``max_receives`` times."""

    max_receives: int = 5
    base_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0

    def __post_init__(self) -> None:
        if self.max_receives < 1 or self.base_delay < 0 or self.factor < 1 or self.max_delay < 0:
            raise ConfigError(
                f"invalid {self!r}: needs max_receives >= 1, delays >= 0 and factor >= 1"
            )

    def delay(self, receive_count: int) -> float:
        return min(self.max_delay, self.base_delay * self.factor ** (receive_count - 1))


def _expired(key: str, retention_seconds: float) -> bool:
    due = layout.due_from_key(key)
    return due is not None and now_utc() - due > timedelta(seconds=retention_seconds)


class Consumer:
    """Consumes one or more topics. Obtain one with ``PawnQueue.register_consumer()``.

    Every message returned by :meth:`poll` is leased to this consumer, and the lease is
    refreshed in the background until the message is acked or nacked.
    """

    def __init__(
        self,
        entry: RegistryEntry,
        topics: list[str],
        store: Store,
        leases: LeaseManager,
        polling: PollingConfig,
        signals: ChangeSignals,
        topic_settings: Topics,
        visibility_timeout: float | None = None,
    ) -> None:
        self._topic_settings = topic_settings
        self._visibility = visibility_timeout or polling.visibility_timeout_seconds
        self._entry = entry
        self._signals = signals
        self._topics = list(topics)
        self._store = store
        self._leases = leases
        self._polling = polling
        self._held: dict[str, Lease] = {}
        self._buffer: deque[Message] = deque()
        self._refresher: asyncio.Task[None] | None = None
        self._refresher_stop = asyncio.Event()
        self._next_topic = 0
        self._contended_until: dict[str, float] = {}
        # topic -> candidates left by the last listing, and until when to trust them
        self._remembered: dict[str, tuple[list[tuple[layout.PendingKey, str]], float]] = {}
        self._late_claims: set[asyncio.Task[Any]] = set()  # and orphan-lease sweeps
        self._sweep_after: dict[str, float] = {}
        self._io_slots = asyncio.Semaphore(_IO_CONCURRENCY)
        self._claim_seconds = _MIN_PATIENCE_SECONDS  # moving average of a claim's latency
        self._next_due: datetime | None = None  # first delayed message seen by the last poll
        self._refresh_paused = False  # lets tests stand in for a stalled process

    @property
    def id(self) -> str:
        """Stable UUIDv4 assigned at registration."""
        return self._entry.entity_id

    @property
    def name(self) -> str:
        return self._entry.name

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    def __repr__(self) -> str:
        return f"Consumer(name={self.name!r}, id={self.id!r}, topics={self._topics!r})"

    # -- pull -------------------------------------------------------------------------------

    async def poll(self, wait: float | None = None) -> list[Message]:
        """Claim and return up to ``polling.max_messages_per_poll`` messages, FIFO per topic.

        With ``wait`` (seconds), an empty poll waits for messages: it returns as soon as a
        change signal says one arrived (or a full poll every ``polling.interval_seconds``
        finds one), or ``[]`` when ``wait`` has passed. Messages of a batch object beyond the
        maximum stay leased here and come first in the next poll.
        """
        deadline = time.monotonic() + (wait or 0.0)
        while True:
            seen = self._signals.snapshot(self._topics)
            messages = await self._poll_once()
            remaining = deadline - time.monotonic()
            if messages or remaining <= 0:
                return messages
            await self._signals.wait(self._topics, min(remaining, self._idle_seconds()), seen)

    def _idle_seconds(self) -> float:
        """How long to wait before polling again when idle: until the backfill, or until a
        delayed message or a lease held elsewhere (a requeue delay, a crash) comes due."""
        idle = self._signals.idle_wait(self._polling.interval_seconds)
        due = [t for t in (self._next_due, self._leases.next_expiry()) if t is not None]
        if due:
            idle = min(idle, max(0.0, (min(due) - now_utc()).total_seconds()) + _DUE_SLACK)
        return idle

    async def _poll_once(self) -> list[Message]:
        self._next_due = None
        wanted = self._polling.max_messages_per_poll
        messages = self._take_buffered(wanted)
        count = len(self._topics)
        start, self._next_topic = self._next_topic, (self._next_topic + 1) % max(count, 1)
        for i in range(count):
            if len(messages) >= wanted:
                break
            topic = self._topics[(start + i) % count]
            messages += await self._poll_topic(topic, wanted - len(messages))
        self._buffer.extend(messages[wanted:])
        return await self._still_held(messages[:wanted])

    async def _still_held(self, messages: list[Message]) -> list[Message]:
        """The messages whose lease stays ours a while. A slow poll, or a wait in the buffer
        (a stalled process), can leave little of a lease or none: it is renewed first, and
        a message taken over meanwhile is dropped (its new holder has it). One that cannot
        be checked now waits in the buffer."""
        results = await gather_limited(
            _IO_CONCURRENCY, (message._claimed.ensure_held() for message in messages)
        )
        held = []
        for message, result in zip(messages, results, strict=True):
            if result is None:
                held.append(message)
            elif isinstance(result, StoreError):
                self._buffer.append(message)
            elif not isinstance(result, LeaseLostError):
                raise result
        return held

    def _take_buffered(self, wanted: int) -> list[Message]:
        taken: list[Message] = []
        while self._buffer and len(taken) < wanted:
            message = self._buffer.popleft()
            if message.lease_held:
                taken.append(message)
        return taken

    async def _poll_topic(self, topic: str, wanted: int) -> list[Message]:
        self._maybe_sweep(topic)
        claimed: list[Message] = []
        contended = self._contended(topic)
        remembered, until = self._remembered.pop(topic, ([], 0.0))
        remembered = [
            (pending, key)
            for pending, key in remembered
            if self._leases.worth_claiming(topic, pending.lease_id(), key)
        ]
        if remembered and not contended and time.monotonic() < until:
            # What the last listing found beyond its claims: claiming it spares a LIST. Kept
            # briefly, so a message released meanwhile waits at most that long to come first.
            claimed, rest, conflicts = await self._claim_candidates(topic, remembered, wanted)
            if conflicts:
                self._contended_until[topic] = time.monotonic() + _CONTENTION_MEMORY_SECONDS
            elif rest:
                self._remembered[topic] = (rest, until)
            if len(claimed) >= wanted or conflicts:
                return claimed
        start_after: str | None = None
        recently_leased = await self._recently_leased(topic)
        groups_seen: set[str] = set()
        # Alone, the head of the listing is enough (FIFO). Competing, a wider page: each
        # consumer then claims a block at a random place in it, so blocks rarely overlap.
        # Not wider than that: every key of a page costs CPU to look at.
        page_size = min(_LIST_PAGE, max(_MIN_PAGE, wanted * (_CONTENDED_WIDTH if contended else 2)))
        while len(claimed) < wanted:
            page = await self._store.list(
                layout.messages_prefix(topic), start_after=start_after, limit=page_size
            )
            candidates: list[tuple[layout.PendingKey, str]] = []
            # Keys sort by the time messages become due: the first one not due yet ends the
            # scan (the skew margin keeps a producer's fast clock from hiding its messages).
            due_by = now_utc() + self._leases.margin
            not_due = False
            for meta in page:
                pending = layout.parse_pending_key(meta.key)
                if pending is None:
                    continue
                due = layout.due_from_key(meta.key)
                if due is not None and due > due_by:
                    not_due = True
                    due -= self._leases.margin
                    self._next_due = due if self._next_due is None else min(self._next_due, due)
                    break
                if pending.kind == "group":
                    # Only the oldest message of a group may be delivered, and one at a time.
                    if pending.group_hash in groups_seen:
                        continue
                    groups_seen.add(pending.group_hash)
                lease_id = pending.lease_id()
                lease_key = layout.lease_key(topic, lease_id)
                if lease_key in self._held:
                    continue
                if lease_key in recently_leased and not self._leases.expiry_known(topic, lease_id):
                    continue
                if self._leases.worth_claiming(topic, pending.lease_id(), meta.key):
                    candidates.append((pending, meta.key))
            if contended and len(candidates) > wanted:
                offset = random.randrange(len(candidates))
                candidates = candidates[offset:] + candidates[:offset]
            won, rest, conflicts = await self._claim_candidates(
                topic, candidates, wanted - len(claimed)
            )
            claimed += won
            if conflicts:
                self._contended_until[topic] = time.monotonic() + _CONTENTION_MEMORY_SECONDS
            elif rest and not contended:
                # Only the group heads of this page are in ``rest``: the next of a group is
                # found by a later listing, once the one before it is settled.
                self._remembered[topic] = (rest, time.monotonic() + _REMEMBER_SECONDS)
            if not_due or len(page) < page_size:
                break
            start_after = page[-1].key
        return claimed

    async def _claim_candidates(
        self, topic: str, candidates: list[tuple[layout.PendingKey, str]], wanted: int
    ) -> tuple[list[Message], list[tuple[layout.PendingKey, str]], int]:
        """Claim candidates in order until ``wanted`` messages are won: the messages, the
        candidates not tried, and how many claims other consumers won."""
        claimed: list[Message] = []
        conflicts = 0
        while candidates and len(claimed) < wanted:
            # Batch objects hold many messages: one claim may be enough.
            take = wanted - len(claimed)
            chunk, candidates = candidates[:take], candidates[take:]
            results = await self._claim_all(topic, chunk)
            for result in results:
                if isinstance(result, list):
                    claimed += result
                elif result is None:
                    conflicts += 1
                elif isinstance(result, asyncio.CancelledError):
                    raise result
                elif isinstance(result, BaseException):
                    logger.warning("claim failed topic=%s error=%s", topic, result)
        return claimed, candidates, conflicts

    async def _claim_all(
        self, topic: str, chunk: list[tuple[layout.PendingKey, str]]
    ) -> list[list[Message] | BaseException | None]:
        """Claim concurrently, then read what was won. Stragglers are not waited for long:
        some stores answer the losers of a claim race only after a second or two. A
        straggler that wins later is read in the background into the buffer (next poll)."""
        claims = {
            asyncio.create_task(self._claim_lease(topic, pending, key)): (pending, key)
            for pending, key in chunk
        }
        started = time.monotonic()
        done: set[asyncio.Task[Lease | None]] = set()
        try:
            # Patience follows what claims usually take here, so a slow store is not cut off.
            done, waiting = await asyncio.wait(
                claims,
                timeout=max(_MIN_PATIENCE_SECONDS * 5, 5 * self._claim_seconds),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if done:
                first = time.monotonic() - started
                self._claim_seconds = 0.8 * self._claim_seconds + 0.2 * first
            if waiting and done:
                patience = max(_MIN_PATIENCE_SECONDS, 3 * (time.monotonic() - started))
                more, waiting = await asyncio.wait(waiting, timeout=patience)
                done |= more
        finally:
            for claim, (pending, key) in claims.items():
                if not claim.done():
                    late = asyncio.create_task(self._read_late(claim, topic, pending, key))
                    self._late_claims.add(late)
                    late.add_done_callback(self._late_claims.discard)
        results: list[list[Message] | BaseException | None] = []
        reads = []
        for claim, (pending, key) in claims.items():  # in listing order: FIFO
            if claim not in done:
                continue
            if claim.exception() is not None:
                results.append(claim.exception())
            elif (lease := claim.result()) is None:
                results.append(None)
            else:
                reads.append(self._read(topic, pending, key, lease))
        results += await asyncio.gather(*reads, return_exceptions=True)
        return results

    async def _claim_lease(self, topic: str, pending: layout.PendingKey, key: str) -> Lease | None:
        """The lease on a message, batch or group message; None if someone else has it."""
        lease_id = pending.lease_id()
        if not self._leases.worth_claiming(topic, lease_id, key):
            return None  # settled or claimed in this process since the listing
        async with self._io_slots:
            return await self._leases.claim(
                topic, pending.object_id, key, self.id, self._visibility, lease_id=lease_id
            )

    async def _read_late(
        self, claim: asyncio.Task[Lease | None], topic: str, pending: layout.PendingKey, key: str
    ) -> None:
        try:
            lease = await claim
            if lease is not None:
                self._buffer.extend(await self._read(topic, pending, key, lease) or [])
        except StoreError as exc:
            logger.warning("claim failed topic=%s error=%s", topic, exc)

    def _maybe_sweep(self, topic: str) -> None:
        """Now and then, delete orphan leases of ``topic`` in the background."""
        now = time.monotonic()
        due = self._sweep_after.setdefault(topic, now + _SWEEP_SECONDS)
        if now < due:
            return
        self._sweep_after[topic] = now + _SWEEP_SECONDS
        sweep = asyncio.create_task(self._sweep(topic))
        self._late_claims.add(sweep)
        sweep.add_done_callback(self._late_claims.discard)

    async def _sweep(self, topic: str) -> None:
        try:
            await self._leases.sweep_orphans(topic, self.id, self._visibility)
        except StoreError as exc:
            logger.warning("orphan lease sweep failed topic=%s error=%s", topic, exc)

    def _contended(self, topic: str) -> bool:
        """Whether other consumers competed for this topic's messages lately."""
        return time.monotonic() < self._contended_until.get(topic, 0.0)

    async def _recently_leased(self, topic: str) -> set[str]:
        """Lease keys written within one visibility timeout, listed only under contention.

        One LIST of the lease prefix costs less than the create-only PUTs (and the GETs after
        them) that competing consumers would otherwise waste on each other's messages.
        """
        if not self._contended(topic):
            return set()
        fresh_after = now_utc() - timedelta(seconds=self._polling.visibility_timeout_seconds)
        leases = await self._store.list(layout.leases_prefix(topic))
        return {m.key for m in leases if m.last_modified > fresh_after}

    async def _read(
        self, topic: str, pending: layout.PendingKey, key: str, lease: Lease
    ) -> list[Message] | None:
        """Read a claimed object into messages; None if another consumer just settled it."""
        is_batch = pending.kind == "batch"
        object_id = pending.object_id
        try:
            obj = await self._store.get(key)
        except NotFound:
            # Acked by another consumer while we claimed (rule 4): give the lease back.
            await self._leases.release(lease, message_gone=True)
            return None
        except BaseException:
            await self._leases.release(lease)
            raise
        try:
            envelopes = decode_pending(obj.data, topic, object_id, batch=is_batch)
        except CorruptObject as exc:
            await self._quarantine(topic, object_id, key, obj.data, str(exc), lease)
            return []
        settings = await self._topic_settings.settings(topic)
        if settings.max_receive_count and lease.body.receive_count > settings.max_receive_count:
            # Received too often: dead-letter whatever is left of it instead of delivering.
            error = (
                f"received {lease.body.receive_count} times; "
                f"the topic allows {settings.max_receive_count}"
            )
            await self._dead_letter_all(key, lease, envelopes, "max_receive_count", error)
            return []
        if settings.retention_seconds and _expired(key, settings.retention_seconds):
            error = f"not consumed within the topic's retention of {settings.retention_seconds}s"
            if settings.retention_action == "dead_letter":
                await self._dead_letter_all(key, lease, envelopes, "retention", error)
            else:
                await self._store.delete(key)
                await self._leases.release(lease, message_gone=True)
                logger.info("expired message key=%s %s", key, error)
            return []
        claimed = ClaimedObject(
            key, lease, len(envelopes), self._store, self._leases, self._signals, self._forget
        )
        self._held[lease.key] = lease
        self._ensure_refresher()
        return [
            Message(envelope, claimed, index)
            for index, envelope in enumerate(envelopes)
            if index not in lease.settled
        ]

    async def _dead_letter_all(
        self, key: str, lease: Lease, envelopes: list[Envelope], reason: str, error: str
    ) -> None:
        claimed = ClaimedObject(
            key, lease, len(envelopes), self._store, self._leases, self._signals, self._forget
        )
        for index, envelope in enumerate(envelopes):
            if index not in lease.settled:
                await Message(envelope, claimed, index).dead_letter(reason, error)
        logger.warning("dead-lettered key=%s reason=%s %s", key, reason, error)

    async def _quarantine(
        self, topic: str, object_id: str, key: str, data: bytes, error: str, lease: Lease
    ) -> None:
        """Move an unreadable object to dead letter instead of blocking the topic."""
        await self._store.put(
            layout.dead_letter_key(topic, object_id),
            encode_unreadable(
                object_id, topic, data, DeadLetterInfo("corrupt", error, now_utc().isoformat(), key)
            ),
        )
        await self._store.delete(key)
        await self._leases.release(lease, message_gone=True)
        logger.warning("quarantined corrupt object key=%s error=%s", key, error)

    # -- push -------------------------------------------------------------------------------

    async def listen(self, handler: MessageHandler, *, retry: Retry | None = None) -> None:
        """Poll and call ``handler`` for each message until cancelled.

        Messages of one poll are handled concurrently. A handler that raises dead-letters its
        message (the README's behaviour), unless ``retry`` is given: then the message is
        requeued with exponential backoff until it was received ``retry.max_receives``
        times, and dead-lettered after that. A message the handler neither acked nor nacked
        is redelivered after the visibility timeout. On cancellation the leases still held
        are released, so other consumers can take those messages at once.
        """
        try:
            while True:
                seen = self._signals.snapshot(self._topics)
                try:
                    messages = await self._poll_once()
                except StoreError as exc:
                    logger.warning("poll failed consumer=%s error=%s", self.name, exc)
                    messages = []
                if not messages:
                    # Idle: wake on a change signal, or poll anyway after the backfill interval.
                    await self._signals.wait(self._topics, self._idle_seconds(), seen)
                    continue
                await asyncio.gather(*(self._dispatch(handler, m, retry) for m in messages))
        finally:
            await asyncio.shield(self.release_all())

    async def _dispatch(
        self, handler: MessageHandler, message: Message, retry: Retry | None
    ) -> None:
        try:
            await handler(message)
        except Exception as exc:
            logger.error(
                "handler failed message=%s topic=%s receive_count=%d error=%r",
                message.id,
                message.topic,
                message.receive_count,
                exc,
            )
            if message.settled:
                return
            try:
                if retry is not None and message.receive_count < retry.max_receives:
                    await message.nack(requeue=True, delay=retry.delay(message.receive_count))
                else:
                    await message.dead_letter("handler_error", repr(exc))
            except PawnQueueError as nack_exc:
                logger.error("settling failed message=%s error=%s", message.id, nack_exc)
            return
        if not message.settled:
            logger.warning(
                "handler returned without ack or nack message=%s; redelivered after the "
                "visibility timeout",
                message.id,
            )
            message.abandon()

    # -- leases -----------------------------------------------------------------------------

    def _forget(self, lease: Lease) -> None:
        self._held.pop(lease.key, None)

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher_stop = asyncio.Event()
            self._refresher = asyncio.create_task(self._refresh_loop(self._refresher_stop))

    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        interval = self._polling.lease_refresh_interval_seconds
        # Each lease is refreshed on its own: a slow or stalled request must not hold back
        # the refreshes of the others (their leases would run out meanwhile).
        running: dict[str, asyncio.Task[None]] = {}
        slots = asyncio.Semaphore(_IO_CONCURRENCY)
        try:
            while self._held:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
                if stop.is_set():
                    return
                if self._refresh_paused:
                    continue
                for key in [k for k in running if running[k].done()]:
                    del running[key]
                for lease in list(self._held.values()):
                    if lease.key not in running:
                        running[lease.key] = asyncio.create_task(self._refresh(lease, slots))
        finally:
            # Never stop mid-write: a cancelled request can still land after the release.
            await asyncio.gather(*running.values(), return_exceptions=True)

    async def _refresh(self, lease: Lease, slots: asyncio.Semaphore) -> None:
        async with slots:
            try:
                await self._leases.refresh(lease)
            except LeaseLostError:
                self._held.pop(lease.key, None)
            except Exception as exc:
                logger.warning("lease refresh failed key=%s error=%s", lease.key, exc)

    async def release_all(self) -> None:
        """Release every lease this consumer holds and stop refreshing."""
        # Claims still in flight may yet win a lease: let them finish, then release it too.
        await asyncio.gather(*self._late_claims, return_exceptions=True)
        if self._refresher is not None:
            # Stop it between rounds, never mid-write: a cancelled request can still land
            # after the release and resurrect the lease.
            self._refresher_stop.set()
            await self._refresher
            self._refresher = None
        self._buffer.clear()
        held, self._held = list(self._held.values()), {}
        results = await gather_limited(
            _IO_CONCURRENCY, (self._leases.release(lease) for lease in held)
        )
        for lease, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("lease release failed key=%s error=%s", lease.key, result)
