"""The queue under a provider's request limits (tests/helpers/limits.py): about one write a
second to one key, as Google Cloud Storage, Cloudflare R2 and Storj allow. Every operation
goes through without an error reaching the caller and nothing is lost (docs/protocol.md,
"Request rates")."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pawn_queue import Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.lease_keeper import LeaseKeeper
from pawn_queue._protocol.lease_protocol import Lease
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue.config import ConcurrencyConfig, PawnQueueConfig
from pawn_queue.store import open_store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.throttling import ThrottleBackoff
from tests.helpers.faults import FaultyStore
from tests.helpers.limits import LimitingStore, limited
from tests.helpers.stores import queue_config_dict
from tests.helpers.support import acking, latest_signal_log


def limited_store_config(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> PawnQueueConfig:
    data = queue_config_dict(backend, request, tmp_path)
    # The default visibility timeout: a lease request's time bound follows it, and a write
    # refused for the key's second must fit in it with its pause.
    data["polling"] = {**data["polling"], "visibility_timeout_seconds": 30.0}
    return PawnQueueConfig.from_dict(data)


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_every_operation_goes_through_under_one_write_a_second_per_key(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = limited_store_config(backend, request, tmp_path)
    store, limit = limited(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders")
        await pq.create_subscription("orders", "audit")
        producer = await pq.register_producer("checkout")
        consumer = await pq.register_consumer("billing", ["orders"], subscription="audit")
        sent = [await producer.publish("orders", {"n": n}) for n in range(6)]
        sent += await producer.publish_batch("orders", [{"n": n} for n in range(6, 10)])
        sent.append(await producer.publish("orders", {"n": 10}, delay=1))
        received: dict[str, Message] = {}
        async with asyncio.timeout(90):
            while len(received) < len(sent):
                for message in await consumer.poll(wait=2):
                    received[message.id] = message
                    if message.payload["n"] == 3:
                        await message.nack()  # dead-lettered
                    else:
                        await message.ack()
        assert sorted(received) == sorted(sent)
        stats = await pq.subscription_stats("orders", "audit")
        assert (stats.pending, stats.in_flight, stats.dead_letter) == (0, 0, 1)
        assert [r.name for r in await pq.registry.list("producers")] == ["checkout"]
        assert [r.name for r in await pq.registry.list("consumers")] == ["billing"]
    # The change signals never outrun the limit, whatever the messages do.
    assert not [k for k in limit.refused_keys if k.startswith(layout.NOTIFY)], limit.refused
    # The probe (S3) runs once: the next process to start reads its answer and writes none.
    store, again = limited(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.topic_stats("orders")
    assert (probe_writes(limit) > 0, probe_writes(again)) == (backend == "s3", 0)


def probe_writes(limit: LimitingStore) -> int:
    return sum(n for (key, _), n in limit.writes.items() if key.startswith(layout.PROBE))


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
async def test_twenty_seconds_of_refusals_lose_nothing_and_raise_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = limited_store_config(backend, request, tmp_path)
    store, limit = limited(open_store(config), per_key_seconds=None)
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        consumer = await pq.register_consumer("billing", ["orders"])
        async with acking(consumer) as received:
            limit.refuse_everything(20)
            # Each publish waits out the refusals (backing off up to the 60 s throttle timeout).
            publishes = (producer.publish("orders", {"n": n}) for n in range(3))
            sent = await asyncio.gather(*publishes)
            assert limit.refused["rate"] > 0
            got = [await asyncio.wait_for(received.get(), 60) for _ in sent]
        assert sorted(got) == sorted(sent)


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_signals_at_the_default_interval_stay_within_one_write_a_second_per_key(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """At the default signal interval (0.1 s), under one write a second per key (Google
    Cloud Storage, Cloudflare R2): the signal log's versions go round the ring of 16 keys,
    so no signal is refused, each key is written at most once in any second, and the
    versions come as often as the interval allows (more than one a second). (Delivery
    under the limit: the tests below.)"""
    config = PawnQueueConfig.from_dict(queue_config_dict(backend, request, tmp_path))
    assert config.notify.signal_interval_seconds < 1
    store, limit = limited(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        started = time.monotonic()
        for n in range(40):  # about 4 s at 10 messages a second, each awaited
            await producer.publish("orders", {"n": n})
            await asyncio.sleep(0.1)
        await pq.runtime.signals.marked()
        elapsed = time.monotonic() - started
        log = await latest_signal_log(pq.store)
    signals = {k: n for k, n in limit.refused_keys.items() if k.startswith(layout.NOTIFY)}
    assert signals == {}
    ring = {(key, second): n for (key, second), n in limit.writes.items() if "_notify/" in key}
    assert ring and max(ring.values()) == 1, ring
    # Well over a version a second: the ring went round (the root would have been refused).
    assert log is not None and log.seq > layout.NOTIFY_RING_SIZE and log.seq > elapsed


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_a_claim_refused_for_the_keys_second_reads_the_lease_instead_of_waiting(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A consumer that claims a message another claimed within the second is refused for
    the key's write rate: it reads the lease (taken), skips the message and goes on, where
    it sent the claim again a second later (refused with 412 then), and the messages it won
    behind that claim waited for it."""
    data = queue_config_dict(backend, request, tmp_path)
    # Leases refreshed at the default pace: none within the second of its claim.
    data["polling"] |= {"visibility_timeout_seconds": 30.0, "lease_refresh_interval_seconds": 10}
    config = PawnQueueConfig.from_dict(data)
    limit = LimitingStore(open_store(config))
    sent_by_second: list[tuple[str, str]] = []

    async def second_sends(operation: str, key: str) -> None:
        sent_by_second.append((operation, key))

    async with (
        PawnQueue(config, store=ThrottleBackoff(limit)) as here,
        PawnQueue(config, store=ThrottleBackoff(FaultyStore(limit, [second_sends]))) as there,
    ):
        await here.create_topic("orders")
        sent = await (await here.register_producer("checkout")).publish("orders", {"n": 1})
        first = await here.register_consumer("first", ["orders"])
        second = await there.register_consumer("second", ["orders"])
        [taken] = await first.poll(wait=5)
        assert taken.id == sent
        assert await second.poll(wait=0) == []
        # Past when a claim refused for its second would have been sent again.
        assert await second.poll(wait=2) == []
        leases = layout.topic_prefix("orders") + layout.LEASES
        [lease] = {key for key, _ in limit.writes if key.startswith(leases)}
        assert limit.refused_keys[lease] == 1  # the second's claim, within the second
        assert sent_by_second.count(("put", lease)) == 1  # and never sent again
        await taken.ack()


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_an_ack_whose_lease_was_written_within_the_second_waits_for_its_refresh(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """With a short visibility timeout (3 s here), each ack refreshes its lease first (a
    safety window is 1.5 s: less than two are left), within the second of the lease's last
    write: under one write a second per key the refresh is refused. It is sent again after
    the store's pause, past the lease request's bound (which is for a stalled request, not
    a refused one): each ack returns, none raises, nothing is delivered twice."""
    data = queue_config_dict(backend, request, tmp_path)
    data["concurrency"] = {}  # the default clock-skew margin: a quarter of the 3 s
    config = PawnQueueConfig.from_dict(data)
    assert config.polling.visibility_timeout_seconds == 3
    store, limit = limited(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders", claims="message")
        producer = await pq.register_producer("checkout")
        consumer = await pq.register_consumer("billing", ["orders"])
        sent = [await producer.publish("orders", {"n": n}) for n in range(2)]
        acked: list[str] = []
        async with asyncio.timeout(60):
            while len(acked) < len(sent):
                for message in await consumer.poll(wait=2):
                    await asyncio.sleep(0.3)  # the handler's work
                    await message.ack()
                    acked.append(message.id)
        assert sorted(acked) == sorted(sent)
        assert (await pq.topic_stats("orders")).pending == 0
    leases = layout.topic_prefix("orders") + layout.LEASES
    assert any(k.startswith(leases) for k in limit.refused_keys), limit.refused_keys


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_once_a_young_messages_delete_was_refused_acks_wait_for_the_keys_second(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Under one write a second per key, a message acked within a second of its publish has
    its delete refused. The process learns it from the first such refusal: later acks send
    the delete once the message's second is over, and it is not refused. (On S3 the probe
    answer kept says the store sets no limit: the limit came after the probe, or the
    answer is an earlier version's, which does not say.)"""
    config = limited_store_config(backend, request, tmp_path)
    async with PawnQueue(config):
        pass  # S3: its probe, unrefused, is the answer kept
    store, limit = limited(open_store(config))
    messages = layout.messages_prefix("orders")

    def refused_deletes() -> int:
        return sum(n for key, n in limit.refused_keys.items() if key.startswith(messages))

    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        consumer = await pq.register_consumer("billing", ["orders"])
        async with acking(consumer) as acked:
            for n in range(5):  # until one is acked within its second (the listener is warm)
                first = await producer.publish("orders", {"n": n})
                assert await asyncio.wait_for(acked.get(), 30) == first
                if learned := refused_deletes():
                    break
            assert learned == 1, limit.refused_keys  # refused, learned
            sent = []
            for n in range(4):
                sent.append(await producer.publish("orders", {"n": n}))
                await asyncio.sleep(0.2)
            got = [await asyncio.wait_for(acked.get(), 30) for _ in sent]
    assert sorted(got) == sorted(sent)
    assert refused_deletes() == learned, limit.refused_keys


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
async def test_a_probe_refused_for_its_key_s_second_spares_each_process_its_first_refusal(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Under one write a second per key, the strategy probe's quick rewrites of its key are
    refused (and sent again): the answer kept says so. A process that starts with it (the
    prober, and one that reads the answer) deletes a young message once its second is over
    from its first ack, not after a refusal of its own."""
    config = limited_store_config(backend, request, tmp_path)
    messages = layout.messages_prefix("orders")
    for starts in ("probes", "reads the kept answer"):
        store, limit = limited(open_store(config))
        async with PawnQueue(config, store=store) as pq:
            kept = json.loads((await pq.store.get(layout.PROBE_RESULT)).data)
            assert kept["limits_writes_per_key"] is True, starts
            probed = any(k.startswith(layout.PROBE) for k in limit.refused_keys)
            assert probed == (starts == "probes"), limit.refused_keys
            await pq.create_topic("orders")
            producer = await pq.register_producer("checkout")
            consumer = await pq.register_consumer("billing", ["orders"])
            async with acking(consumer) as acked:
                sent = []
                for n in range(5):  # each acked within its second, the listener being warm
                    sent.append(await producer.publish("orders", {"n": n}))
                    await asyncio.sleep(0.2)
                got = [await asyncio.wait_for(acked.get(), 30) for _ in sent]
        assert sorted(got) == sorted(sent), starts
        refused = [k for k in limit.refused_keys if k.startswith(messages)]
        assert refused == [], (starts, limit.refused_keys)


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
async def test_doctor_shows_a_store_that_limits_writes_per_key(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Its race of creates on one key does not resend the losers' creates refused for the
    key's second (they backed off for tens of seconds)."""
    from pawn_queue.cli.doctor import diagnose

    config = limited_store_config(backend, request, tmp_path)
    for per_key_seconds, shown in ((1.0, ["ok"]), (None, [])):
        store, _ = limited(open_store(config), per_key_seconds=per_key_seconds)
        async with PawnQueue(config, store=store) as pq:
            report = await diagnose(pq)
        assert [c.status for c in report.checks if c.name == "writes per key"] == shown
        [race] = [c for c in report.checks if c.name == "create-only race"]
        assert race.status == "ok" and ": 1 won," in race.detail, race


async def refresh_rounds(leases: LeaseManager, limit: LimitingStore, *held: Lease) -> Counter[str]:
    """The writes sent to each key once a lease keeper holding ``held`` has started three
    rounds of refreshes."""
    keeper = LeaseKeeper(leases, interval=0.05)
    for lease in held:
        keeper.hold(lease)
    for _ in range(3):
        await keeper.next_round()
    await keeper.stop()
    return Counter(key for (key, _), n in limit.writes.items() for _ in range(n))


async def test_a_lease_claimed_just_before_a_refresh_round_waits_for_the_next_one() -> None:
    """A consumer refreshes all its leases every ``lease_refresh_interval_seconds`` at once:
    one claimed a moment before a round was refreshed within the second of its claim,
    which one write a second per key refuses. It is left for the next round; a lease
    written longer ago is refreshed."""
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    limit = LimitingStore(MemoryStore(), per_key_seconds=None)  # counting writes only
    leases = LeaseManager(limit, "conditional_write", ConcurrencyConfig(), clock=lambda: now[0])
    old = await leases.claim("t", "a", "t/messages/a.json", "c", 30)
    now[0] += timedelta(seconds=10)
    young = await leases.claim("t", "b", "t/messages/b.json", "c", 30)
    assert old is not None and young is not None
    writes = await refresh_rounds(leases, limit, old, young)
    # The old one once more (then it is as young, the clock standing still); not the other.
    assert (writes[old.key], writes[young.key]) == (2, 1), writes


async def test_a_run_s_lease_waiting_only_to_be_deleted_is_not_refreshed() -> None:
    """A run's lease whose messages are all settled here is deleted a second after its
    second: a refresh round meanwhile rewrote it for nothing (a PUT a round, a message's
    worth at a trickle). One whose message is still handed out is refreshed."""
    now = [datetime(2026, 1, 1, 12, 0, 0, 100_000, tzinfo=UTC)]
    limit = LimitingStore(MemoryStore(), per_key_seconds=None)  # counting writes only
    leases = LeaseManager(limit, "conditional_write", ConcurrencyConfig(), clock=lambda: now[0])
    runs = []
    for at in (now[0], now[0] + timedelta(seconds=1)):
        message_id = str(uuid.uuid4())
        key = layout.message_key("t", message_id, at, run=0)
        run_id = layout.parse_pending_key(key).lease_id()  # type: ignore[union-attr]
        lease = await leases.claim("t", message_id, key, "c", 30, lease_id=run_id)
        assert lease is not None and lease.members == {key}
        runs.append((lease, key))
    (done, done_key), (out, _) = runs
    leases.member_done(done, done_key)  # settled: its delete comes at 12:00:02
    now[0] += timedelta(seconds=1.5)  # both written long enough ago to be refreshed
    writes = await refresh_rounds(leases, limit, done, out)
    assert (writes[done.key], writes[out.key]) == (1, 2), writes
    await leases.flush_tombstones()
