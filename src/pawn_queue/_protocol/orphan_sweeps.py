"""Orphan-lease sweeps: now and then a consumer deletes, in the background, the leases of a
topic whose messages are gone (:meth:`~pawn_queue._protocol.leases.LeaseManager.sweep_orphans`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pawn_queue._protocol.leases import LeaseManager
from pawn_queue.exceptions import StoreError

logger = logging.getLogger("pawn_queue._protocol.claiming")

SWEEP_SECONDS = 600.0  # how often a consumer looks for orphan leases in each topic


class OrphanSweeps:
    """The sweeps of one consumer, started in ``background`` (awaited at its close)."""

    def __init__(
        self,
        leases: LeaseManager,
        consumer_id: str,
        visibility: float,
        background: set[asyncio.Task[Any]],
    ) -> None:
        self._leases = leases
        self._consumer_id = consumer_id
        self._visibility = visibility
        self._background = background
        self._after: dict[str, float] = {}  # topic -> when to sweep it next (monotonic)

    def maybe(self, topic: str) -> None:
        """Sweep ``topic`` if its turn came (the first turn: ``SWEEP_SECONDS`` from now)."""
        now = time.monotonic()
        if now < self._after.setdefault(topic, now + SWEEP_SECONDS):
            return
        self._after[topic] = now + SWEEP_SECONDS
        sweep = asyncio.create_task(self._sweep(topic))
        self._background.add(sweep)
        sweep.add_done_callback(self._background.discard)

    async def _sweep(self, topic: str) -> None:
        try:
            await self._leases.sweep_orphans(topic, self._consumer_id, self._visibility)
        except StoreError as exc:
            logger.warning("orphan lease sweep failed topic=%s error=%s", topic, exc)
