"""Rate limits: at most ``count`` permits of a name per ``per`` seconds, across every process
and host on one store (docs/concepts/flow-control.md, "Rate limits").

Permit ``i`` of a rate is due at ``i * per / count`` seconds after the epoch, so permits
come evenly spaced. They are handed out in *chunks* of consecutive permits, about a quarter
second's worth (:func:`chunk_size`); each chunk is won once, by one process, with a
conditional write, and that process alone uses its permits, each at its time or up to a
chunk's span later, never later (a stalled process does not burst). A process that uses its
chunk wins the next one while it does (in the background, once half of it is used), so a
request's latency does not hold its takers up at each chunk's end; it aims past the time a
win usually takes there, so what it wins is not late already (a slow store skips chunks:
fewer permits, never a burst). A chunk is never won twice, so however many processes take
part, and whatever their clocks say, no more than ``count`` permits are due in any ``per``
seconds, and at most ``count`` plus a chunk are used.

The chunks live in a ring of :data:`RING` keys per name, ``_rates/{name}/{k}.json``: chunk
``j`` is won by writing ``{"chunk": j, "rate": "20/1s"}`` over key ``j % RING`` while it
holds an older chunk, with if-match on the version read (create-only if the key is new). No
key is deleted and a name keeps at most ``RING`` small objects; a key is written once every
``RING`` chunks (about every 4 s) whatever the load, within every provider's per-key limit.
A process remembers what it learned of each key, so winning a chunk after its own write
costs one PUT; a key another process wrote last is read first (a GET, and the PUT if the
chunk is still free).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pawn_queue._internal.aio import Background
from pawn_queue._protocol import layout
from pawn_queue._protocol.lease_protocol import bounded, nonce
from pawn_queue.exceptions import (
    AlreadyExists,
    ArgumentError,
    LimitTimeoutError,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store.base import IfMatch, PutMode, Store

logger = logging.getLogger(__name__)

RING = 16
"""Keys per rate name: chunk ``j`` is won at key ``j % RING``."""
CHUNK_SECONDS = 0.25
"""A chunk holds the permits of about this long (one at least)."""
LOOKAHEAD = 4
"""Chunks past the current one a process tries before it waits for the next."""
MAX_PER_SECOND = 100_000.0
FAILING_SECONDS = 60.0
FORMAT = "pawn-queue-rate/1"
_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_UNITS |= {"h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_RATE_RE = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]*(?:\.[0-9]+)?)\s*([a-z]+)\s*")


@dataclass(frozen=True)
class Rate:
    """``count`` permits per ``per`` seconds."""

    count: int
    per: float

    def __str__(self) -> str:
        return f"{self.count}/{self.per:g}s"

    @property
    def spacing(self) -> float:
        """Seconds between two permits."""
        return self.per / self.count


def parse_rate(value: object, what: str = "rate") -> Rate:
    """``"20/s"``, ``"5000/min"``, ``"100/h"``, ``"3/10s"`` (units s, sec, second, m, min,
    minute, h, hour, d, day, optionally plural) as a :class:`Rate`; ArgumentError otherwise."""
    form = "'<count>/<unit>' such as '20/s', '5000/min' or '3/10s'"
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise ArgumentError(f"{what}: got {value!r}, must be a string {form}")
    match = _RATE_RE.fullmatch(value.lower())
    unit = match and (_UNITS.get(match[3]) or _UNITS.get(match[3].removesuffix("s")))
    if match is None or unit is None or match[2] in (".",):
        raise ArgumentError(f"{what}: got {value!r}, must be {form}")
    count, times = int(match[1]), float(match[2]) if match[2] else 1.0
    per = times * unit
    if count < 1 or not math.isfinite(per) or per <= 0:
        raise ArgumentError(f"{what}: got {value!r}, needs a count and a span above 0")
    if count / per > MAX_PER_SECOND:
        raise ArgumentError(f"{what}: got {value!r}, at most {MAX_PER_SECOND:g} a second")
    return Rate(count, per)


def chunk_size(rate: Rate) -> int:
    """Permits in one chunk: about :data:`CHUNK_SECONDS` worth, one at least."""
    return max(1, int(CHUNK_SECONDS / rate.spacing))


@dataclass(frozen=True)
class _Seen:
    """What a process last learned of one ring key."""

    etag: str
    chunk: int
    ours: bool  # written by this process: an if-match on it holds unless another wrote since


@dataclass
class _Chunk:
    """The permits of a chunk this process won: ``next`` up to ``end``."""

    next: int
    end: int


@dataclass
class _Name:
    """What this process knows of one rate name."""

    rate: Rate
    size: int
    current: _Chunk | None = None  # the chunk whose permits are handed out
    ahead: _Chunk | None = None  # the next one, won before it was needed
    last_won: int = -1
    prefetching: bool = False
    claim_seconds: float = 0.0  # how long winning a chunk takes here (a moving average)
    seen: dict[int, _Seen] = field(default_factory=dict)  # by ring key
    claiming: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def span(self) -> float:
        """A chunk's seconds."""
        return self.size * self.rate.spacing

    def chunk(self, index: int) -> _Chunk:
        """The permits of chunk ``index``."""
        return _Chunk(index * self.size, (index + 1) * self.size)

    def holding(self, now: float) -> _Chunk | None:
        """The chunk whose ``next`` permit is the next held here, None if none: permits too
        late to use are dropped, and the chunk won ahead follows the current one once that
        is spent. A permit may be used up to a chunk's span after its time, not later."""
        while True:
            chunk = self.current
            if chunk is not None:
                usable = math.ceil((now - self.span) / self.rate.spacing)
                chunk.next = max(chunk.next, usable)
                if chunk.next < chunk.end:
                    return chunk
            self.current, self.ahead = self.ahead, None
            if self.current is None:
                return None


