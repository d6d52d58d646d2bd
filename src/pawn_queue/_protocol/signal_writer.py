"""How a producer process writes the root signal ``_notify/_`` (and 0.2.0's slots, if asked).

The root is written at most once per ``notify.signal_interval_seconds`` by every process
together: a write replaces only the version it read (if-match), once that version is that
old (docs/protocol.md, "Request rates"). A process remembers the version it wrote last, so
while nobody else writes, a signal costs one ``PUT`` and no read. A refused write (another
process wrote meanwhile) reads the root again: the topics that a version written since a
read made after the messages landed names are signalled already; the rest are merged in
and written over it, once it is old enough. :mod:`pawn_queue._protocol.signal_log` is the
body's format.

A store that refuses a signal for its request rate (429 or 503 SlowDown: Google Cloud
Storage, Cloudflare R2 and Storj allow one write a second to a key) teaches the writer to
write signals at most once per :data:`LIMITED_INTERVAL_SECONDS` from then on: a process
pays one refusal, not one every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from pawn_queue._protocol import layout
from pawn_queue._protocol.signal_log import SignalLog, decode, next_version
from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, Store
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


@dataclass(frozen=True, slots=True)
class _Version:
    """A version of a signal key: its etag (None: missing), its signal log (root only), and
    when it may be replaced (monotonic)."""

    etag: str | None
    log: SignalLog | None
    replaceable_at: float


class SignalWriter:
    """Writes one process's signals, within the fleet's write rate per key."""

    def __init__(self, store: Store, interval: float, check_gap: float, slots: bool) -> None:
        self._store = store
        self._interval = interval
        self._check_gap = check_gap
        self._slots = slots
        self._root: _Version | None = None  # the version this process wrote last
        self._first_seen: dict[str, tuple[str, float]] = {}  # key -> (etag, monotonic)
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

    def wrote(self, etag: str | None) -> bool:
        """Whether the root version ``etag`` is the one this process wrote last."""
        return etag is not None and self._root is not None and self._root.etag == etag

    async def signal(
        self, topics: dict[str, frozenset[str] | None], *, at_once: bool = False
    ) -> None:
        """Signal ``topics`` (topic -> the names of the objects written, None: unknown),
        whose messages have landed; ``at_once``: without waiting for the interval (a closing
        process, once), unless the store refused a signal before."""
        if self._slots:
            keys = sorted({layout.notify_slot_key(topic) for topic in topics})
            await asyncio.gather(*(self._signal_slot(key, at_once) for key in keys))
        await self._signal_root(topics, at_once)

    async def _signal_root(self, topics: dict[str, frozenset[str] | None], at_once: bool) -> None:
        pending = dict(topics)
        version = self._root
        # The seq of a version read after the messages landed: an entry of a later version
        # was written after them, so it signals them.
        landed_seq: int | None = None
        if version is None:
            version = await self._read(layout.NOTIFY_ROOT)
            landed_seq = _seq(version)
        for _ in range(_ROUNDS):
            # Not early where the store refused a signal: it would refuse this one too.
            early = at_once and not self._limited
            pause = 0.0 if early else version.replaceable_at - time.monotonic()
            # Busy only where warm listings come sooner than the next signal would.
            late = pause > self._interval / 4 and self._interval > WARM_CHECKS * self._check_gap
            # Another process's version: others wait on it too, and the first of them to
            # write may signal this process's topics as well.
            contended = self._root is None or self._root.etag != version.etag
            if pause > 0:
                # Jitter, wider where others wait: processes waiting on one version do not
                # all write at once, and those that come later read first.
                spread = self._interval / (2 if contended else 4)
                await asyncio.sleep(pause + random.uniform(0, spread))
            if late or (pause > 0 and contended):
                # Written meanwhile by another process? A read (a GET), where a losing write
                # would be a PUT refused, and count against the key's limit.
                latest, landed_seq = await self._read_after(pending, landed_seq)
                if not pending:
                    return
                if latest.etag != version.etag:
                    version = latest
                    continue
            log = next_version(version.log, pending, time.time(), busy=late)
            mode: PutMode = "create" if version.etag is None else IfMatch(version.etag)
            try:
                etag = await self._store.put(layout.NOTIFY_ROOT, log.encode(), mode, durable=False)
            except (AlreadyExists, PreconditionFailed):
                version, landed_seq = await self._read_after(pending, landed_seq)
                if not pending:
                    return
                continue
            self._root = _Version(etag, log, time.monotonic() + self._interval)
            self._first_seen[layout.NOTIFY_ROOT] = (etag, time.monotonic())
            return
        logger.warning(
            "change signal given up after %d refused writes topics=%s", _ROUNDS, sorted(pending)
        )

    async def _read_after(
        self, pending: dict[str, frozenset[str] | None], landed_seq: int | None
    ) -> tuple[_Version, int | None]:
        """Read the root again (after the messages landed, so its seq is ``landed_seq`` if
        none was read before), and drop from ``pending`` what it signals already."""
        latest = await self._read(layout.NOTIFY_ROOT)
        landed_seq = _seq(latest) if landed_seq is None else landed_seq
        _drop_signalled(pending, latest, landed_seq)
        return latest, landed_seq

    async def _read(self, key: str) -> _Version:
        """The key's version now, and when it may be replaced: ``interval`` after it was
        first seen here, or now if its Last-Modified says it is older than that."""
        data: bytes | None = None
        try:
            if key == layout.NOTIFY_ROOT:
                stored = await self._store.get(key)
                meta, data = stored.meta, stored.data
            else:
                meta = await self._store.head(key)
        except NotFound:
            return _Version(None, None, 0.0)
        log = None if data is None else decode(data)
        if key == layout.NOTIFY_ROOT:
            self._root = None  # another process's version: read again when it matters
        return _Version(meta.etag, log, self._replaceable_at(key, meta))

    def _replaceable_at(self, key: str, meta: ObjectMeta) -> float:
        seen = time.monotonic()
        first_seen = self._first_seen.get(key)
        if first_seen is not None and first_seen[0] == meta.etag:
            seen = first_seen[1]  # that version was there already then
        else:
            self._first_seen[key] = (meta.etag, seen)
        age = (datetime.now(UTC) - meta.last_modified).total_seconds()
        # Last-modified has whole seconds (S3): a second more than the gap ago is over the
        # gap for sure, clocks agreeing; a fast clock here costs a write refused and resent.
        return 0.0 if age >= self._interval + 1.0 else seen + self._interval

    async def _signal_slot(self, key: str, at_once: bool) -> None:
        """0.2.0's signal: a new token in the topic's slot (``notify.slot_signals``)."""
        version = await self._read(key)
        early = at_once and not self._limited
        pause = 0.0 if early else version.replaceable_at - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        mode: PutMode = "create" if version.etag is None else IfMatch(version.etag)
        # Refused: created or changed by another process since the read, which signals too.
        with contextlib.suppress(AlreadyExists, PreconditionFailed):
            etag = await self._store.put(key, secrets.token_hex(8).encode(), mode, durable=False)
            self._first_seen[key] = (etag, time.monotonic())


def _seq(version: _Version) -> int | None:
    return None if version.log is None else version.log.seq


def _drop_signalled(
    pending: dict[str, frozenset[str] | None], version: _Version, landed_seq: int | None
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
