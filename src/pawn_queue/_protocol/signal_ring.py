"""Where the versions of the signal log live: a ring of 16 keys, each written once a lap.

Version ``seq`` of the signal log (:mod:`pawn_queue._protocol.signal_log`) is written to
``_notify/r{seq % 16:02d}`` (:func:`~pawn_queue._protocol.layout.notify_ring_key`), over the
version 16 before it (if-match; create-only on the first lap). So a key is written once
every 16 versions: with versions at least ``notify.signal_interval_seconds`` (0.1 s) apart,
once per 1.6 s at most, whatever the number of producers; under the one write a second per
key of Google Cloud Storage, Cloudflare R2 and Storj (docs/protocol.md, "Change signals").

Only one write can replace a key's version, so each version has one writer, and a reader
that saw version ``s`` finds the next at ``notify_ring_key(s + 1)``: a version numbered
``s + 1`` there is new; the version 16 before it means nothing new yet; a later one means
the ring went round since (the log's ``kept_from`` says whether it still names every change
since ``s``). Anything else (a key gone, an older version) means the ring was emptied and
started again.

One :class:`SignalRing` per process keeps what its writer and its watch read and wrote:
each key's etag and version, and the latest version known.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from pawn_queue._protocol import layout
from pawn_queue._protocol.signal_log import SignalLog, decode
from pawn_queue.exceptions import NotFound
from pawn_queue.store.base import ObjectMeta, Store


@dataclass(frozen=True, slots=True)
class RingVersion:
    """What one ring key held when read (or written) here: its etag (None: missing), its
    signal log (None: missing or unreadable), when this process first saw it (monotonic),
    how old its ``Last-Modified`` said it was then (seconds; 0 when written here), and
    whether this process wrote it."""

    key: str
    etag: str | None
    log: SignalLog | None
    seen_at: float
    age: float = 0.0
    mine: bool = False

    @property
    def seq(self) -> int:
        """The version's number; 0 for a missing or unreadable key."""
        return 0 if self.log is None else self.log.seq


NOTHING = RingVersion(layout.notify_ring_key(0), None, None, 0.0)
"""No version yet: the first write is version 1."""


