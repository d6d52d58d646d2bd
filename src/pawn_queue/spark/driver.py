"""The driver side of a streaming read: claims, micro-batch manifests, acks.

It lives in Spark's long-lived stream-reader process (one per query run) on that process's
event loop, and keeps state for the run: the leases the query holds (refreshed in the
background), the manifests it created or loaded, and when it last looked for messages.

A micro-batch ``n`` is the manifest ``_spark/{query}/batches/{n}.json``: the objects it owns,
written before Spark logs offset ``n``. Spark calls ``latestOffset(start=n)`` only once batch
``n`` is in its commit log, and ``commit(n)`` a moment later; either one acks every manifest up
to ``n`` (objects deleted, then their leases, then the manifest). A restart replays the
manifest of an unfinished batch and takes its leases back; manifests after the checkpoint that
Spark never logged are discarded (leases given back) and rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import datetime

from pawn_queue._internal.aio import gather_limited
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import CorruptObject, decode_batch, now_utc
from pawn_queue._protocol.lease_keeper import LeaseKeeper
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue._protocol.scanning import scan_page
from pawn_queue._protocol.strategy import resolve_strategy
from pawn_queue._protocol.subscriptions import Subscriptions
from pawn_queue._protocol.topics import Topics
from pawn_queue.exceptions import NotFound, PawnQueueError
from pawn_queue.spark import runtime
from pawn_queue.spark.manifests import Budget, Limit, Manifest
from pawn_queue.spark.options import SourceOptions
from pawn_queue.spark.reading import DataLossError, ObjectRef
from pawn_queue.store import open_store
from pawn_queue.store.base import ObjectMeta, Store

logger = logging.getLogger(__name__)

_NAMESPACE = uuid.UUID("0b5c8f0e-3f52-4b8e-9d0c-7a1f2e6d4c10")
_IO_CONCURRENCY = 64


def _lease_key(ref: ObjectRef) -> str:
    pending = layout.parse_pending_key(ref.key)
    if pending is None:
        raise PawnQueueError(f"manifest names {ref.key!r}, which is not a message key")
    return layout.lease_key(layout.queue_of(ref.key), pending.lease_id())


class StreamDriver:
    """One query run's claims, manifests and acks. Create with :meth:`open` (on the loop)."""

    def __init__(
        self, options: SourceOptions, query: str, store: Store, leases: LeaseManager
    ) -> None:
        config = options.config()
        self.query = query
        self.consumer_id = str(uuid.uuid5(_NAMESPACE, query))
        self._options = options
        self._store = store
        self._leases = leases
        self._signals = ChangeSignals(store, config.notify)
        self._poll_interval = self._signals.idle_wait(config.polling.interval_seconds)
        self._timeout = options.lease_timeout
        # The leases of live manifests, refreshed a third of the lease timeout apart.
        self._keeper = LeaseKeeper(leases, options.lease_timeout / 3)
        self._manifests: dict[int, Manifest] = {}  # loaded or created in this run, not acked
        self._stored: set[int] = set()  # in the store at start, not loaded yet
        self._cleaned = False
        self._last_scan = 0.0
        self._signalled = False
        self._backlog = False
        self._bound: datetime | None = None  # Trigger.AvailableNow: admit keys up to this
        self._next_topic = 0
        self._rows_per_batch_object = 100.0
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def open(
        cls, options: SourceOptions, query: str, store: Store | None = None
    ) -> StreamDriver:
        """Check the store and the topics, resolve the lease strategy, start background work.

        ``store`` replaces the one the options select (tests, request counting).
        """
        layout.validate_name(query, "pawnqueue query id")
        config = options.config()
        store = store or open_store(config)
        await runtime.check_store(store, options.topics, options.subscription)
        resolved = await resolve_strategy(store, config.concurrency.strategy)
        driver = cls(options, query, store, LeaseManager(store, resolved, config.concurrency))
        prefix = layout.spark_manifests_prefix(query)
        for meta in await store.list(prefix):
            batch = layout.spark_manifest_batch(meta.key)
            if batch is not None:
                driver._stored.add(batch)
        if options.subscription is None:
            await _warn_of_subscriptions(store, options.topics)
        driver._tasks = [asyncio.create_task(driver._watch_loop())]
        logger.info(
            "pawnqueue stream query=%s queues=%s strategy=%s manifests=%s",
            query,
            ",".join(options.queues),
            resolved,
            sorted(driver._stored),
        )
        return driver

    async def stop(self) -> None:
        """Stop background work. Leases stay until they expire: a restart takes them back.
        Those of acked messages (a run's whose messages are all acked) are deleted now."""
        await self._keeper.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._leases.flush_tombstones()

    # -- Spark's calls ----------------------------------------------------------------------

    async def latest(self, start: int, limit: Limit) -> int:
        """The end of the next micro-batch after ``start`` (``start`` itself: nothing new)."""
        await self.ack_through(start)
        if not self._cleaned:
            await self._discard_after(start)
            self._cleaned = True
        following = start + 1
        if following in self._manifests:
            return following  # built by an earlier call that Spark did not log
        if not self._due():
            return start
        refs = await self._scan(limit)
        if not refs:
            return start
        manifest = Manifest(following, tuple(refs))
        try:
            await self._store.put(
                layout.spark_manifest_key(self.query, following), manifest.encode(self.query)
            )
        except BaseException:
            await self._keeper.release([self._keeper_lease(ref) for ref in refs])
            raise
        self._manifests[following] = manifest
        return following

    async def plan(self, start: int, end: int) -> list[Manifest]:
        """The manifests of micro-batches ``start+1 .. end``; after a restart, load them and
        take their leases back."""
        manifests = []
        for batch in range(start + 1, end + 1):
            manifest = self._manifests.get(batch)
            if manifest is None:
                manifest = await self._load(batch)
                if manifest is None:
                    message = (
                        f"the manifest of micro-batch {batch} "
                        f"({layout.spark_manifest_key(self.query, batch)}) is gone"
                    )
                    if self._options.fail_on_data_loss:
                        raise DataLossError(f"{message}; set failOnDataLoss=false to skip it")
                    logger.warning("%s; skipping the micro-batch", message)
                    continue
                await self._leases_for(manifest.refs)  # take their leases back
                self._manifests[batch] = manifest
                self._stored.discard(batch)
            manifests.append(manifest)
        return manifests

    async def ack_through(self, end: int) -> None:
        """Ack every manifest up to ``end``: Spark committed those micro-batches."""
        for batch in sorted(n for n in self._stored | self._manifests.keys() if n <= end):
            manifest = self._manifests.get(batch) or await self._load(batch)
            if manifest is not None:
                await self._ack(manifest)
            await self._store.delete(layout.spark_manifest_key(self.query, batch))
            self._manifests.pop(batch, None)
            self._stored.discard(batch)

    def prepare_available_now(self, at: datetime) -> None:
        """Trigger.AvailableNow: admit only messages due by ``at``, and look on every call."""
        self._bound = at

    # -- looking for messages ---------------------------------------------------------------

    def _due(self) -> bool:
        """Whether to look at the store now: on a change signal, a backlog, AvailableNow, or
        once every backfill interval (``notify.backfill_interval_seconds``, or
        ``polling.interval_seconds`` without signals), so nothing depends on a signal."""
        if self._backlog or self._signalled or self._bound is not None:
            return True
        return time.monotonic() - self._last_scan >= self._poll_interval

    async def _scan(self, limit: Limit) -> list[ObjectRef]:
        self._last_scan = time.monotonic()
        self._signalled = self._backlog = False
        budget = Budget(limit)
        refs: list[ObjectRef] = []
        queues = self._options.queues  # the topics' own, or their subscription's
        start, self._next_topic = self._next_topic, (self._next_topic + 1) % len(queues)
        for i in range(len(queues)):
            if budget.full():
                break
            await self._scan_queue(queues[(start + i) % len(queues)], budget, refs)
        if budget.full():
            self._backlog = True  # more may be waiting: look again at the next call
        return refs

    async def _scan_queue(self, queue: str, budget: Budget, refs: list[ObjectRef]) -> None:
        """Claim the queue's messages (a topic's own or a subscription's) in key order
        (FIFO) while the budget allows."""
        due_by = self._bound if self._bound is not None else now_utc()
        start_after: str | None = None
        groups_seen: set[str] = set()
        while not budget.full():
            page = await self._store.list(
                layout.messages_prefix(queue), start_after=start_after, limit=layout.LIST_PAGE
            )
            candidates, finished, start_after = self._candidates(queue, page, due_by, groups_seen)
            excess: list[Lease] = []
            while candidates and not budget.full():
                chunk, candidates = self._next_chunk(candidates, budget)
                results = await gather_limited(
                    _IO_CONCURRENCY, (self._claim(queue, *c, budget.counts_rows) for c in chunk)
                )
                for result in results:
                    if isinstance(result, asyncio.CancelledError):
                        raise result
                    if isinstance(result, BaseException):
                        logger.warning("claim failed queue=%s error=%s", queue, result)
                    elif result is not None:
                        ref, lease, rows = result
                        if budget.admits(ref.size, rows) or not refs:
                            budget.take(ref.size, rows)
                            refs.append(ref)
                            self._keeper.hold(lease)
                        elif lease.members is not None and lease.members != {ref.key}:
                            # A run's lease: the messages of it taken already keep it.
                            self._leases.member_done(lease, ref.key)
                        else:
                            excess.append(lease)
            if excess or candidates:
                self._backlog = True
            await self._keeper.release(excess)
            if finished:
                return

    def _next_chunk(
        self, candidates: list[tuple[layout.PendingKey, ObjectMeta]], budget: Budget
    ) -> tuple[
        list[tuple[layout.PendingKey, ObjectMeta]], list[tuple[layout.PendingKey, ObjectMeta]]
    ]:
        """The next candidates to claim together: of one kind (message or batch object), and
        as many as the budget probably admits."""
        batch = candidates[0][0].kind == "batch"
        size = budget.chunk(self._rows_per_batch_object if batch else 1.0)
        count = 0
        runs: set[str] = set()  # a run's next message is taken in once its lease is won
        while (
            count < min(size, len(candidates))
            and (candidates[count][0].kind == "batch") == batch
            and candidates[count][0].lease_id() not in runs
        ):
            if candidates[count][0].kind == "run":
                runs.add(candidates[count][0].lease_id())
            count += 1
        return candidates[:count], candidates[count:]

    def _candidates(
        self, queue: str, page: list[ObjectMeta], due_by: datetime, groups_seen: set[str]
    ) -> tuple[list[tuple[layout.PendingKey, ObjectMeta]], bool, str | None]:
        """The claimable objects of a listing page, whether the listing ends here, and where
        its next page starts (past the rest of a priority band no message of which is due)."""
        scanned = scan_page(page, due_by, self._leases.margin, groups_seen)
        claimable = [
            (pending, meta)
            for pending, meta in scanned.found
            if (
                pending.kind == "run"  # a run held here takes it in (worth_claiming_listed)
                or layout.lease_key(queue, pending.lease_id()) not in self._keeper
            )
            and self._leases.worth_claiming_listed(queue, pending.lease_id(), meta.key)
        ]
        finished = scanned.ends or len(page) < layout.LIST_PAGE
        return claimable, finished, None if finished else scanned.next_start(page)

    async def _claim(
        self, queue: str, pending: layout.PendingKey, meta: ObjectMeta, count_rows: bool
    ) -> tuple[ObjectRef, Lease, int] | None:
        """Claim one object and check that it is still there (rule 4); count its messages
        when the limit is in rows."""
        lease = self._leases.join_run(queue, pending.lease_id(), meta.key, self.consumer_id)
        if lease is None:
            lease = await self._leases.claim(
                queue,
                pending.object_id,
                meta.key,
                self.consumer_id,
                self._timeout,
                lease_id=pending.lease_id(),
            )
        if lease is None:
            return None
        rows = 1
        if pending.kind == "batch" and count_rows:
            obj = await self._leases.read_claimed(lease, lambda: self._store.get(meta.key))
            if obj is None:
                return None
            with contextlib.suppress(CorruptObject):
                rows = max(len(decode_batch(obj.data)) - len(lease.settled), 1)
            self._rows_per_batch_object = 0.8 * self._rows_per_batch_object + 0.2 * rows
        elif (
            await self._leases.read_claimed(lease, lambda: self._store.head(meta.key), meta.key)
            is None
        ):
            return None
        ref = ObjectRef(meta.key, meta.size, tuple(sorted(lease.settled)), lease.body.receive_count)
        return ref, lease, rows

    # -- acking and taking leases back ------------------------------------------------------

    async def _ack(self, manifest: Manifest) -> None:
        """Delete the objects whose leases the query holds, then those leases (rule 4)."""
        leases = await self._leases_for(manifest.refs)
        checks = await gather_limited(
            _IO_CONCURRENCY, (self._leases.ensure_held(lease) for _, lease in leases)
        )
        held = []
        for (ref, lease), check in zip(leases, checks, strict=True):
            self._keeper.forget(lease)
            if isinstance(check, BaseException):
                logger.warning("not acking key=%s: lease lost (%s)", ref.key, check)
            else:
                held.append((ref.key, lease))
        if held:
            await self._leases.settle_many(held)
        logger.info(
            "pawnqueue acked query=%s batch=%d objects=%d of %d",
            self.query,
            manifest.batch,
            len(held),
            len(manifest.refs),
        )

    async def _leases_for(self, refs: Iterable[ObjectRef]) -> list[tuple[ObjectRef, Lease]]:
        """Our lease of each ref (taken back from an earlier run where needed); refs whose
        lease is someone else's are left out."""
        refs = list(refs)
        # The refs of one lease (a run's) one after the other: the first takes it back.
        shared: dict[str, list[ObjectRef]] = {}
        for ref in refs:
            shared.setdefault(_lease_key(ref), []).append(ref)
        found: dict[str, Lease | None] = {}

        async def take_back(group: list[ObjectRef]) -> None:
            for ref in group:
                found[ref.key] = await self._lease_for(ref)

        results = await gather_limited(_IO_CONCURRENCY, map(take_back, shared.values()))
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [(ref, lease) for ref in refs if (lease := found[ref.key]) is not None]

    async def _lease_for(self, ref: ObjectRef) -> Lease | None:
        lease = self._keeper.get(_lease_key(ref))
        if lease is not None and not lease.lost:
            return lease
        lease = await self._leases.adopt(
            layout.queue_of(ref.key), ref.key, self.consumer_id, self._timeout
        )
        if lease is not None:
            self._keeper.hold(lease)
        return lease

    def _keeper_lease(self, ref: ObjectRef) -> Lease:
        lease = self._keeper.get(_lease_key(ref))
        assert lease is not None, ref.key  # every ref of a manifest being built is held
        return lease

    async def _discard_after(self, start: int) -> None:
        """Manifests after ``start`` from an earlier run were never logged by Spark: give
        their leases back and delete them, so the next micro-batch is built afresh."""
        for batch in sorted(n for n in self._stored if n > start):
            manifest = await self._load(batch)
            if manifest is not None:
                leases = await self._leases_for(manifest.refs)
                await self._keeper.release([lease for _, lease in leases])
            await self._store.delete(layout.spark_manifest_key(self.query, batch))
            self._stored.discard(batch)
            logger.info(
                "pawnqueue discarded unlogged manifest query=%s batch=%d", self.query, batch
            )

    async def _load(self, batch: int) -> Manifest | None:
        try:
            stored = await self._store.get(layout.spark_manifest_key(self.query, batch))
        except NotFound:
            return None
        return Manifest.decode(batch, stored.data)

    # -- background -------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        """Note change signals of the queues read (one HEAD of the signal ring's next key
        per check): a producer signals each subscription it copies a message into."""
        topics = list(self._options.queues)
        while True:
            seen = self._signals.snapshot(topics)
            if await self._signals.wait(topics, self._poll_interval, seen):
                self._signalled = True


async def _warn_of_subscriptions(store: Store, topics: tuple[str, ...]) -> None:
    """Say so when a query reads the own queue of a topic that has subscriptions: it gets
    only what was published before them (one GET of each topic's subscription index)."""
    subscriptions = Subscriptions(store, Topics(store))
    for topic in topics:
        names = [layout.split_queue(d.queue)[1] for d in await subscriptions.destinations(topic)]
        if names:
            logger.warning(
                "pawnqueue: topic %r has subscriptions (%s): its messages go to them, not to "
                "the topic's own queue this query reads; read one with option 'subscription'",
                topic,
                ", ".join(str(n) for n in names),
            )


def new_query_id(name: str) -> str:
    """A fresh id for a query started on an empty checkpoint: ``{name}-{12 hex}``."""
    return f"{name}-{uuid.uuid4().hex[:12]}"
