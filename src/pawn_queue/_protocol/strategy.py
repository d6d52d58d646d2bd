"""The lease strategy: which of the two protocols of :mod:`pawn_queue._protocol.lease_protocol` a
store gets.

``conditional_write`` where the store enforces create-only and if-match puts, else
``csprng_verify`` (rule 7). The probe tests what the protocol uses, as it uses it
(docs/protocol.md, strategy ``auto``): ``auto`` takes its answer, and an explicit
``conditional_write`` on a store that does not enforce both is refused at setup.

The answer is kept in the store for a day (``_probe/result.json``): the processes that
start meanwhile read it (one GET) instead of writing a probe key four times within
milliseconds, which a store that allows one write a second per key refuses. Such a refusal
is part of the answer: those processes delete a young message once its key's second is
over from the start, not from a refusal of their own
(:mod:`pawn_queue._protocol.key_writes`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.lease_protocol import ResolvedStrategy, nonce
from pawn_queue.config import Strategy
from pawn_queue.exceptions import (
    AlreadyExists,
    ConfigError,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store.base import IfMatch, Store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.throttling import throttle_backoff_of
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

logger = logging.getLogger(__name__)

PROBE_KEPT = timedelta(days=1)
"""How long a probe's answer in the store stands for the processes that start."""
_PER_KEY = "; the store limits writes per key: a young message's delete waits for its second"


@dataclass(frozen=True, slots=True)
class Capability:
    """One conditional write the probe tried: whether the store did what the protocol needs,
    and what it did."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class StoreProbe:
    """What the probe saw: each capability it tested, in the order it tested them."""

    capabilities: tuple[Capability, ...]
    limits_writes_per_key: bool = False
    """Whether the store refused a write of the probe for its request rate: the probe writes
    its key four times within milliseconds, which one write a second per key refuses."""

    @property
    def strategy(self) -> ResolvedStrategy:
        """``conditional_write`` only if every capability holds."""
        if all(c.ok for c in self.capabilities):
            return "conditional_write"
        return "csprng_verify"

    @property
    def missing(self) -> list[Capability]:
        return [c for c in self.capabilities if not c.ok]


async def resolve_strategy(store: Store, configured: Strategy) -> ResolvedStrategy:
    """The strategy for ``store``: ``conditional_write`` for memory and a local directory
    under ``auto`` (no request: both enforce it), the probe's answer for any other store.
    A configured ``conditional_write`` is probed too, and refused (ConfigError naming what is
    missing) where the store does not enforce it. ``csprng_verify`` is taken as configured
    and logged at WARNING (rule 7)."""
    if configured == "csprng_verify":
        strategy: ResolvedStrategy = configured
    elif known_conditional(store):
        strategy = "conditional_write"
    else:
        probe = await _kept_probe(store)
        strategy = probe.strategy
        backoff = throttle_backoff_of(store)
        if probe.limits_writes_per_key and backoff is not None:
            backoff.limits_writes_per_key = True
        if configured == "conditional_write" and strategy != "conditional_write":
            missing = "; ".join(f"{c.name}: {c.detail}" for c in probe.missing)
            raise ConfigError(
                f"concurrency.strategy is conditional_write, but {store!r} does not enforce "
                f"it ({missing}); set concurrency.strategy to auto or csprng_verify"
            )
    if strategy == "csprng_verify":
        logger.warning(
            "strategy=csprng_verify: claims are probabilistic (write, wait, verify); "
            "see docs/protocol.md"
        )
    return strategy


def known_conditional(store: Store) -> bool:
    """Whether ``store`` is memory or a local directory (both known to enforce create-only
    and if-match puts), also inside StoreWrappers (counting, metrics), which keep the inner
    store's semantics. Any other store or wrapper is probed."""
    store = _innermost(store)
    # Loaded whenever such a store exists (importing it needs fcntl, POSIX only).
    filesystem = sys.modules.get("pawn_queue.store.filesystem")
    if filesystem is not None and isinstance(store, filesystem.FilesystemStore):
        return True
    return isinstance(store, MemoryStore)