class SignalRing:
    """The ring's keys as this process knows them, and the reads that move that on."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: dict[str, RingVersion] = {}  # key -> last read or written here
        self.latest: RingVersion | None = None  # the highest version known here
        self._discovering = asyncio.Lock()

    def known(self, key: str) -> RingVersion | None:
        """What the key held when last read or written here (None: never)."""
        return self._known.get(key)

    def wrote(self, key: str, etag: str, log: SignalLog) -> RingVersion:
        """Note a version written here."""
        return self._note(RingVersion(key, etag, log, time.monotonic(), mine=True))

    def forget(self, key: str) -> None:
        """The key changed since it was read here (a write over it was refused)."""
        self._known.pop(key, None)

    async def read(self, key: str, *, head_first: bool = False) -> RingVersion:
        """The key's version now. ``head_first``: a ``HEAD``, and a ``GET`` only if its
        etag is not the one known here (cheaper where it seldom changes)."""
        if head_first and (known := self._known.get(key)) is not None:
            try:
                meta = await self._store.head(key)
            except NotFound:
                return self._note(RingVersion(key, None, None, time.monotonic()))
            if meta.etag == known.etag:
                return known
        try:
            stored = await self._store.get(key)
        except NotFound:
            return self._note(RingVersion(key, None, None, time.monotonic()))
        return self._seen(key, stored.meta, decode(stored.data))

    async def discover(self) -> tuple[RingVersion, bool]:
        """The latest version known here; if none, every key of the ring read at once (16
        ``GET``\\ s, once for the writer and the watch together): the latest there
        (:data:`NOTHING` if none). True if this call read them."""
        async with self._discovering:
            if self.latest is not None:
                return self.latest, False
            keys = [layout.notify_ring_key(seq) for seq in range(layout.NOTIFY_RING_SIZE)]
            await asyncio.gather(*(self.read(key) for key in keys))
            self.latest = self.latest or NOTHING
            return self.latest, True

    async def after(self, version: RingVersion, *, first: bool = False) -> RingVersion:
        """The latest version from ``version`` on: the keys after it, read one by one while
        each holds a later version (at most a lap). ``version`` itself if none does.
        ``first``: the first later version found, without reading on."""
        for _ in range(layout.NOTIFY_RING_SIZE):
            found = await self.read(layout.notify_ring_key(version.seq + 1))
            if found.seq <= version.seq:
                break
            version = found
            if first:
                break
        return version

    def restarted(self, seq: int, found: RingVersion) -> bool:
        """Whether ``found``, read at the key of version ``seq``, says the ring was emptied
        and begun again since (it holds an older version than the one a lap before)."""
        lap_before = seq - layout.NOTIFY_RING_SIZE
        return lap_before > 0 and found.seq < lap_before

    def reset(self) -> None:
        """Forget every key: the ring was emptied and begun again."""
        self._known.clear()
        self.latest = None

    def _seen(self, key: str, meta: ObjectMeta, log: SignalLog | None) -> RingVersion:
        known = self._known.get(key)
        if known is not None and known.etag == meta.etag:
            return known  # seen before: keep when it was first seen
        age = (datetime.now(UTC) - meta.last_modified).total_seconds()
        return self._note(RingVersion(key, meta.etag, log, time.monotonic(), max(0.0, age)))

    def _note(self, version: RingVersion) -> RingVersion:
        self._known[version.key] = version
        if version.log is not None and (self.latest is None or version.seq > self.latest.seq):
            self.latest = version
        return version


class RingReader:
    """A watch's place in the ring: the version it saw last, and where to read the next."""

    def __init__(self, ring: SignalRing) -> None:
        self._ring = ring
        self.version: RingVersion | None = None  # None: not started
        self._stepped = False  # the last read found a later version
        self._per_second = 0.0  # versions a second lately, by their writers' clocks

    @property
    def seen(self) -> int:
        """The seq of the version seen last (0: none)."""
        return 0 if self.version is None else self.version.seq

    def saw_own(self) -> bool:
        """Whether the version seen last is one this process wrote (maybe read before the
        write returned, and so not known as its own then)."""
        if self.version is None:
            return False
        known = self._ring.known(self.version.key)
        return known is not None and known.mine and known.etag == self.version.etag

    async def start(self) -> RingVersion:
        """Where things stand: the latest version (the ring's keys read, if not known)."""
        self.version, _ = await self._ring.discover()
        return self.version

    async def next(self, *, busy: bool) -> tuple[RingVersion | None, bool]:
        """A version later than the one seen last (None: none yet), and whether the ring
        was begun again (then the latest is read, and the versions cannot tell what
        changed). ``busy``: a ``GET`` at once, not a ``HEAD`` first.

        It reads where the next version would be; or, while versions come faster than this
        watch reads, where the latest likely is by the rate they came at lately (each
        version names every change of the last seconds, so the latest is enough), and the
        next key only if that version is not written yet: a watch that looks seldom keeps
        near the latest version with one or two reads a look."""
        assert self.version is not None, "start() first"
        seen = self.version
        at = seen.seq + self._step(seen)
        found = await self._ring.read(layout.notify_ring_key(at), head_first=not busy)
        if at > seen.seq + 1 and found.seq < at and not self._ring.restarted(at, found):
            at = seen.seq + 1
            found = await self._ring.read(layout.notify_ring_key(at), head_first=not busy)
        if self._ring.restarted(at, found):
            self._ring.reset()
            self.version, _ = await self._ring.discover()
            self._stepped = False
            return None, True
        self._stepped = found.seq > seen.seq
        if not self._stepped:
            return None, False
        then, now = _written_at(seen), _written_at(found)
        if then is not None and now is not None and now > then:
            self._per_second = (found.seq - seen.seq) / (now - then)
        self.version = found
        return found, False

    def _step(self, seen: RingVersion) -> int:
        """How many versions on to read: 1, or, while the last read found a later version,
        as many as likely came since at the rate seen lately (under a lap)."""
        written = _written_at(seen)
        if not self._stepped or not self._per_second or written is None:
            return 1
        expected = int(self._per_second * (time.time() - written))
        return max(1, min(layout.NOTIFY_RING_SIZE - 1, expected))


def _written_at(version: RingVersion) -> float | None:
    """When ``version`` was written, by its writer's clock (its own entries' time)."""
    log = version.log
    if log is None:
        return None
    return max((change.at for change in log.changes if change.seq == log.seq), default=None)
