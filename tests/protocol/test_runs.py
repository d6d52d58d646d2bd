"""Runs: in a topic created with ``claims="second"``, one lease covers the messages of one
second (docs/protocol.md, "Runs"). One claim a second, not one a message; every message
delivered once, in order; what a stalled holder left is taken over; a message requeued or
left unsettled comes back alone."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pytest

from pawn_queue import ConfigError, Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.exceptions import LeaseLostError
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from tests.helpers.limits import LimitingStore, limited
from tests.helpers.stores import queue_config_dict
from tests.helpers.support import acking, keys_under, poll_count, settled

T = TypeVar("T")


def run_config(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, visibility: float = 30.0
) -> PawnQueueConfig:
    data = queue_config_dict(backend, request, tmp_path)
    data["polling"] = {
        **data["polling"],  # type: ignore[dict-item]
        "visibility_timeout_seconds": visibility,
        "lease_refresh_interval_seconds": visibility / 3,
    }
    return PawnQueueConfig.from_dict(data)


def lease_writes(limit: LimitingStore, topic: str) -> Counter[str]:
    """Writes (puts and deletes) sent to each lease key of ``topic``."""
    written: Counter[str] = Counter()
    for (key, _), count in limit.writes.items():
        if key.startswith(layout.leases_prefix(topic)):
            written[key] += count
    return written


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_one_claim_covers_the_messages_of_a_second(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = run_config(backend, request, tmp_path)
    store, limit = limited(open_store(config), per_key_seconds=None)
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders", claims="second")
        producer = await pq.register_producer("checkout")
        sent = [await producer.publish("orders", {"n": n}) for n in range(20)]
        consumer = await pq.register_consumer("billing", ["orders"])
        messages = await poll_count(consumer, 20)
        assert [m.id for m in messages] == sent  # FIFO, each once
        for message in messages:
            await message.ack()
        await settled(pq)
        assert await keys_under(pq, "orders/leases/") == []
        assert await keys_under(pq, "orders/messages/") == []
    published = {key for key, _ in limit.writes if key.startswith("orders/messages/")}
    assert len(published) == 20 and all(k.endswith(layout.RUN_SUFFIX) for k in published)
    runs = {layout.parse_pending_key(k).lease_id() for k in published}  # type: ignore[union-attr]
    written = lease_writes(limit, "orders")
    # One lease a second of messages, written when claimed and deleted once done: not the
    # claim and delete of a lease a message (40 writes).
    assert set(written) == {layout.lease_key("orders", run) for run in runs}
    assert all(count == 2 for count in written.values()), written


async def test_a_message_of_a_run_landing_while_it_is_held_needs_no_claim(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = run_config("memory", request, tmp_path)
    store, limit = limited(open_store(config), per_key_seconds=None)
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("orders", claims="second")
        producer = await pq.register_producer("checkout")
        consumer = await pq.register_consumer("billing", ["orders"])
        first = await producer.publish("orders", "first")
        [message] = await poll_count(consumer, 1)
        assert message.id == first
        claims = sum(lease_writes(limit, "orders").values())
        later = await producer.publish("orders", "later")
        run = {layout.parse_pending_key(k).lease_id() for k, _ in limit.writes if ".run" in k}  # type: ignore[union-attr]
        [again] = await poll_count(consumer, 1)
        assert again.id == later
        if len(run) == 1:  # published within the same second: taken in by the run's lease
            assert sum(lease_writes(limit, "orders").values()) == claims
        await message.ack()
        await again.ack()
        await settled(pq)
        assert await keys_under(pq, "orders/leases/") == []


@pytest.mark.parametrize("backend", ["memory", "filesystem"], indirect=True)
async def test_what_a_stalled_holder_left_is_taken_over_with_one_receive_more(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = run_config(backend, request, tmp_path, visibility=2.0)
    async with PawnQueue(config) as qa, PawnQueue(config) as qb:
        await qa.create_topic("orders", claims="second")
        producer = await qa.register_producer("checkout")
        sent = [await producer.publish("orders", {"n": n}) for n in range(6)]
        a = await qa.register_consumer("a", ["orders"])
        held = await poll_count(a, 6)
        for message in held[:2]:
            await message.ack()
        a.held_leases.paused = True  # a stalls, as if it crashed
        b = await qb.register_consumer("b", ["orders"])
        taken = await poll_count(b, 4)
        # In listing order within a run; runs come back as their leases expire.
        assert sorted(m.id for m in taken) == sorted(sent[2:])
        assert {m.receive_count for m in taken} == {2}
        with pytest.raises(LeaseLostError):
            await held[2].ack()
        for message in taken:
            await message.ack()
        await settled(qb)
        assert await keys_under(qb, "orders/messages/") == []


async def test_a_requeued_message_of_a_run_comes_back_alone(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = run_config("memory", request, tmp_path)
    async with PawnQueue(config) as pq:
        await pq.create_topic("orders", claims="second")
        producer = await pq.register_producer("checkout")
        sent = [await producer.publish("orders", {"n": n}) for n in range(3)]
        consumer = await pq.register_consumer("billing", ["orders"])
        first = await poll_count(consumer, 3)
        await first[1].nack(requeue=True)
        await first[0].ack()
        # Another consumer gets it while the run is held: it moved to an object of its own.
        other = await pq.register_consumer("audit", ["orders"])
        [again] = await poll_count(other, 1)
        assert (again.id, again.receive_count) == (sent[1], 2)
        kinds = sorted(key.rsplit(".", 1)[-1] for key in await keys_under(pq, "orders/messages/"))
        assert kinds == ["json", "run"]  # the one moved, the run's last one
        # The run's other message is still held: a requeue gives back no more than itself.
        assert first[2].lease_held
        await first[2].ack()
        await again.ack()
        await settled(pq)
        assert await keys_under(pq, "orders/messages/") == []


async def test_a_message_of_a_run_left_unsettled_comes_back_after_the_visibility_timeout(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = run_config("memory", request, tmp_path, visibility=1.5)
    async with PawnQueue(config) as pq:
        await pq.create_topic("orders", claims="second")
        producer = await pq.register_producer("checkout")
        sent = [await producer.publish("orders", {"n": n}) for n in range(2)]
        consumer = await pq.register_consumer("billing", ["orders"])
        first = await poll_count(consumer, 2)
        first[0].abandon()
        await first[1].ack()
        [again] = await poll_count(consumer, 1)
        assert (again.id, again.receive_count) == (sent[0], 2)
        await again.ack()


async def test_two_processes_share_a_run_topic_and_each_message_comes_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = run_config("filesystem", request, tmp_path)
    async with PawnQueue(config) as qa, PawnQueue(config) as qb:
        await qa.create_topic("orders", claims="second")
        producer = await qa.register_producer("checkout")
        consumers = [
            await qa.register_consumer("a", ["orders"]),
            await qb.register_consumer("b", ["orders"]),
        ]
        async with acking(*consumers) as acked:
            sent = []
            for n in range(30):
                sent.append(await producer.publish("orders", {"n": n}))
                await asyncio.sleep(0.02)  # a producer's pace: the runs span seconds
            async with asyncio.timeout(30):
                got = [await acked.get() for _ in sent]
        assert sorted(got) == sorted(sent)
        assert acked.empty()  # none twice


async def test_the_claims_setting_names_the_messages_and_is_checked(pq: PawnQueue) -> None:
    with pytest.raises(ConfigError, match="claims"):
        await pq.create_topic("orders", claims="minute")
    await pq.create_topic("orders")  # a new topic claims by the second
    await pq.create_topic("legacy", claims="message")
    producer = await pq.register_producer("checkout")
    for topic in ("orders", "legacy"):
        await producer.publish(topic, 1)
    await pq.update_topic("orders", claims="message")
    await pq.update_topic("legacy", claims="second")
    for topic in ("orders", "legacy"):
        await producer.publish(topic, 2)
    for topic, kinds in (("orders", ["run", "json"]), ("legacy", ["json", "run"])):
        names = [m.key.rsplit(".", 1)[-1] for m in await pq.store.list(f"{topic}/messages/")]
        assert names == kinds
        consumer = await pq.register_consumer(f"for-{topic}", [topic])
        assert [m.payload for m in await poll_count(consumer, 2)] == [1, 2]


@pytest.mark.parametrize(
    "settings",
    [None, {"max_receive_count": 3, "dedup_window_seconds": 300.0}, {"claims": 7}],
    ids=["0.1", "0.2.0", "unreadable"],
)
async def test_a_marker_that_does_not_say_claims_each_message(
    pq: PawnQueue, settings: dict[str, object] | None
) -> None:
    """A topic created by 0.2.0 or 0.1 (its marker has no claims setting), or whose
    settings are unreadable, keeps claiming each message: their consumers do not read .run
    names. Creating it again with nothing given changes nothing."""
    marker: dict[str, object] = {"topic": "orders", "created_at": "2026-01-01T00:00:00+00:00"}
    if settings is not None:
        marker["settings"] = settings
    await pq.store.put(layout.topic_marker_key("orders"), json.dumps(marker).encode(), "create")
    await pq.create_topic("orders")
    assert (await pq.topic_settings("orders")).claims == "message"
    producer = await pq.register_producer("checkout")
    await producer.publish("orders", 1)
    assert [m.key.rsplit(".", 1)[-1] for m in await pq.store.list("orders/messages/")] == ["json"]


async def test_a_subscription_of_a_run_topic_claims_its_copies_a_second_at_a_time(
    pq: PawnQueue,
) -> None:
    await pq.create_topic("orders", claims="second")
    await pq.create_subscription("orders", "audit")
    producer = await pq.register_producer("checkout")
    sent = [await producer.publish("orders", {"n": n}) for n in range(5)]
    consumer = await pq.register_consumer("auditor", ["orders"], subscription="audit")
    messages = await poll_count(consumer, 5)
    assert [m.id for m in messages] == sent
    queue = layout.subscription_queue("orders", "audit")
    leases = [m.key for m in await pq.store.list(layout.leases_prefix(queue))]
    assert leases and all(layout.lease_id_of(k).startswith("s") for k in leases)
    for message in messages:
        await message.ack()
    assert await keys_under(pq, layout.leases_prefix(queue)) == []


async def test_a_message_of_a_run_acked_here_is_not_taken_in_again(pq: PawnQueue) -> None:
    """A listing made before an ack's delete still shows the message: its run's holder must
    not take it in again (a GET of nothing, counted as a race lost to a competitor)."""
    await pq.create_topic("orders", claims="second")
    producer = await pq.register_producer("checkout")
    for n in range(2):
        await producer.publish("orders", n)
    consumer = await pq.register_consumer("billing", ["orders"])
    first, second = await poll_count(consumer, 2)
    key = first._claimed.key
    run = layout.parse_pending_key(key).lease_id()  # type: ignore[union-attr]
    await first.ack()
    assert second.lease_held  # the run's lease is held: its other messages may be taken in
    assert not pq.runtime.leases.worth_claiming("orders", run, key)
    assert pq.runtime.leases.join_run("orders", run, key, consumer.id) is None
    await second.ack()


async def test_peek_shows_the_messages_of_a_held_run_in_flight(
    queue_config: dict[str, object],
) -> None:
    """A run's lease holds every message of its run, taken in yet or not: peek shows them
    in flight, and another run's pending."""
    polling = {**queue_config["polling"], "max_messages_per_poll": 1}  # type: ignore[dict-item]
    queue_config["polling"] = polling
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        for n in range(3):
            await producer.publish("orders", n)
        [first] = await poll_count(await pq.register_consumer("billing", ["orders"]), 1)
        rows = await pq.peek("orders", limit=10)
        assert rows[0].id == first.id

        runs = [layout.parse_pending_key(r.key) for r in rows]
        held = [run.lease_id() if run else None for run in runs]
        assert [r.state for r in rows] == [
            "in_flight" if lease_id == held[0] else "pending" for lease_id in held
        ]