async def probe_store(store: Store) -> StoreProbe:
    """Try each conditional write the lease protocol relies on, on ``_probe/{uuid}.probe``:

    1. an if-match write with the ETag exactly as the store returned it must be accepted;
    2. an if-match write with that ETag, now stale, must be refused;
    3. a create-only write on the existing key must be refused.

    A condition the store ignores (the write went through) or answers with another error
    (B2: 501) fails its check. A transient failure propagates. The key is deleted after.
    A write of the key that the store refused for its request rate (then sent again) shows
    a per-key write limit.
    """
    key = layout.probe_key(str(uuid.uuid4()))
    refused: list[StoreCall] = []

    def note(call: StoreCall) -> None:
        if call.operation == "put" and call.key == key:
            refused.append(call)

    backoff = throttle_backoff_of(store)
    if backoff is not None:
        backoff.listeners.append(note)
    try:
        first = await store.put(key, nonce().encode(), "overwrite")
        current = await _attempt(store.put(key, nonce().encode(), IfMatch(first)))
        if isinstance(current, str):
            detail = "accepted"
            if getattr(_innermost(store), "if_match_unquoted", False):
                detail += " with the ETag sent without its quotes (refused quoted)"
            accepts = Capability("if-match, current ETag", True, detail)
        else:
            accepts = Capability("if-match, current ETag", False, f"refused ({current})")
        stale = await _attempt(store.put(key, nonce().encode(), IfMatch(first)))
        refuses_stale = _refusal("if-match, stale ETag", stale, PreconditionFailed)
        again = await _attempt(store.put(key, nonce().encode(), "create"))
        refuses_create = _refusal("create-only, existing key", again, AlreadyExists)
    finally:
        if backoff is not None:
            backoff.listeners.remove(note)
        await store.delete(key)
    probe = StoreProbe((accepts, refuses_stale, refuses_create), bool(refused))
    logger.info(
        "strategy=%s (probe of conditional writes: %s)%s",
        probe.strategy,
        "; ".join(f"{c.name}: {c.detail}" for c in probe.capabilities),
        _PER_KEY if probe.limits_writes_per_key else "",
    )
    return probe


async def _kept_probe(store: Store) -> StoreProbe:
    """The answer of a probe less than a day old, kept in the store, else a new probe's
    (then kept: the first of several processes starting together to write it wins)."""
    etag: str | None = None
    try:
        kept = await store.get(layout.PROBE_RESULT)
        etag = kept.meta.etag
        record = json.loads(kept.data)
        probed = datetime.fromisoformat(record["probed_at"])
        # Not said by an earlier version's probe: learnt from the first refusal, as then.
        per_key = record.get("limits_writes_per_key", False)
        probe = StoreProbe(tuple(Capability(**c) for c in record["capabilities"]), per_key)
        if not probe.capabilities or not all(isinstance(c.ok, bool) for c in probe.capabilities):
            raise ValueError("no capabilities")
        if not isinstance(per_key, bool):
            raise ValueError("limits_writes_per_key")
        if datetime.now(UTC) - probed < PROBE_KEPT:
            logger.info(
                "strategy=%s (from the probe of %s, kept in the store)%s",
                probe.strategy,
                record["probed_at"],
                _PER_KEY if per_key else "",
            )
            return probe
    except NotFound:
        pass
    except (ValueError, KeyError, TypeError):
        logger.warning("%s is not a probe's answer: probing again", layout.PROBE_RESULT)
    probe = await probe_store(store)
    record = {
        "probed_at": datetime.now(UTC).isoformat(),
        "capabilities": [asdict(c) for c in probe.capabilities],
        "limits_writes_per_key": probe.limits_writes_per_key,
    }
    data = json.dumps(record).encode()
    with contextlib.suppress(AlreadyExists, PreconditionFailed):  # another kept its first
        await store.put(layout.PROBE_RESULT, data, "create" if etag is None else IfMatch(etag))
    return probe


async def _attempt(put: Awaitable[str]) -> str | StoreError:
    """The put's new etag, or the store's refusal (a transient failure propagates)."""
    try:
        return await put
    except StoreUnavailable:
        raise
    except StoreError as exc:
        return exc


def _refusal(name: str, outcome: str | StoreError, expected: type[StoreError]) -> Capability:
    if isinstance(outcome, expected):
        return Capability(name, True, "refused")
    if isinstance(outcome, str):
        return Capability(name, False, "ignored: the write went through")
    return Capability(name, False, f"not supported ({outcome})")


def _innermost(store: Store) -> Store:
    while isinstance(store, StoreWrapper):
        store = store.inner
    return store
