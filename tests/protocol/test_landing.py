"""A publish whose answer was lost: the look before writing again
(``pawn_queue._protocol.landing``) and the acked leases kept for it
(``pawn_queue._protocol.tombstones``), on the memory store. The whole path, through a real S3
server that loses answers, is in tests/store/test_network_faults.py."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from pawn_queue._internal.aio import Background
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import LeaseBody, now_utc
from pawn_queue._protocol.landing import landed
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue.config import ConcurrencyConfig
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from tests.helpers.faults import FaultyStore

MARGIN = 0.2
VISIBILITY = 3.0
WINDOW = MARGIN + min(1.0, VISIBILITY / 4)  # one safety window (docs/protocol.md)


def lease_naming(message_key: str) -> bytes:
    return LeaseBody("c", "m", "", now_utc().isoformat(), "n", message_key=message_key).encode()


async def test_a_lease_shows_a_landed_message_only_when_it_names_its_key() -> None:
    store = MemoryStore()
    message_id, now = str(uuid.uuid4()), now_utc()
    key = layout.message_key("t", message_id, now)
    lease_key = layout.lease_key("t", message_id)
    assert not await landed(store, key)
    # The same id in an earlier life (dead-lettered, then redriven to this key): says nothing.
    earlier = layout.message_key("t", message_id, now - timedelta(days=1))
    await store.put(lease_key, lease_naming(earlier))
    assert not await landed(store, key)
    await store.put(lease_key, lease_naming(key))  # claimed, maybe acked since
    assert await landed(store, key)
    await store.put(lease_key, b"not a lease")
    assert not await landed(store, key)
    await store.put(key, b"{}")
    assert await landed(store, key)


async def test_a_group_lease_shows_only_the_message_it_covers() -> None:
    store = MemoryStore()
    first, second = (layout.group_message_key("t", str(uuid.uuid4()), now_utc(), "g") for _ in "ab")
    pending = layout.parse_pending_key(first)
    assert pending is not None
    await store.put(layout.lease_key("t", pending.lease_id()), lease_naming(second))
    assert not await landed(store, first)
    assert await landed(store, second)


Kept = tuple[LeaseManager, CountingStore, FaultyStore, Background]


@pytest.fixture
async def kept() -> AsyncIterator[Kept]:
    """A lease manager that keeps tombstones (as on S3), on a counted memory store."""
    counting = CountingStore(MemoryStore())
    store = FaultyStore(counting)
    background = Background()
    concurrency = ConcurrencyConfig(clock_skew_margin_seconds=MARGIN)
    leases = LeaseManager(
        store, "conditional_write", concurrency, background=background, keep_tombstones=True
    )
    yield leases, counting, store, background


async def claimed(leases: LeaseManager, store: FaultyStore) -> tuple[str, Lease]:
    """A message object and the lease this process holds on it."""
    message_id = str(uuid.uuid4())
    key = layout.message_key("t", message_id, now_utc())
    await store.put(key, b"{}")
    lease = await leases.claim("t", message_id, key, "c", VISIBILITY)
    assert lease is not None
    return key, lease


async def test_an_acked_lease_is_deleted_later_while_still_live(kept: Kept) -> None:
    leases, counting, store, _ = kept
    key, lease = await claimed(leases, store)
    deleted = asyncio.Event()

    async def on_delete(operation: str, deleted_key: str) -> None:
        if operation == "delete" and deleted_key == lease.key:
            deleted.set()

    store.observers.append(on_delete)
    counting.reset()
    await leases.settle(lease, key, lease_later=True, acked=True)
    assert await store.head(lease.key)  # kept: a publish that lost its answer finds it
    async with asyncio.timeout(10):
        await deleted.wait()
    # Deleted with a window to spare before it expires: still ours, so no write first.
    assert (lease.expires - now_utc()).total_seconds() > WINDOW
    assert counting.reset() == Counter({"DELETE": 2, "HEAD": 1})


async def test_a_dead_lettered_message_lease_is_deleted_at_once(kept: Kept) -> None:
    """A redrive brings the same id back under the same lease key: no tombstone may hold it."""
    leases, _, store, background = kept
    key, lease = await claimed(leases, store)
    await leases.settle(lease, key, lease_later=True)
    await background.done()
    assert await store.list("t/leases/") == []


async def test_a_stop_deletes_the_kept_leases_at_once(kept: Kept) -> None:
    leases, counting, store, background = kept
    kept_keys = []
    for _ in range(3):
        key, lease = await claimed(leases, store)
        await leases.settle(lease, key, lease_later=True, acked=True)
        kept_keys.append(lease.key)
    await background.done()
    assert sorted(m.key for m in await store.list("t/leases/")) == sorted(kept_keys)
    counting.reset()
    await leases.flush_tombstones()
    assert counting.reset() == Counter({"DELETE": 1})  # the three in one request
    assert await store.list("t/leases/") == []