async def test_a_burst_is_shared_among_consumers_ten_messages_a_run(pq: PawnQueue) -> None:
    """A producer puts at most ten messages of a second into one run (then into the
    second's next run): a burst is shared among consumer processes a poll's worth at a time,
    not a second at a time."""
    await pq.create_topic("orders")
    producer = await pq.register_producer("checkout")
    sent = [await producer.publish("orders", n) for n in range(25)]
    runs = Counter(
        pending.lease_id()
        for meta in await pq.store.list("orders/messages/")
        if (pending := layout.parse_pending_key(meta.key))
    )
    assert sum(runs.values()) == 25 and max(runs.values()) <= 10 and len(runs) >= 3
    consumers = [await pq.register_consumer(f"billing-{n}", ["orders"]) for n in range(3)]
    got = [await poll_count(consumer, 1) for consumer in consumers]
    assert all(got)  # each took a run of its own
    received = [m.id for messages in got for m in messages]
    async with asyncio.timeout(60):  # each holder hands out the rest of its own run
        while len(received) < 25:
            for consumer in consumers:
                received += [m.id for m in await consumer.poll(wait=0.1)]
    assert sorted(received) == sorted(sent)


async def test_a_requeued_message_of_a_run_still_expires_by_the_topic_retention(
    queue_config: dict[str, object],
) -> None:
    """A message requeued moves to an object named for when it is due again: retention
    still counts from when it was first due (first_due), not from the move."""
    now = [datetime.now(UTC)]
    async with PawnQueue(load_config(queue_config), clock=lambda: now[0]) as pq:
        await pq.create_topic(
            "orders", claims="second", retention_seconds=15, retention_action="dead_letter"
        )
        sent = await (await pq.register_producer("checkout")).publish("orders", "old")
        consumer = await pq.register_consumer("billing", ["orders"])
        [message] = await poll_count(consumer, 1)
        now[0] += timedelta(seconds=10)
        await message.nack(requeue=True)  # moved: its new key says first due + 10 s
        now[0] += timedelta(seconds=10)  # 20 s after it was first due, 10 s after the move
        assert await consumer.poll(wait=1) == []
        [letter] = await pq.dead_letters("orders")
        assert (letter.id, letter.reason) == (sent, "retention")


