"""Helpers shared by test modules."""

from __future__ import annotations

from pawn_queue import PawnQueue


async def settled(pq: PawnQueue) -> None:
    """Wait for the deletes that follow acks (leases; a finished batch object): they run
    after ``ack()`` returned."""
    assert pq._leases is not None
    await pq._leases.background_done()


async def keys_under(pq: PawnQueue, prefix: str) -> list[str]:
    """The keys under ``prefix`` once the deletes that follow past acks landed."""
    await settled(pq)
    return [m.key for m in await pq.store.list(prefix)]
