"""Rule 11: a stalled lease request cannot outlast its lease. Claims are given up after half
the visibility timeout, refreshes and releases after a quarter (and before the lease stops
being safe), whatever the store's own request timeout; the outcome of a write given up is
read back (rule 6)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue._internal.config_sections import claim_seconds, renew_seconds
from pawn_queue._protocol import layout
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue.config import ConcurrencyConfig, PawnQueueConfig
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store.memory import MemoryStore
from tests.helpers.faults import FaultyStore
from tests.helpers.stores import queue_config_dict
from tests.helpers.support import poll_count
from tests.servers.fault_proxy import FaultProxy, FaultRule
from tests.servers.seaweedfs import SeaweedFS

VISIBILITY = 4.0


def test_lease_request_bounds_follow_the_visibility_timeout() -> None:
    assert claim_seconds(30) == 15 and claim_seconds(3) == 1.5
    assert renew_seconds(30, safe_seconds=17) == 7.5  # a quarter: the next refresh has time
    assert renew_seconds(30, safe_seconds=4) == 4  # never past the lease's safe time
    assert renew_seconds(30, safe_seconds=-3) == 1  # at its end: one more short try
    assert renew_seconds(2, safe_seconds=-3) == 0.5
    # A lease of no time at all (an orphan sweep's): requests still get half a second.
    assert claim_seconds(0) == renew_seconds(0, safe_seconds=-1) == 0.5


def test_a_long_store_request_timeout_is_adapted_not_refused() -> None:
    """The default S3 request timeout (30 s) equals the default visibility timeout, and may be
    longer than a short one: lease requests get their own bounds instead."""
    config = PawnQueueConfig.from_dict(
        {
            "s3": {"bucket_name": "bucket", "request_timeout_seconds": 30},
            "polling": {"visibility_timeout_seconds": 3},
        }
    )
    assert config.s3 is not None and config.s3.request_timeout_seconds == 30
    visibility = config.polling.visibility_timeout_seconds
    assert claim_seconds(visibility) < visibility < config.s3.request_timeout_seconds
    assert renew_seconds(visibility, visibility) <= visibility / 4


def manager() -> tuple[LeaseManager, FaultyStore]:
    store = FaultyStore(MemoryStore())
    return LeaseManager(store, "conditional_write", ConcurrencyConfig()), store


def stall(operation: str, held: asyncio.Event) -> Any:
    """A hook that holds the first lease request of ``operation`` until ``held`` is set."""
    stalled = asyncio.Event()

    async def hook(op: str, key: str) -> None:
        if op == operation and "/leases/" in key and not stalled.is_set():
            stalled.set()
            await held.wait()

    return hook


async def test_a_stalled_refresh_is_given_up_and_the_next_one_keeps_the_lease() -> None:
    leases, store = manager()
    lease = await leases.claim("t", "m", "t/messages/k.json", "c", VISIBILITY)
    assert lease is not None
    never = asyncio.Event()
    store.hooks.append(stall("put", never))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="timed out"):
        await asyncio.wait_for(leases.refresh(lease), VISIBILITY)
    assert time.monotonic() - started < VISIBILITY / 2
    assert not lease.lost
    await leases.refresh(lease)  # the next refresh lands: the lease is still ours
    assert (lease.expires - leases.clock()).total_seconds() > VISIBILITY - 1


async def test_a_refresh_whose_answer_stalls_is_read_back_as_ours() -> None:
    """The write landed but its answer never came: given up, then found ours (rule 6)."""
    leases, store = manager()
    lease = await leases.claim("t", "m", "t/messages/k.json", "c", VISIBILITY)
    assert lease is not None
    before = lease.body.nonce
    store.observers.append(stall("put", asyncio.Event()))
    await asyncio.wait_for(leases.refresh(lease), VISIBILITY)
    assert lease.body.nonce != before and not lease.lost
    stored = await store.get(lease.key)
    assert stored.meta.etag == lease.etag


async def test_a_stalled_claim_is_given_up_within_half_the_visibility_timeout() -> None:
    leases, store = manager()
    store.hooks.append(stall("put", asyncio.Event()))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(leases.claim("t", "m", "t/messages/k.json", "c", VISIBILITY), 30)
    assert time.monotonic() - started < VISIBILITY
    assert await store.list("t/leases/") == []  # the stalled create never ran


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint, seed=11, max_lifetime_seconds=300) as running:
        yield running


async def test_a_stalled_refresh_on_s3_does_not_let_the_lease_lapse(
    request: pytest.FixtureRequest, tmp_path: Path, seaweedfs: SeaweedFS, proxy: FaultProxy
) -> None:
    """A refresh PUT that the network holds for longer than the lease: with the S3 client's
    own 30 s timeout the refresh loop waited on it and the lease ran out, so another consumer
    got the message while its holder was still working on it."""
    config = queue_config_dict("s3", request, tmp_path)
    config["polling"] = {"interval_seconds": 0.1, "visibility_timeout_seconds": VISIBILITY}
    direct = {**config, "s3": {**config["s3"], "request_timeout_seconds": 30.0}}
    proxied = {**direct, "s3": {**direct["s3"], "endpoint_url": proxy.endpoint}}
    async with (
        await PawnQueue.from_config(proxied) as holder_pq,
        await PawnQueue.from_config(direct) as other_pq,
    ):
        await holder_pq.create_topic("t", claims="message")
        message_id = await (await holder_pq.register_producer("p")).publish("t", "work")
        holder = await holder_pq.register_consumer("holder", topics=["t"])
        [message] = await poll_count(holder, 1)
        lease_key = layout.lease_key("t", message_id)
        proxy.set_rules(
            [FaultRule("stall", 1.0, frozenset({"put"}), lease_key, delay_seconds=10, limit=1)]
        )
        deadline = time.monotonic() + 3 * VISIBILITY
        while not proxy.stats().get("stall:put"):  # the next refresh is the stalled one
            assert time.monotonic() < deadline, "no refresh was sent"
            await asyncio.sleep(0.05)
        other = await other_pq.register_consumer(f"other-{uuid.uuid4().hex[:6]}", topics=["t"])
        # Longer than the lease and the skew margin: the holder's next refreshes keep it.
        until = time.monotonic() + VISIBILITY + 2
        while time.monotonic() < until:
            assert await other.poll() == [], "the lease lapsed: another consumer got it"
            await asyncio.sleep(0.1)
        await asyncio.wait_for(message.ack(), VISIBILITY)
        assert await other_pq.store.list("t/messages/") == []


async def test_a_lease_released_while_another_consumer_reads_it_is_free_at_once() -> None:
    """A give-back deletes the lease; a consumer of this process that read it live just
    before the delete must not go on skipping the message until the lease's old expiry."""
    leases, store = manager()
    lease = await leases.claim("t", "m", "t/messages/k.json", "c", VISIBILITY)
    assert lease is not None
    deleting, held = asyncio.Event(), asyncio.Event()

    async def hold_delete(op: str, key: str) -> None:
        if op == "delete" and key == lease.key:
            deleting.set()
            await held.wait()

    store.hooks.append(hold_delete)
    releasing = asyncio.ensure_future(leases.release(lease, counted=False))
    await deleting.wait()
    # Between the release letting go and its delete, another consumer here reads it live.
    assert await leases.claim("t", "m", "t/messages/k.json", "c2", VISIBILITY) is None
    held.set()
    await releasing
    assert await store.list("t/leases/") == []
    assert leases.worth_claiming("t", "m", "t/messages/k.json")
    assert await leases.claim("t", "m", "t/messages/k.json", "c2", VISIBILITY) is not None
