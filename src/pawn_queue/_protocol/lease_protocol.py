"""The two lease protocols on the store: how a lease object is claimed, written over and read.

Two strategies (see docs/protocol.md):

* ``conditional_write``: claim with a create-only put, refresh and release with if-match on
  our own etag, take over an expired lease with if-match on its etag. Atomic.
* ``csprng_verify``: for stores without conditional writes. Write a lease with a fresh
  random nonce, wait, and check with HEADs that our write survived (the steps are in
  docs/protocol.md). Probabilistic; the docs and the startup log say so (rule 7).

A stored lease may be taken over only when ``now > expires_at + clock_skew_margin`` (at
``expires_at`` for a lease its holder released: nobody holds it). Every request is bounded
(rule 11) and a refused or failed write is checked against the stored nonce (rule 6).
What a lease is for and when its holder keeps, releases or settles it is
:class:`~pawn_queue._protocol.leases.LeaseManager`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from pawn_queue._internal.config_sections import renew_seconds
from pawn_queue._protocol.envelope import CorruptObject, LeaseBody
from pawn_queue.config import ConcurrencyConfig
from pawn_queue.exceptions import (
    AlreadyExists,
    NotFound,
    PreconditionFailed,
    StoreThrottledError,
    StoreUnavailable,
)
from pawn_queue.store.base import IfMatch, PutMode, Store, StoredObject
from pawn_queue.store.throttling import (
    DEFAULT_THROTTLE_TIMEOUT_SECONDS,
    ThrottlePauses,
    first_refusal_raised,
    throttle_backoff_of,
)

# The log of lease events, as before the protocols had a module of their own.
logger = logging.getLogger("pawn_queue._protocol.leases")

_T = TypeVar("_T")

ResolvedStrategy = Literal["conditional_write", "csprng_verify"]

RELEASED = "1970-01-01T00:00:00+00:00"
"""The ``expires_at`` of a lease given back for good: expired on every clock, free to take."""

_REFUSED_UNCHANGED_WRITES = 3
"""How many times a write over our lease is tried while the store refuses it though the
lease is unchanged (a 409 conflict answer): then the lease counts as lost."""


@dataclass(slots=True)
class Lease:
    """A lease this process holds on one message object."""

    topic: str
    message_id: str
    message_key: str
    key: str
    etag: str
    body: LeaseBody
    visibility: float
    lost: bool = False
    released: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # Batch members settled so far; written with every refresh so a takeover skips them.
    settled: set[int] = field(default_factory=set)
    # A run's lease (docs/protocol.md, "Runs"): the keys of its messages handed out here and
    # not settled yet (None: any other lease), and whether one was left unsettled.
    members: set[str] | None = None
    left_unsettled: bool = False
    joined: bool = False  # a run's: it took in a message besides the one claimed
    expiring: bool = False  # no longer refreshed: left to expire (rule 10)

    def __post_init__(self) -> None:
        self.settled.update(self.body.settled)

    @property
    def expires(self) -> datetime:
        return self.body.expires


class LeaseProtocol:
    """One store's lease objects under one resolved strategy: claims, writes over a held
    lease, and reads of when a stored lease may be taken over. The base of
    :class:`~pawn_queue._protocol.leases.LeaseManager`, which decides when each is done."""

    def __init__(
        self,
        store: Store,
        strategy: ResolvedStrategy,
        concurrency: ConcurrencyConfig,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self.strategy = strategy
        self._csprng = concurrency.csprng_verify
        self.margin = timedelta(seconds=concurrency.clock_skew_margin_seconds)
        # The wall clock behind every expiry decision (a skewed one simulates another host).
        self.clock = clock
        # Lease keys seen live elsewhere, and until when (what a read of them told).
        self._busy_until: dict[str, datetime] = {}

    @property
    def claim_pause_seconds(self) -> float:
        """How long a claim waits on purpose at most, besides its requests: csprng_verify's
        jitter and verify delays (none for conditional_write)."""
        if self.strategy == "conditional_write":
            return 0.0
        cfg = self._csprng
        pauses_ms = cfg.jitter_max_ms + cfg.verify_retries * cfg.verify_retry_delay_ms
        return (pauses_ms + cfg.jitter_min_ms) / 1000

    async def _claim_conditional(
        self, key: str, body: LeaseBody, seconds: float
    ) -> tuple[str, LeaseBody] | None:
        etag, current = await conditional_put(self._store, key, body, "create", seconds)
        if etag is not None:
            return etag, body
        if current is None:
            # Released between our put and our read: one more create decides.
            etag, _ = await conditional_put(self._store, key, body, "create", seconds)
            return None if etag is None else (etag, body)
        previous = self._expired_lease(key, current.data, current.meta.last_modified)
        if previous is None:
            return None
        body = replace(body, settled=previous.settled, receive_count=previous.receive_count + 1)
        etag, _ = await conditional_put(self._store, key, body, IfMatch(current.meta.etag), seconds)
        if etag is None:
            return None
        if previous.released:  # given back (a requeue, a stop): routine, not a lost holder
            logger.debug("lease handed over key=%s", key)
        else:
            logger.info("lease takeover key=%s expired_at=%s", key, previous.expires_at)
        return etag, body

    async def _claim_csprng(
        self, key: str, body: LeaseBody, seconds: float
    ) -> tuple[str, LeaseBody] | None:
        cfg = self._csprng
        # Another claimer decides it won no sooner than its fastest wait after its write. A
        # write of ours landing later, on a read made before that write, would take the
        # lease from under it: read again while the read is over half that old when done
        # (docs/protocol.md, "Strategy csprng_verify").
        fastest_decision_ms = 2 * cfg.jitter_min_ms + cfg.verify_retries * cfg.verify_retry_delay_ms
        for _ in range(_STALE_READS):
            read_at = time.monotonic()
            try:
                current = await bounded(seconds, key, self._store.get(key))
            except NotFound:
                current = None
            if time.monotonic() - read_at <= fastest_decision_ms / 2000:
                break
        else:
            logger.info("claim given up: every read of the lease was stale key=%s", key)
            return None
        if current is not None:
            previous = self._expired_lease(key, current.data, current.meta.last_modified)
            if previous is None:
                return None
            body = replace(body, settled=previous.settled, receive_count=previous.receive_count + 1)
        put = self._store.put(key, body.encode(), "overwrite", durable=False)
        etag = await bounded(seconds, key, put)
        jitter_ms = cfg.jitter_min_ms + secrets.randbelow(cfg.jitter_max_ms - cfg.jitter_min_ms + 1)
        await asyncio.sleep(jitter_ms / 1000)
        for attempt in range(cfg.verify_retries + 1):
            if attempt:
                await asyncio.sleep(cfg.verify_retry_delay_ms / 1000)
            if not await self._etag_is(key, etag, seconds):
                return None
        await asyncio.sleep(cfg.jitter_min_ms / 1000)
        return (etag, body) if await self._etag_is(key, etag, seconds) else None

    def _new_body(
        self,
        consumer_id: str,
        message_id: str,
        message_key: str,
        visibility: float,
    ) -> LeaseBody:
        now = self.clock()
        return LeaseBody(
            consumer_id=consumer_id,
            message_id=message_id,
            claimed_at=now.isoformat(),
            expires_at=(now + timedelta(seconds=visibility)).isoformat(),
            nonce=nonce(),
            message_key=message_key,
        )

    def _expired_lease(self, key: str, data: bytes, last_modified: datetime) -> LeaseBody | None:
        """The stored lease if it may be taken over, else None (and remember until when it is
        live). A corrupt lease counts as expiring at its write time."""
        previous, free = free_at(data, last_modified, self.margin)
        if self.clock() > free:
            return previous
        self._busy_until[key] = free
        return None

    async def write_over(self, lease: Lease, body: LeaseBody) -> str | None:
        """Write ``body`` over our lease (if-match its etag, within rule 11's bound); None if
        the lease is no longer ours. Raises StoreUnavailable when the outcome is unknown."""
        seconds = self._renew_seconds(lease)
        if self.strategy == "conditional_write":
            give_up = time.monotonic() + seconds
            for attempt in range(1, _REFUSED_UNCHANGED_WRITES + 1):
                etag, current = await self._write_over_throttled(lease, body)
                # Refused while the lease is still as we last wrote it: no takeover, but a
                # store that refused a write it did not apply (AWS's 409 to conditional
                # writes it deems concurrent, docs/protocol.md "Stores"). Write again.
                unchanged = current is not None and current.meta.etag == lease.etag
                seconds = give_up - time.monotonic()
                if etag is not None or not unchanged or seconds <= 0:
                    return etag
                logger.info("lease write refused unchanged key=%s attempt=%d", lease.key, attempt)
            return None
        if not await self._etag_is(lease.key, lease.etag, seconds):
            return None
        put = self._store.put(lease.key, body.encode(), "overwrite", durable=False)
        return await bounded(seconds, lease.key, put)

    def _renew_seconds(self, lease: Lease) -> float:
        """Rule 11's bound on a request that writes over our lease, as of now."""
        safe = (lease.expires - self.clock()).total_seconds() - self._window(lease)
        return renew_seconds(lease.visibility, safe)

    def comfortably_held(self, lease: Lease) -> bool:
        """Whether the lease stays ours for two safety windows, with no request (then
        :meth:`~pawn_queue._protocol.leases.LeaseManager.ensure_held` sends none)."""
        return not (lease.lost or lease.released) and self._safe_for(lease, windows=2)

    def _safe_for(self, lease: Lease, windows: int) -> bool:
        """Whether the lease stays ours for ``windows`` safety windows on every clock.

        A window is the skew margin plus time for a request to land (at most 1 s).
        """
        return (lease.expires - self.clock()).total_seconds() > windows * self._window(lease)

    def _window(self, lease: Lease) -> float:
        """One safety window, in seconds: see :meth:`_safe_for`."""
        return self.margin.total_seconds() + min(1.0, lease.visibility / 4)

    async def _write_over_throttled(
        self, lease: Lease, body: LeaseBody
    ) -> tuple[str | None, StoredObject | None]:
        """:func:`conditional_put` with if-match on our etag, sent again while the store
        refuses it for its request rate (the key was written within its second, most often
        by this holder). Such a write was not applied, so it is no stall of rule 11: the
        pauses between the sends are not counted in its bound, each send is (bounded as of
        when it is sent). A write that lands after the lease expired is as safe as one
        before: if-match fails if anyone took the lease over meanwhile. The refusal is
        raised once the store's throttle timeout would pass, or once a taker may take the
        lease over (a refresh in the background holds a stop that long at most)."""
        backoff = throttle_backoff_of(self._store)
        timeout = backoff.timeout_seconds if backoff else DEFAULT_THROTTLE_TIMEOUT_SECONDS
        takeover = (lease.expires + self.margin - self.clock()).total_seconds()
        give_up = time.monotonic() + min(timeout, max(takeover, 0.0))
        pauses = ThrottlePauses()
        while True:
            seconds = self._renew_seconds(lease)
            try:
                with first_refusal_raised():
                    return await conditional_put(
                        self._store, lease.key, body, IfMatch(lease.etag), seconds
                    )
            except StoreThrottledError as refusal:
                wait = pauses.next(refusal)
                if time.monotonic() + wait > give_up:
                    raise
            await asyncio.sleep(wait)

    async def _etag_is(self, key: str, etag: str, seconds: float) -> bool:
        try:
            return (await bounded(seconds, key, self._store.head(key))).etag == etag
        except NotFound:
            return False


async def conditional_put(
    store: Store, key: str, body: LeaseBody, mode: PutMode, seconds: float
) -> tuple[str | None, StoredObject | None]:
    """Write the lease ``body`` at ``key`` (``mode``: create or if-match): ``(etag, None)``
    once it is stored; else ``(None, what is stored)``, where None means nothing. A retried
    request can fail on its own earlier success, so a refusal is checked against the stored
    nonce before it counts as lost (rule 6).

    A transient failure is checked the same way: S3 clients do not resend a conditional
    write whose connection broke or timed out, though the server may have applied it.
    If the stored lease is not ours then, the failure is raised (the outcome is unknown).
    Each request is given up after ``seconds`` (rule 11), which counts as such a failure.
    """
    unknown: StoreUnavailable | None = None
    try:
        put = store.put(key, body.encode(), mode, durable=False)
        with first_refusal_raised() if mode == "create" else contextlib.nullcontext():
            return await bounded(seconds, key, put), None
    except (AlreadyExists, PreconditionFailed):
        pass
    except StoreThrottledError:
        # Refused for the store's rate, so not applied. A create's key was written within
        # the second (a per-key limit), as a rival's winning claim writes it: the read below
        # tells who holds it, where waiting a second to send it again would hold the topic's
        # next claims here (docs/protocol.md, "Request rates"). A write over our own lease
        # raises it at once only where its caller sends it again (after a pause its bound
        # does not count).
        if mode != "create":
            raise
    except StoreUnavailable as exc:
        unknown = exc
    try:
        current = await bounded(seconds, key, store.get(key))
    except NotFound:
        current = None
    try:
        if current is not None and LeaseBody.decode(current.data).nonce == body.nonce:
            return current.meta.etag, None
    except CorruptObject:
        pass
    if unknown is not None:
        raise unknown
    return None, current


def free_at(data: bytes, last_modified: datetime, margin: timedelta) -> tuple[LeaseBody, datetime]:
    """A stored lease, and when a taker may take it over: ``margin`` after its expiry, at
    its expiry once released. A corrupt lease counts as expiring at its write time."""
    try:
        stored = LeaseBody.decode(data)
        return stored, stored.expires if stored.released else stored.expires + margin
    except (CorruptObject, OverflowError):  # overflow: an expiry at the end of time
        return LeaseBody("", "", "", last_modified.isoformat(), ""), last_modified + margin


_STALE_READS = 3
"""How many reads of a lease a csprng_verify claim makes before it gives up on a stalled
process or store (each read found too old by the time its answer was in)."""


async def bounded(seconds: float, key: str, request: Awaitable[_T]) -> _T:
    """``request``, given up after ``seconds`` with StoreUnavailable (rule 11). A write given
    up may still land: callers treat its outcome as unknown (rule 6)."""
    try:
        async with asyncio.timeout(seconds):
            return await request
    except TimeoutError:
        raise StoreUnavailable(
            f"lease request on key '{key}' at its {seconds:.3g} s bound: timed out "
            "(outcome unknown)"
        ) from None


def nonce() -> str:
    """A fresh 256-bit random value, hex."""
    return secrets.token_hex(32)
