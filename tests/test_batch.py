"""Batch objects: many messages in one object, one lease, settled one by one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import ArgumentError, PawnQueue, PayloadError, TopicNotFoundError
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreError
from pawn_queue.store import open_store
from tests.helpers.faults import FaultyStore
from tests.helpers.storage import lease_of, leases_of
from tests.helpers.support import keys_under, poll_count, settled


async def test_batch_is_one_object_delivered_in_order(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    ids = await producer.publish_batch("t", [{"n": n} for n in range(25)], attributes={"a": "b"})
    assert len(ids) == len(set(ids)) == 25
    assert all(str(uuid.UUID(i)) == i and uuid.UUID(i).version == 4 for i in ids)
    [obj] = await pq.store.list("t/messages/")
    assert obj.key.endswith(".batch")
    consumer = await pq.register_consumer("c", topics=["t"])
    sizes, got = [], []
    while len(got) < 25:
        batch = await consumer.poll()
        sizes.append(len(batch))
        for message in batch:
            got.append(message.id)
            assert message.attributes == {"a": "b"}
            assert message.producer_id == producer.id
            if len(got) < 25:
                assert len(await pq.store.list("t/messages/")) == 1
            await message.ack()
    assert sizes == [10, 10, 5]
    assert got == ids
    assert await keys_under(pq, "t/") == ["t/.topic"]


async def test_ack_all_settles_a_poll_together_and_skips_what_is_settled(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    members = await producer.publish_batch("t", list(range(12)))
    alone = await producer.publish("t", "alone")
    consumer = await pq.register_consumer("c", topics=["t"])
    first = await consumer.poll()
    assert [m.id for m in first] == members[:10]
    await first[0].ack()
    await consumer.ack_all(first + first[:2])  # a settled message and repeats are skipped
    assert all(m.settled for m in first)
    [lease] = await leases_of(pq.store, "t")  # the batch object's
    assert lease.settled == tuple(range(10))  # durable on return
    rest = await consumer.poll(wait=5)
    while len(rest) < 3:
        rest += await consumer.poll(wait=5)
    assert sorted(m.id for m in rest) == sorted([*members[10:], alone])
    await consumer.ack_all(iter(rest))  # two objects: the batch's last members, a message
    assert await consumer.poll() == []
    await settled(pq)
    assert await keys_under(pq, "t/") == ["t/.topic"]


@pytest.mark.parametrize("bad", [None, "abc", b"x", 3, ["not a message"]])
async def test_ack_all_takes_a_list_of_messages(pq: PawnQueue, bad: Any) -> None:
    await pq.create_topic("t")
    await (await pq.register_producer("p")).publish("t", 1)
    consumer = await pq.register_consumer("c", topics=["t"])
    [message] = await poll_count(consumer, 1)
    with pytest.raises(ArgumentError, match="ack_all takes"):
        await consumer.ack_all(bad)
    with pytest.raises(ArgumentError, match="a list of messages, got Message"):
        await consumer.ack_all(message)  # type: ignore[arg-type]
    assert not message.settled
    await consumer.ack_all([message])
    assert message.settled


async def test_batch_member_nack_goes_alone_to_dead_letter(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    ids = await (await pq.register_producer("p")).publish_batch("t", ["a", "b", "c"])
    messages = await (await pq.register_consumer("c", topics=["t"])).poll()
    await messages[1].nack()
    await messages[0].ack()
    await messages[2].ack()
    assert [m.key for m in await pq.store.list("t/dead-letter/")] == [
        f"t/dead-letter/{ids[1]}.json"
    ]
    dead = json.loads((await pq.store.get(f"t/dead-letter/{ids[1]}.json")).data)
    assert dead["payload"] == "b"
    assert await keys_under(pq, "t/messages/") == []


async def test_last_member_ack_returns_once_the_object_is_deleted_teardown_waits_for_the_lease(
    queue_config: dict[str, Any],
) -> None:
    """The last member's ack is durable when it returns, as every member's: it waits for the
    object's delete. The lease's delete runs in the background, and teardown() waits for it."""
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))
    deletes: list[str] = []
    delete_started, go = asyncio.Event(), asyncio.Event()
    lease_delete_started, lease_go = asyncio.Event(), asyncio.Event()

    async def hold_deletes(operation: str, key: str) -> None:
        if operation == "delete" and "/messages/" in key:
            delete_started.set()
            await go.wait()
        if operation == "delete" and "/leases/" in key:
            lease_delete_started.set()
            await lease_go.wait()

    async def note_deletes(operation: str, key: str) -> None:
        if operation == "delete":
            deletes.append(key.split("/")[1])

    pq = PawnQueue(config, store=store)
    await pq.setup()
    await pq.create_topic("t")
    await (await pq.register_producer("p")).publish_batch("t", ["a", "b"])
    first, last = await (await pq.register_consumer("c", topics=["t"])).poll()
    store.observers.append(note_deletes)
    store.hooks.append(hold_deletes)
    await asyncio.wait_for(first.ack(), 10)
    acking = asyncio.create_task(last.ack())
    await asyncio.wait_for(delete_started.wait(), 10)
    done, _ = await asyncio.wait({acking}, timeout=0.5)
    assert not done, "the last ack returned before the object was deleted"
    go.set()
    await asyncio.wait_for(acking, 10)
    assert deletes == ["messages"]
    await asyncio.wait_for(lease_delete_started.wait(), 10)
    closing = asyncio.create_task(pq.teardown())
    done, _ = await asyncio.wait({closing}, timeout=0.5)
    assert not done, "teardown() did not wait for the lease delete"
    lease_go.set()
    await asyncio.wait_for(closing, 10)
    assert deletes == ["messages", "leases"]
    after = open_store(config)
    assert [m.key for m in await after.list("t/")] == ["t/.topic"]
    await after.close()


async def test_batch_whose_delete_failed_is_deleted_by_the_next_holder(
    queue_config: dict[str, Any],
) -> None:
    """Every member acked but the object delete failed: the lease records them all, and the
    consumer that takes the object over deletes it instead of delivering anything again."""
    queue_config["polling"]["visibility_timeout_seconds"] = 1.0
    queue_config["polling"]["lease_refresh_interval_seconds"] = 0.2
    config = load_config(queue_config)
    store = FaultyStore(open_store(config))

    async def fail_object_deletes(operation: str, key: str) -> None:
        if operation == "delete" and "/messages/" in key:
            raise StoreError("injected: delete failed")

    async with (
        PawnQueue(config, store=store) as qa,
        await PawnQueue.from_config(queue_config) as qb,
    ):
        await qa.create_topic("t")
        await (await qa.register_producer("p")).publish_batch("t", ["a", "b", "c"])
        a = await qa.register_consumer("a", topics=["t"])
        store.hooks.append(fail_object_deletes)
        for message in await a.poll():
            await message.ack()
        await settled(qa)
        [lease] = await store.inner.list("t/leases/")
        assert json.loads((await store.inner.get(lease.key)).data)["settled"] == [0, 1, 2]
        assert len(a.held_leases) == 0, "the lease is left to expire"

        b = await qb.register_consumer("b", topics=["t"])
        async with asyncio.timeout(20):
            while await keys_under(qb, "t/messages/"):
                assert await b.poll(wait=0.2) == []
        assert await keys_under(qb, "t/") == ["t/.topic"]


async def test_takeover_redelivers_only_unsettled_members(queue_config: dict[str, Any]) -> None:
    queue_config["polling"]["visibility_timeout_seconds"] = 1.0
    queue_config["polling"]["lease_refresh_interval_seconds"] = 0.2
    async with (
        await PawnQueue.from_config(queue_config) as qa,
        await PawnQueue.from_config(queue_config) as qb,
    ):
        await qa.create_topic("t")
        ids = await (await qa.register_producer("p")).publish_batch("t", list(range(25)))
        a = await qa.register_consumer("a", topics=["t"])
        first = await a.poll()
        for message in first:
            await message.ack()
        [lease] = a.held_leases
        await qa.runtime.leases.refresh(lease)  # what the background refresh does
        stored = await lease_of(qa.store, "t", lease.message_id)
        assert sorted(stored.settled) == list(range(10))
        a.held_leases.paused = True  # consumer a stalls, as if it crashed

        b = await qb.register_consumer("b", topics=["t"])
        got: list[str] = []
        async with asyncio.timeout(20):
            while len(got) < 15:
                for message in await b.poll():
                    got.append(message.id)
                    await message.ack()
                await asyncio.sleep(0.05)
        assert got == ids[10:]
        await settled(qb)
        assert await keys_under(qa, "t/") == ["t/.topic"]


async def test_batch_errors_write_nothing(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    assert await producer.publish_batch("t", []) == []
    with pytest.raises(PayloadError):
        await producer.publish_batch("t", [{"ok": 1}, {"bad": float("inf")}])
    with pytest.raises(TopicNotFoundError):
        await producer.publish_batch("nope", [1])
    assert await pq.store.list("t/messages/") == []


async def test_a_batch_member_requeued_alone_keeps_counting_its_receives(pq: PawnQueue) -> None:
    """max_receive_count counts the receives a member had in its batch: requeued alone, it
    is dead-lettered once it was received too often, not delivered once more."""
    await pq.create_topic("t", max_receive_count=2)
    producer = await pq.register_producer("p")
    first, second = await producer.publish_batch("t", ["requeued", "acked"])
    consumer = await pq.register_consumer("c", topics=["t"])
    batch = {m.id: m for m in await consumer.poll(wait=5)}
    await batch[second].ack()
    await batch[first].nack(requeue=True)  # moves to its own object, received once
    [again] = await consumer.poll(wait=5)
    assert again.id == first and again.receive_count == 2
    await again.nack(requeue=True)
    assert await consumer.poll(wait=1) == []  # a third receive is over the limit
    [letter] = await pq.dead_letters("t")
    assert letter.id == first and letter.reason == "max_receive_count"


_DRAIN_WITH_SLOTS = """
import asyncio, sys
from pawn_queue import PawnQueue

