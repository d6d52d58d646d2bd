"""Group commit: concurrent ``publish()`` calls to one topic share objects, each returning
only once its object is durable; and batch members' acks are durable when they return."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue, PublishError
from pawn_queue._protocol import group_commit, layout, subscriptions
from pawn_queue._protocol.envelope import LeaseBody
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "workers" / "group_commit_worker.py"


@pytest.fixture
async def faulty(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[PawnQueue, FaultyStore]]:
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    # The topic's subscription index read once, ahead: calls made together then reach the
    # writer together, not each when its own read of the index came back.
    monkeypatch.setattr(subscriptions, "INDEX_CACHE_SECONDS", 3600.0)
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")
        await pq.runtime.subscriptions.destinations("t")
        yield pq, store


async def objects(pq: PawnQueue) -> list[str]:
    return [meta.key for meta in await pq.store.list(layout.messages_prefix("t"))]


def hold_message_writes(store: FaultyStore) -> asyncio.Event:
    """Hold every message write until the event returned is set."""
    go = asyncio.Event()

    async def hold(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            await go.wait()

    store.hooks.append(hold)
    return go


async def drain(pq: PawnQueue, expected: int) -> dict[str, Any]:
    consumer = await pq.register_consumer("drain", ["t"])
    got: dict[str, Any] = {}
    async with asyncio.timeout(30):
        while len(got) < expected:
            for message in await consumer.poll(wait=1):
                assert message.id not in got, "delivered twice"
                got[message.id] = (message.payload, message.attributes)
                await message.ack()
    return got


async def test_concurrent_publishes_share_objects_and_each_is_delivered_once(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, _ = faulty
    producer = await pq.register_producer("p")
    ids = await asyncio.gather(
        *(producer.publish("t", {"n": n}, attributes={"n": str(n)}) for n in range(50))
    )
    keys = await objects(pq)
    assert len(keys) < 50
    assert any(key.endswith(layout.BATCH_SUFFIX) for key in keys)
    got = await drain(pq, 50)
    assert got == {mid: ({"n": n}, {"n": str(n)}) for n, mid in enumerate(ids)}


async def test_a_lone_publish_is_written_alone(faulty: tuple[PawnQueue, FaultyStore]) -> None:
    pq, _ = faulty
    producer = await pq.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(3)]
    keys = await objects(pq)
    assert [layout.parse_pending_key(key).object_id for key in keys] == ids  # type: ignore[union-attr]


async def test_an_id_is_returned_only_once_its_object_is_durable(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, store = faulty
    producer = await pq.register_producer("p")
    go = hold_message_writes(store)
    writes: list[str] = []

    async def note(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            writes.append(key)

    store.observers.append(note)
    first = asyncio.create_task(producer.publish("t", {"n": 0}))
    await asyncio.sleep(0)  # the first write is in flight (held)
    rest = [asyncio.create_task(producer.publish("t", {"n": n})) for n in range(1, 10)]
    done, _ = await asyncio.wait([first, *rest], timeout=0.3)
    assert not done and writes == []
    go.set()
    ids = await asyncio.gather(first, *rest)
    assert len(writes) == 2  # the first alone, the nine that waited for it together
    assert writes[1].endswith(layout.BATCH_SUFFIX)
    assert sorted(await drain(pq, 10)) == sorted(ids)


async def test_a_failed_write_fails_every_call_in_it_and_writes_nothing(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, store = faulty
    producer = await pq.register_producer("p")
    go, failing = asyncio.Event(), {"on": True}

    async def fail_batches(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            await go.wait()
            if key.endswith(layout.BATCH_SUFFIX) and failing["on"]:
                raise StoreUnavailable("injected: the store is down")

    store.hooks.append(fail_batches)
    first = asyncio.create_task(producer.publish("t", {"n": 0}))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(producer.publish("t", {"n": n})) for n in range(1, 6)]
    await asyncio.sleep(0)
    go.set()
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert isinstance(results[0], str)
    assert all(isinstance(r, PublishError) for r in results[1:]), results
    assert len({id(r) for r in results[1:]}) == 5  # each caller its own exception
    assert len(await objects(pq)) == 1
    failing["on"] = False
    assert list(await drain(pq, 1)) == [results[0]]


@pytest.mark.parametrize("option", ["group", "delay", "dedup_id", "bytes"])
async def test_messages_with_exact_semantics_are_written_alone(
    faulty: tuple[PawnQueue, FaultyStore], option: str
) -> None:
    pq, _ = faulty
    producer = await pq.register_producer("p")

    def publish(n: int) -> Any:
        if option == "group":
            return producer.publish("t", {"n": n}, group="g")
        if option == "delay":
            return producer.publish("t", {"n": n}, delay=0.01)
        if option == "dedup_id":
            return producer.publish("t", {"n": n}, dedup_id=f"d{n}")
        return producer.publish("t", b"raw %d" % n)

    await asyncio.gather(*(publish(n) for n in range(8)))
    keys = await objects(pq)
    assert len(keys) == 8 and not any(k.endswith(layout.BATCH_SUFFIX) for k in keys)


async def test_calls_made_together_share_one_object_and_later_ones_the_next(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, store = faulty
    producer = await pq.register_producer("p")
    arrived = asyncio.Event()

    async def note(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            arrived.set()

    store.hooks.append(note)
    go = hold_message_writes(store)
    # Made in one turn of the loop: none of them is written alone.
    together = [asyncio.ensure_future(producer.publish("t", {"n": n})) for n in range(20)]
    await arrived.wait()  # their object's write is in flight, held
    later = [asyncio.ensure_future(producer.publish("t", {"n": n})) for n in range(20, 30)]
    go.set()
    await asyncio.gather(*together, *later)
    keys = await objects(pq)
    assert len(keys) == 2 and all(key.endswith(layout.BATCH_SUFFIX) for key in keys)
    assert len(await drain(pq, 30)) == 30


async def test_group_commit_can_be_turned_off(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(
        {**queue_config, "producer": {"group_commit": False}}
    ) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await asyncio.gather(*(producer.publish("t", {"n": n}) for n in range(8)))
        assert len(await objects(pq)) == 8


async def test_objects_respect_the_bounds(queue_config: dict[str, Any]) -> None:
    config = {**queue_config, "producer": {"max_batch_messages": 3}}
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await asyncio.gather(*(producer.publish("t", {"n": n}) for n in range(10)))
        keys = await objects(pq)
        assert len(keys) >= 4  # 10 messages, at most 3 an object
        await drain(pq, 10)


async def publish_in_a_loop(pq: PawnQueue, store: FaultyStore) -> None:
    """32 callers publishing 10 messages each in a loop, half of them starting while a write
    is in flight; every message write takes a few milliseconds (a store's latency)."""
    writing = asyncio.Event()

    async def slow_message_writes(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            writing.set()
            await asyncio.sleep(0.005)  # the store's latency: calls arrive during a write

    store.hooks.append(slow_message_writes)
    producer = await pq.register_producer("p")

    async def caller(c: int) -> None:
        for n in range(10):
            await producer.publish("t", {"c": c, "n": n})

    first = [asyncio.create_task(caller(c)) for c in range(16)]
    await writing.wait()
    await asyncio.gather(*first, *(caller(c) for c in range(16, 32)))


async def test_callers_publishing_in_a_loop_share_each_object(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    """The callers a write releases publish again before the next write goes, so the two
    halves share objects from then on (taken at once, they would take turns for good, with
    objects half as big: twice the requests)."""
    pq, store = faulty
    await publish_in_a_loop(pq, store)
    assert len(await objects(pq)) <= 13  # 320 messages from 32 callers: about 10 objects
    assert len(await drain(pq, 320)) == 320


@pytest.mark.usefixtures("quick_subscription_changes")
async def test_callers_publishing_in_a_loop_share_each_object_in_every_subscription(
    queue_config: dict[str, Any],
) -> None:
    """A call returns once all its copies are written: the writers of the topic's queues
    wait for each other's writes, then take the callers together (each on its own, they
    would split the callers into groups, each queue with smaller objects)."""
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t")
        names = ("a", "b", "c")
        await asyncio.gather(*(pq.create_subscription("t", name) for name in names))
        await publish_in_a_loop(pq, store)
        for name in names:
            queue = layout.subscription_queue("t", name)
            keys = [m.key for m in await pq.store.list(layout.messages_prefix(queue))]
            assert len(keys) <= 15, name  # about 10; 20 when they take turns


async def test_a_linger_holds_back_only_a_write_that_could_take_more(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``linger_seconds``, a write waits for more calls to join it, but not when what
    waits already fills an object: a queue busier than an object per linger is not held
    back (its calls would wait longer and longer)."""
    slept: list[float] = []

    class CountingSleeps:
        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

        async def sleep(self, seconds: float) -> None:
            if seconds:  # not the turns of the loop given to callers between writes
                slept.append(seconds)
            await asyncio.sleep(seconds)

    monkeypatch.setattr(group_commit, "asyncio", CountingSleeps())
    config = {**queue_config, "producer": {"max_batch_messages": 5, "linger_seconds": 0.2}}
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await pq.runtime.subscriptions.destinations("t")  # read ahead: the calls arrive together
        await asyncio.gather(*(producer.publish("t", {"n": n}) for n in range(12)))
        assert len(await objects(pq)) == 3  # 5, 5 and 2
        assert slept == [0.2]  # only before the last, partial object
        await drain(pq, 12)


def worker(role: str, config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), role, json.dumps(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("backend", ["filesystem", "s3"], indirect=True)
async def test_a_producer_killed_mid_batch_loses_no_returned_id(
    queue_config: dict[str, Any],
) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
    process = worker("publish", queue_config)
    assert process.stdout is not None
    returned = [process.stdout.readline().strip() for _ in range(300)]
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    async with await PawnQueue.from_config(queue_config) as pq:
        keys = await objects(pq)
        assert any(key.endswith(layout.BATCH_SUFFIX) for key in keys)
        consumer = await pq.register_consumer("after", ["t"])
        got: set[str] = set()
        while batch := await consumer.poll(wait=1):
            for message in batch:
                got.add(message.id)
                await message.ack()
        assert set(returned) <= got
        assert await pq.dead_letters("t") == []  # no object was read half-written


@pytest.mark.parametrize("backend", ["filesystem", "s3"], indirect=True)
async def test_a_member_acked_before_a_kill_is_not_delivered_again(
    queue_config: dict[str, Any],
) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        ids = await producer.publish_batch("t", [{"n": n} for n in range(40)])
    process = worker("ack", queue_config)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    acked = {process.stdout.readline().strip() for _ in range(20)}  # two polls' acks
    assert process.stdout.readline().strip() == "held"  # a third poll, never settled
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    async with await PawnQueue.from_config(queue_config) as pq:
        # The killed consumer's lease expires (visibility 3 s), then the rest comes back.
        consumer = await pq.register_consumer("after", ["t"])
        got: set[str] = set()
        async with asyncio.timeout(60):
            while await objects(pq):
                for message in await consumer.poll(wait=1):
                    got.add(message.id)
                    await message.ack()
        assert not got & acked, "a member acked before the kill came back"
        assert got | acked == set(ids) and len(got) == 20


async def test_a_call_cancelled_before_its_write_began_is_not_written(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, store = faulty
    producer = await pq.register_producer("p")
    go = hold_message_writes(store)
    first = asyncio.create_task(producer.publish("t", {"n": 0}))
    await asyncio.sleep(0)  # the first write is in flight (held)
    waiting = asyncio.create_task(producer.publish("t", {"n": 1}))
    await asyncio.sleep(0)
    waiting.cancel()
    go.set()
    first_id = await first
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert list(await drain(pq, 1)) == [first_id]
    assert await objects(pq) == []


@pytest.fixture
async def fanout(
    faulty: tuple[PawnQueue, FaultyStore], monkeypatch: pytest.MonkeyPatch
) -> tuple[PawnQueue, FaultyStore]:
    """``faulty``'s topic with subscriptions ``a`` and ``b``, known to the producer."""
    pq, store = faulty
    monkeypatch.setattr(subscriptions, "_CHANGE_MARGIN_SECONDS", 0.0)
    monkeypatch.setattr(subscriptions, "INDEX_CACHE_SECONDS", 0.0)  # creating waits that long
    for name in ("a", "b"):
        await pq.create_subscription("t", name)
    monkeypatch.setattr(subscriptions, "INDEX_CACHE_SECONDS", 3600.0)
    pq.runtime.subscriptions.forget("t")
    assert len(await pq.runtime.subscriptions.destinations("t")) == 2
    return pq, store


async def queue_objects(pq: PawnQueue, name: str) -> list[str]:
    queue = layout.subscription_queue("t", name)
    return [meta.key for meta in await pq.store.list(layout.messages_prefix(queue))]


async def test_a_fan_out_call_returns_once_every_copy_is_written_and_fails_if_one_failed(
    fanout: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, store = fanout
    producer = await pq.register_producer("p")
    go = asyncio.Event()
    b_queue = layout.subscription_queue("t", "b")

    async def hold_then_fail_b(operation: str, key: str) -> None:
        if operation == "put" and "/messages/" in key:
            await go.wait()
            if layout.queue_of(key) == b_queue and key.endswith(layout.BATCH_SUFFIX):
                raise StoreUnavailable("injected: b's write fails")

    store.hooks.append(hold_then_fail_b)
    first = asyncio.create_task(producer.publish("t", {"n": 0}))
    await asyncio.sleep(0)  # its copies are in flight (held)
    rest = [asyncio.create_task(producer.publish("t", {"n": n})) for n in range(1, 6)]
    done, _ = await asyncio.wait([first, *rest], timeout=0.2)
    assert not done
    go.set()
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert isinstance(results[0], str)
    assert all(isinstance(r, PublishError) for r in results[1:]), results
    assert len({id(r) for r in results[1:]}) == 5  # each caller its own exception
    # a's copies landed (a failed publish may reach some subscriptions), b holds only the first
    assert len(await queue_objects(pq, "a")) == 2
    assert len(await queue_objects(pq, "b")) == 1


async def test_a_fan_out_call_cancelled_before_its_writes_began_is_written_nowhere(
    fanout: tuple[PawnQueue, FaultyStore],
) -> None:
    pq, store = fanout
    producer = await pq.register_producer("p")
    go = hold_message_writes(store)
    first = asyncio.create_task(producer.publish("t", {"n": 0}))
    await asyncio.sleep(0)  # its copies are in flight (held)
    waiting = asyncio.create_task(producer.publish("t", {"n": 1}))
    await asyncio.sleep(0)
    waiting.cancel()
    go.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for name in ("a", "b"):
        [key] = await queue_objects(pq, name)
        assert not key.endswith(layout.BATCH_SUFFIX), name


@dataclass
class HeldAcks:
    """Acks of the first two members of a batch of three, waiting for their shared lease
    write, which the store holds until ``go`` is set; then the first ``failures`` lease
    writes fail. ``landed`` collects the lease writes that landed."""

    pq: PawnQueue
    members: list[Any]
    acks: list[asyncio.Task[None]]
    go: asyncio.Event
    landed: list[str]


async def held_acks(faulty: tuple[PawnQueue, FaultyStore], failures: int) -> HeldAcks:
    pq, store = faulty
    producer = await pq.register_producer("p")
    await producer.publish_batch("t", ["a", "b", "c"])
    members = await (await pq.register_consumer("c", ["t"])).poll()
    go, arrived, landed = asyncio.Event(), asyncio.Event(), []
    failing = {"left": failures}

    async def hold(operation: str, key: str) -> None:
        if operation == "put" and "/leases/" in key:
            arrived.set()
            await go.wait()
            if failing["left"] > 0:
                failing["left"] -= 1
                raise StoreUnavailable("injected: the store is down")

    async def note(operation: str, key: str) -> None:
        if operation == "put" and "/leases/" in key:
            landed.append(key)

    store.hooks.append(hold)
    store.observers.append(note)
    acks = [asyncio.create_task(m.ack()) for m in members[:2]]
    await arrived.wait()  # one write, in flight, carries both
    return HeldAcks(pq, members, acks, go, landed)


async def test_a_failed_member_ack_write_fails_the_acks_it_carried_and_a_retry_writes_them(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    held = await held_acks(faulty, failures=1)
    first, second, third = held.members
    held.go.set()
    results = await asyncio.gather(*held.acks, return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert not first.settled and not second.settled and held.landed == []
    await asyncio.gather(first.ack(), second.ack())  # the store is back: one write for both
    assert first.settled and second.settled and len(held.landed) == 1
    lease = await held.pq.store.get(layout.lease_key("t", first._claimed.lease.message_id))
    assert LeaseBody.decode(lease.data).settled == (0, 1)
    await third.ack()
    assert await objects(held.pq) == []


async def test_a_cancelled_member_ack_leaves_the_shared_write_to_the_others(
    faulty: tuple[PawnQueue, FaultyStore],
) -> None:
    held = await held_acks(faulty, failures=0)
    first, second, third = held.members
    held.acks[0].cancel()
    held.go.set()
    await held.acks[1]
    with pytest.raises(asyncio.CancelledError):
        await held.acks[0]
    assert second.settled and not first.settled and len(held.landed) == 1
    await first.ack()
    await third.ack()
    assert await objects(held.pq) == []
