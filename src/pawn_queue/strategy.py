"""The lease strategy: which of the two protocols of :mod:`pawn_queue.lease_protocol` a
store gets.

``conditional_write`` where the store enforces create-only and if-match puts, else
``csprng_verify`` (rule 7). ``auto`` asks the store with a probe (docs/protocol.md, strategy
``auto``).
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Awaitable

from pawn_queue import layout
from pawn_queue.config import Strategy
from pawn_queue.exceptions import AlreadyExists, PreconditionFailed, StoreError, StoreUnavailable
from pawn_queue.lease_protocol import ResolvedStrategy, nonce
from pawn_queue.store.base import IfMatch, Store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreWrapper

logger = logging.getLogger(__name__)


async def resolve_strategy(store: Store, configured: Strategy) -> ResolvedStrategy:
    """The strategy for ``store``: ``configured`` unless it is ``auto``, which is
    ``conditional_write`` for memory and a local directory (no request: both enforce it) and
    the probe's answer for any other store. ``csprng_verify`` is logged at WARNING (rule 7)."""
    if configured != "auto":
        strategy: ResolvedStrategy = configured
    elif known_conditional(store):
        strategy = "conditional_write"
    else:
        strategy = await probe_strategy(store)
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
    while isinstance(store, StoreWrapper):
        store = store.inner
    # Loaded whenever such a store exists (importing it needs fcntl, POSIX only).
    filesystem = sys.modules.get("pawn_queue.store.filesystem")
    if filesystem is not None and isinstance(store, filesystem.FilesystemStore):
        return True
    return isinstance(store, MemoryStore)


async def probe_strategy(store: Store) -> ResolvedStrategy:
    """The README's probe: write ``_probe/{uuid}.probe``, then write it again create-only.

    conditional_write is chosen only if create-only *and* if-match are both enforced.
    """
    key = layout.probe_key(str(uuid.uuid4()))
    try:
        await store.put(key, nonce().encode(), "overwrite")
        create_enforced = await _rejects(store.put(key, nonce().encode(), "create"), AlreadyExists)
        stale = IfMatch('"pawn-queue-probe-stale-etag"')
        if_match_enforced = await _rejects(
            store.put(key, nonce().encode(), stale), PreconditionFailed
        )
    finally:
        await store.delete(key)
    strategy: ResolvedStrategy = (
        "conditional_write" if create_enforced and if_match_enforced else "csprng_verify"
    )
    logger.info(
        "strategy=%s create_only=%s if_match=%s (probe of conditional writes)",
        strategy,
        create_enforced,
        if_match_enforced,
    )
    return strategy


async def _rejects(put: Awaitable[str], error: type[StoreError]) -> bool:
    """Whether the store refused the write with ``error`` (a transient failure propagates)."""
    try:
        await put
    except error:
        return True
    except StoreUnavailable:
        raise
    except StoreError:
        return False
    return False