async def drain(pq, topic):
    await pq.create_topic(topic)
    producer = await pq.register_producer("p")
    await producer.publish_batch(topic, [{"n": n} for n in range(200)])
    consumer = await pq.register_consumer("c", [topic])
    loop = asyncio.get_running_loop()
    seen, done = set(), asyncio.Event()

    def handle(message):  # a plain function: it runs, and acks, in a worker thread
        message.ack()
        seen.add(message.payload["n"])
        if len(seen) == 200:
            loop.call_soon_threadsafe(done.set)

    listener = asyncio.create_task(consumer.listen(handle, concurrency=4))
    await asyncio.wait_for(done.wait(), 60)
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)
    return len(seen)

async def main(url):
    async with PawnQueue.from_url(url) as pq:
        # The spin needed a task done before its callbacks ran: about every other drain.
        print("drained", *[await drain(pq, f"t{i}") for i in range(10)])

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("url", ["memory://", "file"])
def test_listen_with_slots_drains_a_batch_acked_from_threads(url: str, tmp_path: Path) -> None:
    """A handler's task can be done before its callbacks took it out of the running set;
    counting it as a busy slot once made listen(concurrency=4) spin without yielding, so
    nothing more was handled and no timeout in that loop could fire: hence a process."""
    url = f"file://{tmp_path / 'queue'}" if url == "file" else url
    run = subprocess.run(
        [sys.executable, "-c", _DRAIN_WITH_SLOTS, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["drained"] + ["200"] * 10
