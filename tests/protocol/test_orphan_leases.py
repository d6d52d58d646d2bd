"""Leases left without a message (a crash between an ack's two deletes) are swept away:
they block nothing, but would pile up under ``leases/``, which contended polls list."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.support import settled


async def _orphan_one(pq: PawnQueue, store: FaultyStore) -> tuple[list[str], str]:
    """Publish 3, ack one with its lease delete failing (as if the process died there), and
    requeue one with a delay (its lease stays, expiring later, with its message)."""
    await pq.create_topic("t", claims="message")
    producer = await pq.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(3)]
    consumer = await pq.register_consumer("c", topics=["t"])
    first, second, third = await consumer.poll()

    async def lose_lease_deletes(operation: str, key: str) -> None:
        if operation == "delete" and "/leases/" in key:
            raise StoreUnavailable("injected: the process died here")

    store.hooks.append(lose_lease_deletes)
    await first.ack()  # the message is gone: acked, with a warning about its lease
    await settled(pq)  # its lease delete, which follows the ack
    store.hooks.clear()
    await second.nack(requeue=True, delay=3600)
    await third.ack()
    await consumer.release_all()
    leases = [m.key for m in await pq.store.list("t/leases/")]
    assert len(leases) == 2  # the orphan, and the requeued message's lease
    return ids, f"t/leases/{first.id}.lease"


async def test_sweep_deletes_only_leases_without_a_message(queue_config: dict[str, Any]) -> None:
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        ids, orphan = await _orphan_one(pq, store)
        sweeper = await pq.register_consumer("sweeper", topics=["t"])
        leases = pq.runtime.leases
        assert await leases.sweep_orphans("t", sweeper.id, older_than=3600) == 0  # too young
        swept = 0
        async with asyncio.timeout(30):
            while not swept:  # the orphan's lease must expire first (visibility 3 s)
                swept = await leases.sweep_orphans("t", sweeper.id, older_than=0)
                await asyncio.sleep(0.1)
        assert swept == 1
        remaining = [m.key for m in await pq.store.list("t/leases/")]
        assert remaining == [f"t/leases/{ids[1]}.lease"] and orphan not in remaining
        # The requeued message is untouched: still pending, still held back by its lease.
        assert len(await pq.store.list("t/messages/")) == 1
        assert await sweeper.poll() == []


async def test_consumers_sweep_now_and_then(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pawn_queue._protocol.orphan_sweeps.SWEEP_SECONDS", 0.0)
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        _, orphan = await _orphan_one(pq, store)
        consumer = await pq.register_consumer("other", topics=["t"])
        async with asyncio.timeout(30):
            while orphan in {m.key for m in await pq.store.list("t/leases/")}:
                assert await consumer.poll() == []
                await asyncio.sleep(0.1)
        assert len(await pq.store.list("t/leases/")) == 1