class Rates:
    """The rate limits of one queue: hands out permits, winning chunks as they run out."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        request_seconds: float,
        background: Background,
    ) -> None:
        self._store = store
        self._clock = clock
        self._request_seconds = request_seconds
        self._background = background
        self._names: dict[str, _Name] = {}

    async def acquire(self, name: str, rate: Rate, within: float | None) -> None:
        """Return at the time of a permit of ``name``; LimitTimeoutError if none is due
        within ``within`` seconds (None: no bound). A StoreUnavailableError is tried again
        with backoff, and raised once ``within`` passed or the store failed for a minute
        (:data:`FAILING_SECONDS`)."""
        state = self._state(name, rate)
        deadline = None if within is None else time.monotonic() + within
        pause, failing_since = 0.05, None
        while True:
            now = self._now()
            chunk = state.holding(now)
            if chunk is not None:
                due = chunk.next * rate.spacing - now
                if due > 0 and deadline is not None and time.monotonic() + due > deadline:
                    raise self._timeout(name, rate, within)
                chunk.next += 1
                self._maybe_prefetch(name, state, chunk)
                if due > 0:
                    await asyncio.sleep(due)
                return
            async with state.claiming:
                if state.holding(self._now()) is not None:
                    continue  # another waiter here won a chunk meanwhile
                try:
                    wait = await self._claim(name, state)
                    failing_since = None
                except StoreUnavailable as exc:
                    now = time.monotonic()
                    failing_since = failing_since or now
                    late = deadline is not None and now >= deadline
                    if late or now - failing_since >= FAILING_SECONDS:
                        raise
                    logger.info("rate limit: store unavailable name=%s error=%s", name, exc)
                    wait, pause = pause, min(pause * 2, 1.0)
                if wait is None:
                    continue
                if deadline is not None and time.monotonic() + wait > deadline:
                    raise self._timeout(name, rate, within)
                await asyncio.sleep(wait * random.uniform(1.0, 1.5))

    def _timeout(self, name: str, rate: Rate, within: float | None) -> LimitTimeoutError:
        return LimitTimeoutError(
            f"no permit of rate limit {name!r} ({rate}) was due within {within:g} s"
        )

    def _state(self, name: str, rate: Rate) -> _Name:
        state = self._names.get(name)
        if state is None or state.rate != rate:
            state = self._names[name] = _Name(rate, chunk_size(rate))
        return state

    def _now(self) -> float:
        return self._clock().timestamp()

    async def _claim(self, name: str, state: _Name) -> float | None:
        """Win the first chunk from the current one on that is not known taken; None once
        one is won, else how long until the next chunk starts."""
        began = self._now()
        current = math.floor(began / state.span)
        chunk = await self._win_first(name, state, max(current, state.last_won + 1))
        if chunk is None:
            return (current + 1) * state.span - self._now()
        state.current = state.chunk(chunk)
        return None

    def _maybe_prefetch(self, name: str, state: _Name, chunk: _Chunk) -> None:
        """Once half of ``chunk`` is used, win the next one in the background."""
        used = chunk.next - (chunk.end - state.size)
        if state.size > 1 and used * 2 >= state.size and not (state.ahead or state.prefetching):
            state.prefetching = True
            self._background.start(self._prefetch(name, state, chunk))

    async def _prefetch(self, name: str, state: _Name, chunk: _Chunk) -> None:
        try:
            async with state.claiming:
                if state.ahead is not None or state.current is not chunk:
                    return  # a waiter here won one meanwhile
                after = chunk.end // state.size
                won = await self._win_first(name, state, max(after, state.last_won + 1))
                if won is not None:
                    state.ahead = state.chunk(won)
        except StoreError as exc:  # the next waiter wins one when it needs it
            logger.info("rate limit: winning a chunk ahead failed name=%s error=%s", name, exc)
        finally:
            state.prefetching = False

    async def _win_first(self, name: str, state: _Name, first: int) -> int | None:
        """The first chunk from ``first`` on, up to :data:`LOOKAHEAD` past the current one,
        that this process wins; None if none is free."""
        began = self._now()
        current = math.floor(began / state.span)
        # Not one whose permits would be late once won: a slow store skips chunks, so its
        # processes use fewer permits rather than many at once.
        first = max(first, math.floor((began + state.claim_seconds) / state.span))
        try:
            for chunk in range(first, current + LOOKAHEAD + 1):
                known = state.seen.get(chunk % RING)
                if known is not None and known.chunk >= chunk:
                    continue
                if await self._win(name, state, chunk):
                    state.last_won = chunk
                    return chunk
            return None
        finally:
            took = self._now() - began
            state.claim_seconds = 0.7 * state.claim_seconds + 0.3 * took

    async def _win(self, name: str, state: _Name, chunk: int) -> bool:
        """Write ``chunk`` over its ring key while that holds an older chunk: whether it is
        ours. A refused or unsure write is checked by reading the key (rule 6). A key another
        process wrote last is read first: others are at work, so a race already lost costs
        a GET rather than a refused PUT."""
        ring = chunk % RING
        key = layout.rate_chunk_key(name, ring)
        fields = {"format": FORMAT, "chunk": chunk, "rate": str(state.rate), "nonce": nonce()}
        body = json.dumps(fields).encode()
        known = state.seen.get(ring)
        if known is not None and not known.ours:
            known = await self._read(state, ring, key)
            if known is not None and known.chunk >= chunk:
                return False
        mode: PutMode = "create" if known is None else IfMatch(known.etag)
        for _ in range(3):  # a race lost to an older chunk's writer: try over what it wrote
            try:
                etag = await bounded(self._request_seconds, key, self._store.put(key, body, mode))
                state.seen[ring] = _Seen(etag, chunk, ours=True)
                return True
            except (AlreadyExists, PreconditionFailed, StoreUnavailable) as exc:
                current = await self._read(state, ring, key, body)
                if current is not None and current.ours:
                    return True  # our write landed
                if isinstance(exc, StoreUnavailable):
                    raise
                if current is not None and current.chunk >= chunk:
                    return False
                mode = "create" if current is None else IfMatch(current.etag)
        return False

    async def _read(
        self, state: _Name, ring: int, key: str, ours: bytes | None = None
    ) -> _Seen | None:
        """What ring key ``ring`` holds now, remembered; None if nothing. ``ours``: the body
        of a write of ours whose outcome is unknown, which a read may find."""
        try:
            current = await bounded(self._request_seconds, key, self._store.get(key))
        except NotFound:
            state.seen.pop(ring, None)
            return None
        seen = _Seen(current.meta.etag, decode_chunk(current.data)[0], current.data == ours)
        state.seen[ring] = seen
        return seen


def decode_chunk(data: bytes) -> tuple[int, str]:
    """The chunk a ring key holds and the rate it was won for; ``(-1, "?")`` for a body that
    is not one (written over)."""
    try:
        body = json.loads(data)
        chunk, rate = body["chunk"], body.get("rate", "?")
    except (ValueError, TypeError, KeyError, AttributeError):
        return -1, "?"
    return (chunk if isinstance(chunk, int) else -1), str(rate)


__all__ = ["Rate", "Rates", "chunk_size", "decode_chunk", "parse_rate"]
