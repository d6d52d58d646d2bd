"""Leases: the only code that claims, refreshes, takes over or releases a message.

:class:`LeaseManager` decides when: it claims, keeps (refreshes while a handler works),
releases and settles leases, adopts a consumer's own leases after a restart, sweeps the
orphan leases of messages that are gone, and remembers what it learned (held here, live
elsewhere, settled here) to save requests. How a lease object is written and read on the
store under either strategy (``conditional_write``, ``csprng_verify``) is
:mod:`pawn_queue._protocol.lease_protocol`'s.

A lease is expired for a taker only when ``now > expires_at + clock_skew_margin`` (at
``expires_at`` for a lease its holder released: nobody holds it), and its
holder treats it as safe only while ``now < expires_at - clock_skew_margin``: clocks that
differ by less than the margin never see a live lease as expired. Every one of these
decisions reads :attr:`LeaseManager.clock`, the host's UTC wall clock.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from pawn_queue._internal.aio import IO_CONCURRENCY, Background, gather_limited
from pawn_queue._internal.config_sections import claim_seconds
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import CorruptObject, LeaseBody, now_utc
from pawn_queue._protocol.key_writes import KeyWriteLimit
from pawn_queue._protocol.lease_protocol import RELEASED, Lease, ResolvedStrategy
from pawn_queue._protocol.runs import SETTLED_MEMORY, SETTLED_SECONDS, RunLeases
from pawn_queue._protocol.shares import Shares
from pawn_queue._protocol.tombstones import TOMBSTONE_SECONDS, Tombstones
from pawn_queue.config import ConcurrencyConfig
from pawn_queue.exceptions import LeaseLostError, NotFound, StoreError
from pawn_queue.store.base import Store
from pawn_queue.store.coalesce import DeleteCoalescer
from pawn_queue.store.throttling import throttle_backoff_of

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class LeaseManager(RunLeases):
    """Claims and keeps leases for one store with one resolved strategy."""

    def __init__(
        self,
        store: Store,
        strategy: ResolvedStrategy,
        concurrency: ConcurrencyConfig,
        clock: Callable[[], datetime] = now_utc,
        *,
        deleter: DeleteCoalescer | None = None,
        background: Background | None = None,
        keep_tombstones: bool = False,
    ) -> None:
        """``deleter`` and ``background``: the queue's own (its runtime's), shared with the
        other code that deletes or works in the background there. ``keep_tombstones``: keep
        the leases of acked messages a while (:mod:`pawn_queue._protocol.tombstones`)."""
        self._background = background or Background()
        super().__init__(store, strategy, concurrency, clock, self._background)
        self._deleter = deleter or DeleteCoalescer(store)
        self._tombstones = Tombstones(self.release_gone, self._background)
        self._keep_tombstones = keep_tombstones
        self.key_writes = KeyWriteLimit(clock, throttle_backoff_of(store))
        # What this process knows without asking the store: lease keys held or claimed
        # here, and message keys settled here a moment ago (RunLeases'); lease keys seen
        # live elsewhere, and until when (the protocol's _busy_until).
        # The consumer processes' shares of each queue, and per queue when to look for
        # messages of another's share that this process may take then.
        self.shares: Shares | None = None
        self._share_due: dict[str, datetime] = {}
        # Told when a message is given back (a requeue, a stop): consumers that looked at
        # its topic and found nothing else must look again (the queue's change signals).
        self.on_freed: Callable[[str], None] | None = None

    def _freed(self, topic: str) -> None:
        if self.on_freed is not None:
            self.on_freed(topic)

    # -- claiming ---------------------------------------------------------------------------

    def forget_queue(self, topic: str) -> None:
        """Every lease of ``topic`` is gone (a seek purged them): those held here are lost,
        so their messages can no longer be settled, and what this process learned of the
        others is forgotten, so the replayed copies, which have the same lease keys, are
        claimed at once. docs/protocol.md, "Replay"."""
        prefix = layout.leases_prefix(topic)
        # Not the kept leases of acked messages: the purge did not see them (their messages
        # were gone), and worth_claiming_listed deletes one as its replayed copy shows up.
        for key in [
            k for k in self._held_here if k.startswith(prefix) and k not in self._tombstones
        ]:
            self._held_here.pop(key).lost = True
        for key in [k for k in self._busy_until if k.startswith(prefix)]:
            del self._busy_until[key]
        self._freed(topic)

    def worth_claiming(self, topic: str, lease_id: str, message_key: str) -> bool:
        """False if this process knows the message is leased or gone (saves requests)."""
        key = layout.lease_key(topic, lease_id)
        if self._leased_here(key):
            return self._taken_in_here(key, message_key)
        return self._not_known_busy(key, message_key) and self._in_share(
            topic, lease_id, message_key
        )

    def _not_known_busy(self, key: str, message_key: str) -> bool:
        """Not settled here, and not known to be leased elsewhere."""
        if message_key in self._settled_here:
            return False
        until = self._busy_until.get(key)
        return until is None or until <= self.clock()

    def worth_claiming_listed(self, topic: str, lease_id: str, message_key: str) -> bool:
        """:meth:`worth_claiming`, for a message a listing just showed. A lease kept after
        an ack (a tombstone) that such a message supersedes is deleted first, and the
        queue's consumers look again: a replayed copy has the id, so the lease key, of the
        message acked (docs/protocol.md "Replay"), and would wait for the next sweep."""
        key = layout.lease_key(topic, lease_id)
        if self._leased_here(key):
            lease = self._tombstones.take_superseded(key, message_key)
            if lease is not None:
                self._background.start(self._release_superseded(lease))
                return False
            return self._taken_in_here(key, message_key)
        return self._not_known_busy(key, message_key) and self._in_share(
            topic, lease_id, message_key
        )

    def _in_share(self, topic: str, lease_id: str, message_key: str) -> bool:
        """Whether this process may claim it now (:mod:`pawn_queue._protocol.shares`). If
        not, and it is next in line, the topic is looked at again when it may
        (:meth:`next_expiry`); those further down the line are left to the one before them."""
        turn = None if self.shares is None else self.shares.free_at(topic, lease_id, message_key)
        if turn is None or turn[0] <= self.clock():
            return True
        if turn[1] and self.shares is not None:
            look = self.shares.look_at(turn[0])
            planned = self._share_due.get(topic)
            if planned is None or planned <= self.clock() or look < planned:
                self._share_due[topic] = look
        return False

    async def _release_superseded(self, lease: Lease) -> None:
        await self.release_gone(lease)
        self._freed(lease.topic)

    def reserve(self, topic: str, lease_id: str, message_key: str) -> bool:
        """Whether the message is worth claiming; if so, it is marked as claimed here until
        :meth:`unreserve`, so the other consumers of this process skip it rather than lose
        a race for it. Not a run held here: its holder takes the message in
        (:meth:`join_run`)."""
        if self._leased_here(layout.lease_key(topic, lease_id)):
            return False
        if not self.worth_claiming(topic, lease_id, message_key):
            return False
        self._claiming_here.add(layout.lease_key(topic, lease_id))
        return True

    def unreserve(self, topic: str, lease_id: str) -> None:
        """The claim :meth:`reserve` marked is over (won, lost or failed)."""
        self._claiming_here.discard(layout.lease_key(topic, lease_id))

    def expiry_known(self, topic: str, lease_id: str) -> bool:
        """Whether a look at this lease told when it may be taken over (then that time, not a
        guess from when it was written, decides)."""
        return layout.lease_key(topic, lease_id) in self._busy_until

    def next_expiry(self, topic: str | None = None) -> datetime | None:
        """The earliest time a lease known to be held elsewhere (of ``topic``, if given) may
        be taken over, or a message of another process's share may be taken here."""
        now = self.clock()
        if len(self._busy_until) > SETTLED_MEMORY:
            stale = now - timedelta(seconds=SETTLED_SECONDS)
            self._busy_until = {k: t for k, t in self._busy_until.items() if t > stale}
        prefix = layout.leases_prefix(topic) if topic is not None else ""
        busy = (t for k, t in self._busy_until.items() if t > now and k.startswith(prefix))
        shared = (t for q, t in self._share_due.items() if t > now and topic in (None, q))
        return min((*busy, *shared), default=None)

    async def claim(
        self,
        topic: str,
        message_id: str,
        message_key: str,
        consumer_id: str,
        visibility: float,
        *,
        lease_id: str | None = None,
    ) -> Lease | None:
        """Claim the message; None if another consumer holds a live lease on it.

        ``lease_id`` names the lease when it is not the message's own (a group's lease).
        Taking over an expired lease keeps its ``settled`` list (batch members already done)
        and counts one more receive.
        """
        key = layout.lease_key(topic, lease_id or message_id)
        body = self._new_body(consumer_id, message_id, message_key, visibility)
        seconds = claim_seconds(visibility)
        if self.strategy == "conditional_write":
            won = await self._claim_conditional(key, body, seconds)
        else:
            won = await self._claim_csprng(key, body, seconds)
        if won is None:
            return None
        etag, body = won
        self._busy_until.pop(key, None)
        lease = Lease(topic, message_id, message_key, key, etag, body, visibility)
        if layout.run_end(layout.lease_id_of(key)) is not None:
            lease.members = {message_key}
        self._hold(lease)
        return lease

    # -- keeping ----------------------------------------------------------------------------

    async def refresh(self, lease: Lease, visibility: float | None = None) -> None:
        """Push the lease's expiry to ``now + visibility``; raise LeaseLostError if it is gone."""
        async with lease.lock:
            if lease.released and not lease.lost:
                return
            await self._renew(lease, lease.visibility if visibility is None else visibility)

    async def read_claimed(
        self, lease: Lease, read: Callable[[], Awaitable[_T]], key: str = ""
    ) -> _T | None:
        """Rule 4: read the claimed object at ``key`` (``read``: its GET or HEAD) only after
        the claim. None if it is gone (acked meanwhile): the lease is given back. If the read
        fails, the lease is given back too and the error raised. A run's lease only lets the
        message go: the run's other messages stay covered."""
        try:
            return await read()
        except BaseException as exc:
            gone = isinstance(exc, NotFound)
            if lease.members is not None:
                self.member_done(lease, key)
            else:
                await self.release(lease, message_gone=gone)
            if gone:
                return None
            raise

    def let_expire(self, lease: Lease) -> None:
        """The lease is no longer refreshed (its holder could not settle the message): this
        process's consumers may take it over once it expired, as any other may (rule 10)."""
        self._let_go(lease)
        lease.expiring = True
        self._busy_until[lease.key] = lease.expires + self.margin
        self._freed(lease.topic)  # consumers here and elsewhere learn when it frees up

    async def ensure_held(self, lease: Lease) -> None:
        """Make sure the lease stays ours for a while; raise LeaseLostError if it is not ours."""
        if lease.lost or lease.released:
            raise LeaseLostError(f"lease on message {lease.message_id} is no longer held")
        if not self._safe_for(lease, windows=2):
            await self.refresh(lease)

    async def release(
        self,
        lease: Lease,
        *,
        message_gone: bool = False,
        requeue_delay: float | None = None,
        counted: bool = True,
    ) -> None:
        """Give the lease up; a lost lease is left be.

        ``message_gone`` (acked, dead-lettered or found missing), or a plain give-back with
        nothing to remember: delete the lease. Otherwise (a requeue, or a batch with settled
        members, or a message received before) leave a lease that others may take over after
        ``requeue_delay`` seconds (at once for 0 or None, whatever their clocks) and that
        keeps the receive count and the settled batch members. ``counted=False`` (a stop:
        the message was not handled) takes this delivery off the receive count (rule 10).
        """
        if message_gone:
            self._note_settled(lease.message_key)
        async with lease.lock:
            self._let_go(lease)
            if lease.lost or lease.released:
                return
            delay = requeue_delay or 0.0
            receives = lease.body.receive_count - (0 if counted else 1)
            remembers = requeue_delay is not None or lease.settled or receives > 0
            if not message_gone and remembers:
                with contextlib.suppress(LeaseLostError):
                    await self._renew(lease, delay, released=True, receives=receives)
                    # We know when it frees up: consumers here need not look it up.
                    self._busy_until[lease.key] = lease.expires
                    self._freed(lease.topic)
                lease.released = True
                return
            if not self._safe_for(lease, windows=1):
                # Too close to expiry to be sure a delete would hit our own lease: renew first.
                try:
                    await self._renew(lease, lease.visibility)
                except LeaseLostError:
                    return
            lease.released = True
            await self._deleter.delete(lease.key)
            # A consumer here may have read the lease live between _let_go and the delete:
            # forget that, or it would skip the message until the old expiry.
            self._busy_until.pop(lease.key, None)
            if not message_gone:
                self._freed(lease.topic)

    async def settle(
        self, lease: Lease, object_key: str, *, lease_later: bool = False, acked: bool = False
    ) -> None:
        """The messages of ``object_key`` are settled: delete the object, then its lease
        (rule 4). The object's delete raises; the lease's is only logged (a leftover lease
        blocks nothing, and :meth:`sweep_orphans` deletes it) and, with ``lease_later``, runs
        in the background (the queue's teardown waits for it), after a while if ``acked``
        (:meth:`release_gone_later`)."""
        await self.key_writes.before_delete((object_key,))
        with contextlib.suppress(NotFound):
            await self._deleter.delete(object_key)
        if lease.members is not None:
            self.member_done(lease, object_key)
        elif lease_later:
            self.release_gone_later(lease, acked=acked)
        else:
            await self.release_gone(lease)

    async def settle_many(self, settled: Sequence[tuple[str, Lease]]) -> None:
        """:meth:`settle` for many objects: one ``delete_many``, then their leases."""
        keys = [key for key, _ in settled]
        await self.key_writes.before_delete(keys)
        await self._store.delete_many(keys)
        for key, lease in settled:
            self.member_done(lease, key)
        gone = (self.release_gone(lease) for _, lease in settled if lease.members is None)
        await gather_limited(IO_CONCURRENCY, gone)

    async def adopt(
        self,
        topic: str,
        object_key: str,
        consumer_id: str,
        visibility: float,
    ) -> Lease | None:
        """Hold the lease of ``object_key`` again after a restart: a lease ``consumer_id``
        wrote in an earlier run is refreshed with if-match on its etag (rule 3: only its
        holder writes it, and the holder is that consumer); a free or expired one is
        claimed. None if someone else holds it."""
        pending = layout.parse_pending_key(object_key)
        if pending is None:
            return None
        key = layout.lease_key(topic, pending.lease_id())
        try:
            current = await self._store.get(key)
            body: LeaseBody | None = LeaseBody.decode(current.data)
        except (NotFound, CorruptObject):
            body = None
        if body is None or body.consumer_id != consumer_id:
            return await self.claim(
                topic,
                pending.object_id,
                object_key,
                consumer_id,
                visibility,
                lease_id=pending.lease_id(),
            )
        run = pending.kind == "run"
        if body.message_key not in ("", object_key) and not run:
            return None  # a group's lease, on a later message of the group
        if run and (held := self.join_run(topic, pending.lease_id(), object_key, consumer_id)):
            return held  # adopted already, for another message of its second
        lease = Lease(topic, pending.object_id, object_key, key, current.meta.etag, body, 0.0)
        lease.members = {object_key} if run else None
        try:
            await self.refresh(lease, visibility)
        except LeaseLostError:
            return None
        self._hold(lease)
        return lease

    async def release_gone(self, lease: Lease) -> None:
        """Give up the lease of a message that is gone (acked or dead-lettered). A failure is
        only logged: a leftover lease blocks nothing, and :meth:`sweep_orphans` deletes it."""
        try:
            await self.release(lease, message_gone=True)
        except StoreError as exc:
            logger.warning("lease release failed key=%s error=%s", lease.key, exc)

    def release_gone_later(self, lease: Lease, *, acked: bool = False) -> None:
        """:meth:`release_gone` in the background: nothing needs to wait for it, so an ack
        costs one round trip. The lease of an ``acked`` object is kept as a tombstone with
        ``keep_tombstones``: deleted ``TOMBSTONE_SECONDS`` later, or two safety windows before
        it expires if that comes first (not after a dead letter: a redrive brings the same
        id back, which the lease would hold up). A crash before the delete lands leaves an
        orphan lease."""
        seconds = (lease.expires - self.clock()).total_seconds() - 2 * self._window(lease)
        if acked and self._keep_tombstones and seconds > 0:
            self._tombstones.keep(lease, min(seconds, TOMBSTONE_SECONDS))
        else:
            self._background.start(self.release_gone(lease))

    async def flush_tombstones(self) -> None:
        """Delete the kept leases of acked messages now (a stop, a teardown), and wait for
        that and the rest of the background work (which may keep more: a batch's last ack)."""
        while True:
            self._tombstones.flush()
            self._closing_runs.flush()
            await self._background.done()
            if not self._tombstones and not self._closing_runs:
                return

    async def sweep_orphans(self, topic: str, consumer_id: str, older_than: float) -> int:
        """Delete the leases of ``topic`` whose message is gone; return how many.

        A crash between the two deletes of an ack leaves such a lease. It blocks nothing, but
        would count as in flight forever. Only leases not written for ``older_than`` seconds
        and expired are looked at (a live holder rewrites its lease at every refresh); each
        is taken over like any expired lease and then deleted (rule 3). Messages are never
        touched. Costs a LIST of the leases, and a GET and a HEAD per old lease.
        """
        cutoff = self.clock() - timedelta(seconds=older_than)
        swept = 0
        for meta in await self._store.list(layout.leases_prefix(topic)):
            if meta.last_modified > cutoff or meta.key in self._held_here:
                continue
            try:
                stored = await self._store.get(meta.key)
                body = LeaseBody.decode(stored.data)
            except (NotFound, CorruptObject):
                continue  # gone, or a lease that does not say which message it covers
            if (
                not body.message_key
                or self._expired_lease(meta.key, stored.data, stored.meta.last_modified) is None
            ):
                continue
            try:
                await self._store.head(body.message_key)
                continue  # the message is there: a consumer claims it as usual
            except NotFound:
                pass
            lease_id = layout.lease_id_of(meta.key)
            lease = await self.claim(
                topic, body.message_id, body.message_key, consumer_id, older_than, lease_id=lease_id
            )
            if lease is not None:
                await self.release(lease, message_gone=True)
                swept += 1
        if swept:
            logger.info("deleted orphan leases topic=%s count=%d", topic, swept)
        return swept

    async def _renew(
        self, lease: Lease, seconds: float, *, released: bool = False, receives: int | None = None
    ) -> None:
        """Write our lease again, expiring ``seconds`` from now; ``released``: given up, free
        to take at that moment exactly (for 0 seconds: long ago, whatever the clocks), with
        ``receives`` deliveries counted so far (default: as now)."""
        if lease.lost:
            raise LeaseLostError(f"lease on message {lease.message_id} was lost")
        body = replace(
            self._new_body(lease.body.consumer_id, lease.message_id, lease.message_key, seconds),
            settled=tuple(sorted(lease.settled)),
            receive_count=lease.body.receive_count if receives is None else receives,
            released=released,
        )
        if released and seconds <= 0:
            body = replace(body, expires_at=RELEASED)
        etag = await self.write_over(lease, body)
        if etag is None:
            lease.lost = True
            self._let_go(lease)
            logger.warning("lease lost key=%s", lease.key)
            # Taken over, or dropped by a seek whose replayed copy has its key: consumers
            # here that skipped that copy as held here look again.
            self._freed(lease.topic)
            raise LeaseLostError(f"lease on message {lease.message_id} was taken over")
        lease.etag, lease.body, lease.visibility = etag, body, seconds
