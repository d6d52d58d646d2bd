"""How a producer process writes change signals: the next version of the signal log.

Versions live in the signal ring (:mod:`pawn_queue._protocol.signal_ring`), and a new one
is written at most once per ``notify.signal_interval_seconds`` by every process together: a
write of version ``n + 1`` replaces what its key held (if-match), once version ``n`` is that
old (docs/protocol.md, "Request rates"). A process remembers the version it wrote last and
what each key held, so while nobody else writes, a signal costs one ``PUT`` and no read. A
refused write (another process wrote version ``n + 1``) reads on along the ring: the topics
that a version written since a read made after the messages landed names are signalled
already; the rest are merged in and written as the version after, once it is old enough.
:mod:`pawn_queue._protocol.signal_log` is the body's format.

A store that refuses a signal for its request rate (429 or 503 SlowDown; under a per-key
limit, producers racing for a version: the loser's write comes within the second of the
winner's) teaches the writer to write signals at most once per
:data:`LIMITED_INTERVAL_SECONDS` from then on: a process pays one refusal, not one every
second, and every version names every change, so racing producers lose no latency by it.

With ``notify.slot_signals`` it also writes what 0.2.0's consumers watch: the topic's slot,
and the root ``_notify/_`` (a copy of the version written, which this version's watches
read as a view of the ring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time

from pawn_queue._protocol import layout
from pawn_queue._protocol.signal_log import SignalLog, next_version
from pawn_queue._protocol.signal_ring import RingVersion, SignalRing
from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed
from pawn_queue.store.base import IfMatch, PutMode, Store
from pawn_queue.store.throttling import throttle_backoff_of
from pawn_queue.store.wrapper import StoreCall

logger = logging.getLogger(__name__)

_ROUNDS = 20
"""Writes refused in a row before a signal is given up (the sweep then finds its messages)."""
WARM_CHECKS = 2
"""A busy topic's consumers list it every this many check intervals (so a signal is busy
only where the signal interval is longer)."""
LIMITED_INTERVAL_SECONDS = 1.0
"""The signal interval once the store refused a signal for its request rate (429 or 503)."""


class SignalWriter:
    """Writes one process's signals, within the fleet's write rate."""

    def __init__(
        self, store: Store, ring: SignalRing, interval: float, check_gap: float, slots: bool
    ) -> None:
        self._store = store
        self._ring = ring
        self._interval = interval
        self._check_gap = check_gap
        self._slots = slots
        self._first_seen: dict[str, tuple[str, float]] = {}  # slot key -> (etag, monotonic)
        self._root_etag: str | None = None  # _notify/_ as this process wrote it last (slots)
        self._limited = False  # the store refused a signal for its request rate
        backoff = throttle_backoff_of(store)
        if backoff is not None:
            backoff.listeners.append(self._refused)

    def _refused(self, call: StoreCall) -> None:
        """A request the store refused for its rate (it is sent again after a pause)."""
        signal = call.operation == "put" and call.key.startswith(layout.NOTIFY)
        if signal and not self._limited:
            self._limited = True
            logger.info(
                "the store refused a change signal for its request rate: signals are "
                "written at most every %g s from now on (notify.signal_interval_seconds: %g "
                "starts so)",
                LIMITED_INTERVAL_SECONDS,
                LIMITED_INTERVAL_SECONDS,
            )
            self._interval = max(self._interval, LIMITED_INTERVAL_SECONDS)

    def wrote_root(self, etag: str | None) -> bool:
        """Whether the root version ``etag`` is the one this process wrote last (slot
        signals)."""
        return etag is not None and etag == self._root_etag

    async def signal(
        self, topics: dict[str, frozenset[str] | None], *, at_once: bool = False
    ) -> None:
        """Signal ``topics`` (topic -> the names of the objects written, None: unknown),
        whose messages have landed; ``at_once``: without waiting for the interval (a closing
        process, once), unless the store refused a signal before."""
        if self._slots:
            keys = sorted({layout.notify_slot_key(topic) for topic in topics})
            await asyncio.gather(*(self._signal_slot(key, at_once) for key in keys))
        log = await self._signal_ring(topics, at_once)
        if self._slots and log is not None:
            # What 0.2.0's consumers look at to learn that a slot changed.
            self._root_etag = await self._store.put(layout.NOTIFY_ROOT, log.encode(), durable=False)

    async def _signal_ring(
        self, topics: dict[str, frozenset[str] | None], at_once: bool
    ) -> SignalLog | None:
        """Write the next version naming ``topics``, unless one written since they landed
        names them already; the version written (None: none)."""
        pending = dict(topics)
        version, read = await self._ring.discover()
        # The seq of the latest version read after the messages landed: an entry of a later
        # version was written after them, so it signals them.
        landed_seq = version.seq if read else None
        unsure = False  # the version was read as the first later one: more may follow it
        for _ in range(_ROUNDS):
            # Not early where the store refused a signal: it would refuse this one too.
            early = at_once and not self._limited
            pause = 0.0 if early else self._replaceable_at(version) - time.monotonic()
            # Busy only where warm listings come sooner than the next signal would.
            late = pause > self._interval / 4 and self._interval > WARM_CHECKS * self._check_gap
            # Another process's version: others wait on it too, and the first of them to
            # write may signal this process's topics as well.
            contended = not version.mine
            if pause > 0:
                # Jitter, wider where others wait: processes waiting on one version do not
                # all write at once, and those that come later read first.
                spread = self._interval / (2 if contended else 4)
                await asyncio.sleep(pause + random.uniform(0, spread))
            if late or (pause > 0 and contended) or unsure:
                # Written meanwhile by another process? A read (a GET), where a losing write
                # would be a PUT refused, and count against the key's limit.
                latest, landed_seq, unsure = await self._read_after(version, pending, landed_seq)
                if not pending:
                    return None
                if latest.seq != version.seq:
                    version = latest
                    continue
            key = layout.notify_ring_key(version.seq + 1)
            over = self._ring.known(key)
            if over is None or over.seq > version.seq:
                over = await self._ring.read(key)
                if over.seq > version.seq:  # written since: go on from there
                    version, landed_seq, unsure = await self._read_after(
                        version, pending, landed_seq
                    )
                    if not pending:
                        return None
                    continue
            log = next_version(version.log, pending, time.time(), busy=late)
            mode: PutMode = "create" if over.etag is None else IfMatch(over.etag)
            try:
                etag = await self._store.put(key, log.encode(), mode, durable=False)
            except (AlreadyExists, PreconditionFailed):
                self._ring.forget(key)
                version, landed_seq, unsure = await self._read_after(version, pending, landed_seq)
                if not pending:
                    return None
                continue
            self._ring.wrote(key, etag, log)
            return log
        logger.warning(
            "change signal given up after %d refused writes topics=%s", _ROUNDS, sorted(pending)
        )
        return None

    async def _read_after(
        self,
        version: RingVersion,
        pending: dict[str, frozenset[str] | None],
        landed_seq: int | None,
    ) -> tuple[RingVersion, int | None, bool]:
        """Read on along the ring from ``version`` after the messages landed, and drop from
        ``pending`` what the version found signals already; whether a later one may follow
        it (then the writer reads on before it writes). The first time, to the latest
        version (its seq is ``landed_seq``: any later one was written after the messages
        landed); after that, to the first later one alone: a writer that then waits for its
        interval reads on after the wait anyway, which spares a read each round."""
        first = landed_seq is not None
        latest = await self._ring.after(version, first=first)
        landed_seq = latest.seq if landed_seq is None else landed_seq
        _drop_signalled(pending, latest, landed_seq)
        return latest, landed_seq, first and latest.seq > version.seq

    def _replaceable_at(self, version: RingVersion) -> float:
        """When the version after ``version`` may be written (monotonic): ``interval``
        after it was first seen here, or now if its ``Last-Modified`` said it was older
        than that."""
        if version.etag is None:
            return 0.0
        return _replaceable_at(version.seen_at, version.age, self._interval)

    async def _signal_slot(self, key: str, at_once: bool) -> None:
        """0.2.0's signal: a new token in the topic's slot (``notify.slot_signals``)."""
        try:
            meta = await self._store.head(key)
            etag: str | None = meta.etag
            first = self._first_seen.get(key)
            seen = first[1] if first is not None and first[0] == etag else time.monotonic()
            self._first_seen[key] = (meta.etag, seen)
            age = time.time() - meta.last_modified.timestamp()
            replaceable_at = _replaceable_at(seen, age, self._interval)
        except NotFound:
            etag, replaceable_at = None, 0.0
        early = at_once and not self._limited
        pause = 0.0 if early else replaceable_at - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        mode: PutMode = "create" if etag is None else IfMatch(etag)
        # Refused: created or changed by another process since the read, which signals too.
        with contextlib.suppress(AlreadyExists, PreconditionFailed):
            etag = await self._store.put(key, secrets.token_hex(8).encode(), mode, durable=False)
            self._first_seen[key] = (etag, time.monotonic())


def _replaceable_at(seen_at: float, age: float, interval: float) -> float:
    """When what a key holds may be written over (monotonic): ``interval`` after it was
    first seen here (``seen_at``), or now if its ``Last-Modified`` is ``age`` seconds ago and
    that is older than the interval."""
    # Last-modified has whole seconds (S3): a second more than the gap ago is over the gap
    # for sure, clocks agreeing; a fast clock here costs a write refused and resent.
    return 0.0 if age >= interval + 1.0 else seen_at + interval


def _drop_signalled(
    pending: dict[str, frozenset[str] | None], version: RingVersion, landed_seq: int | None
) -> None:
    """Drop from ``pending`` the topics that entries of ``version`` written after the
    version ``landed_seq`` signal: they say "list it", or name every object pending names."""
    if version.log is None or landed_seq is None or version.log.seq < landed_seq:
        return
    for change in version.log.changes:
        if change.topic not in pending or change.seq <= landed_seq:
            continue
        names = pending[change.topic]
        named = None if change.names is None else {name for _, name in change.names}
        if named is None or (names is not None and names <= named):
            del pending[change.topic]
