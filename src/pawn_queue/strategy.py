"""The lease strategy: which of the two protocols of :mod:`pawn_queue.leases` a store gets.

``conditional_write`` where the store enforces create-only and if-match puts, else
``csprng_verify`` (rule 7). ``auto`` asks the store with a probe (docs/protocol.md, strategy
``auto``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable

from pawn_queue import layout
from pawn_queue.exceptions import AlreadyExists, PreconditionFailed, StoreError, StoreUnavailable
from pawn_queue.leases import ResolvedStrategy, nonce
from pawn_queue.store.base import IfMatch, Store

logger = logging.getLogger(__name__)


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