async def test_purge_deletes_the_lease_of_a_run(pq: PawnQueue) -> None:
    """A run's lease is named for its run, not its message: purge (and so seek) deletes it,
    or it would hold back what lands in that run until it expired."""
    await pq.create_topic("orders", claims="second")
    producer = await pq.register_producer("checkout")
    for n in range(3):
        await producer.publish("orders", n)
    held = await poll_count(await pq.register_consumer("billing", ["orders"]), 3)
    assert held and await keys_under(pq, "orders/leases/")
    assert await pq.purge_topic("orders") == 3
    assert await keys_under(pq, "orders/leases/") == []


class HeldMessageDeletes(StoreWrapper):
    """Deletes of message objects wait for :attr:`release` (as one waits for its key's
    second on a store that limits writes per key); :attr:`held` is set at the first."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        keys = call.keys if call.operation == "delete_many" else (call.key,)
        if call.operation in ("delete", "delete_many") and any("/messages/" in k for k in keys):
            self.held.set()
            await self.release.wait()
        return await run()


@pytest.mark.parametrize("claims", ["second", "message"])
@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"], indirect=True)
async def test_a_handler_waiting_for_its_ack_s_delete_holds_back_no_message(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, claims: str
) -> None:
    """While an ack's delete waits (under a per-key write limit, for its key's second),
    listen() hands out what comes next: a run's holder would otherwise keep the rest of
    its run waiting for every such delete in turn. The ack still returns once durable."""
    config = run_config(backend, request, tmp_path)
    store = HeldMessageDeletes(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t", claims=claims)  # type: ignore[arg-type]
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", topics=["t"])
        handled: asyncio.Queue[int] = asyncio.Queue()
        acked: list[int] = []
        both_acked = asyncio.Event()

        async def handler(message: Message) -> None:
            await handled.put(message.payload["n"])
            await message.ack()
            acked.append(message.payload["n"])
            if len(acked) == 2:
                both_acked.set()

        listening = asyncio.create_task(consumer.listen(handler))
        try:
            await producer.publish("t", {"n": 0})
            assert await asyncio.wait_for(handled.get(), 30) == 0
            await asyncio.wait_for(store.held.wait(), 30)
            await producer.publish("t", {"n": 1})
            assert await asyncio.wait_for(handled.get(), 30) == 1
            assert acked == []  # both acks wait for their deletes
            store.release.set()
            await asyncio.wait_for(both_acked.wait(), 30)
            assert sorted(acked) == [0, 1]
            assert await keys_under(pq, layout.messages_prefix("t")) == []
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)


async def test_a_run_s_holder_lists_again_just_after_its_second(
    queue_config: dict[str, object],
) -> None:
    """A run that took in more than one message: its holder lists the topic once more just
    after the run's second, and takes in a message of it no change signal named (under a
    per-key write limit signals come a second apart). Without that look it would wait for
    the backfill listing, a minute later."""
    config = load_config(queue_config)
    second = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    now = [second + timedelta(seconds=0.3)]  # every message stamped in one second
    async with PawnQueue(config, clock=lambda: now[0]) as pq:
        await pq.create_topic("orders", claims="second")
        # Another process publishing with no change signals: only listings find its messages.
        quiet = config.model_copy(
            update={"notify": config.notify.model_copy(update={"enabled": False})}
        )
        async with PawnQueue(quiet, store=pq.store, clock=lambda: now[0]) as other:
            producer = await other.register_producer("checkout")
            for n in range(2):
                await producer.publish("orders", n)
            consumer = await pq.register_consumer("billing", ["orders"])
            async with acking(consumer) as acked:
                first = {await asyncio.wait_for(acked.get(), 30) for _ in range(2)}
                late = await producer.publish("orders", 2)
                assert await asyncio.wait_for(acked.get(), 30) == late
        assert len(first) == 2 and late not in first
