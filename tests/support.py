"""Helpers shared by test modules."""

from __future__ import annotations

from pawn_queue import PawnQueue


async def settled(pq: PawnQueue) -> None:
    """Wait for the lease deletes that follow acks: they run after ``ack()`` returned."""
    assert pq._leases is not None
    await pq._leases.releases_done()


async def keys_under(pq: PawnQueue, prefix: str) -> list[str]:
    """The keys under ``prefix`` once the lease deletes of past acks landed."""
    await settled(pq)
    return [m.key for m in await pq.store.list(prefix)]
