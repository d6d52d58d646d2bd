"""Request budgets: what each operation costs, counted at the store boundary (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout, subscriptions
from pawn_queue._protocol.envelope import LeaseBody
from pawn_queue.config import load_config
from pawn_queue.exceptions import NotFoundError
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from tests.helpers.faults import FaultyStore
from tests.helpers.support import acking, settled

T = TypeVar("T")


async def spent(pq: PawnQueue, store: CountingStore) -> Counter[str]:
    """The requests counted since the last call, the lease deletes that follow acks included."""
    await settled(pq)
    return store.reset()


@contextlib.asynccontextmanager
async def counted_queue(
    queue_config: dict[str, Any], wrap: Callable[[Store], Store] = lambda store: store
) -> AsyncIterator[tuple[PawnQueue, CountingStore]]:
    """A queue with topic ``t`` whose requests are counted (on the store ``wrap`` makes)."""
    # Long leases: no background refresh may add requests while a budget is measured.
    queue_config["polling"]["visibility_timeout_seconds"] = 60
    queue_config["polling"]["lease_refresh_interval_seconds"] = 20
    # Change signals are measured on their own (tests/protocol/test_notify.py).
    queue_config["notify"] = {"enabled": False}
    config = load_config(queue_config)
    store = CountingStore(wrap(open_store(config)))
    async with PawnQueue(config, store=store) as pq:
        await pq.create_topic("t", claims="message")
        yield pq, store


@pytest.fixture
async def counted(
    queue_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[PawnQueue, CountingStore]]:
    # A publish reads the topic's subscription index once per 2 s (budgets with and without
    # subscriptions: tests/protocol/test_subscription_budgets.py); here it is read once.
    monkeypatch.setattr(subscriptions, "INDEX_CACHE_SECONDS", 3600.0)
    async with counted_queue(queue_config) as queue:
        await queue[0].runtime.subscriptions.destinations("t")
        queue[1].reset()
        yield queue


async def test_setup_probes_s3_only(backend: str, queue_config: dict[str, Any]) -> None:
    """On S3: an access check and the strategy probe. Memory and a local directory are known
    to enforce conditional writes: no request (a local directory is not even created)."""
    config = load_config(queue_config)
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        assert pq.strategy == "conditional_write"
        # The access check, a GET of the answer kept (none yet); the probe: a PUT, if-match
        # current and stale, create, DELETE; its answer kept (create-only).
        probe = Counter({"LIST": 1, "GET": 1, "PUT": 1, "PUT create": 2, "PUT if-match": 2})
        assert store.reset() == (probe + Counter({"DELETE": 1}) if backend == "s3" else Counter())
    # The next process to start within a day reads the answer kept: no probe.
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        assert pq.strategy == "conditional_write"
        kept = Counter({"LIST": 1, "GET": 1})
        assert store.reset() == (kept if backend == "s3" else Counter())


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
async def test_a_kept_probe_answer_that_is_not_one_is_probed_again(
    backend: str, queue_config: dict[str, Any]
) -> None:
    config = load_config(queue_config)
    async with PawnQueue(config) as pq:
        await pq.store.put(layout.PROBE_RESULT, b'{"probed_at": "2026-01-01", "capabilities": 1}')
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        assert pq.strategy == "conditional_write"
        assert store.reset()["PUT if-match"] == 3  # the probe's two, then the answer's
        kept = json.loads((await pq.store.get(layout.PROBE_RESULT)).data)
        assert [c["ok"] for c in kept["capabilities"]] == [True, True, True]


async def test_publish_costs_one_put(counted: tuple[PawnQueue, CountingStore]) -> None:
    pq, store = counted
    producer = await pq.register_producer("p")
    await spent(pq, store)
    for n in range(5):
        await producer.publish("t", {"n": n})
    # Create-only: a lost answer is never resent blindly (docs/protocol.md, "Publish").
    assert await spent(pq, store) == Counter({"PUT create": 5})


async def test_poll_of_ten_is_one_list_plus_claims_and_reads(
    counted: tuple[PawnQueue, CountingStore],
) -> None:
    pq, store = counted
    producer = await pq.register_producer("p")
    for n in range(30):
        await producer.publish("t", {"n": n})
    consumer = await pq.register_consumer("c", topics=["t"])
    await spent(pq, store)
    messages = await consumer.poll()
    assert len(messages) == 10
    # Never a GET to learn whether a message is leased: claims are create-only PUTs.
    assert await spent(pq, store) == Counter({"LIST": 1, "PUT create": 10, "GET": 10})
    for message in messages:
        await message.ack()
    # One delete per ack; the lease deletes follow in the background and may share a
    # request with a later ack's (10 messages, up to 10 leases).
    deletes = await spent(pq, store)
    assert set(deletes) == {"DELETE"} and 11 <= deletes["DELETE"] <= 20
    await messages[0].ack()  # idempotent and free
    assert await spent(pq, store) == Counter()


async def test_later_polls_claim_what_the_first_listing_found(
    counted: tuple[PawnQueue, CountingStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow machine must not outlast the memory between two polls of this test, nor make
    # a claim late (a late claim's message comes a poll later: other counts per poll).
    monkeypatch.setattr("pawn_queue._protocol.claiming._REMEMBER_SECONDS", 60.0)
    monkeypatch.setattr("pawn_queue._protocol.claiming._MIN_PATIENCE_SECONDS", 60.0)
    pq, store = counted
    producer = await pq.register_producer("p")
    published = [await producer.publish("t", {"n": n}) for n in range(25)]
    consumer = await pq.register_consumer("c", topics=["t"])
    await spent(pq, store)
    received: list[str] = []
    costs = []
    for _ in range(4):
        messages = await consumer.poll()
        received += [m.id for m in messages]
        costs.append(await spent(pq, store))
        await asyncio.gather(*(m.ack() for m in messages))
        await spent(pq, store)
    assert received == published  # FIFO, each once
    assert costs == [
        Counter({"LIST": 1, "PUT create": 10, "GET": 10}),
        Counter({"PUT create": 10, "GET": 10}),  # no LIST: the first one listed all 25
        # The rest of what was listed, then a LIST for the 5 more it wants (finding none).
        Counter({"PUT create": 5, "GET": 5, "LIST": 1}),
        Counter({"LIST": 1}),
    ]


async def test_nack_costs_a_put_and_two_deletes(counted: tuple[PawnQueue, CountingStore]) -> None:
    pq, store = counted
    await (await pq.register_producer("p")).publish("t", {"n": 1})
    [message] = await (await pq.register_consumer("c", topics=["t"])).poll()
    await spent(pq, store)
    await message.nack()
    assert await spent(pq, store) == Counter({"PUT": 1, "DELETE": 2})


async def test_idle_poll_costs_one_list(counted: tuple[PawnQueue, CountingStore]) -> None:
    pq, store = counted
    consumer = await pq.register_consumer("c", topics=["t"])
    await spent(pq, store)
    assert await consumer.poll() == []
    assert await spent(pq, store) == Counter({"LIST": 1})


async def test_batch_of_100_costs_a_lease_write_per_poll(
    counted: tuple[PawnQueue, CountingStore],
) -> None:
    pq, store = counted
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    await spent(pq, store)
    await producer.publish_batch("t", [{"n": n} for n in range(100)])
    polls = 0
    received = 0
    while received < 100:
        messages = await consumer.poll()
        polls += 1
        # The acks of a poll, gathered, are made durable by one lease write.
        await asyncio.gather(*(message.ack() for message in messages))
        received += len(messages)
    assert polls == 10  # polling.max_messages_per_poll: 10
    # publish, LIST, claim, read, a lease write for each poll's acks but the last, whose
    # acks delete the object (and then its lease); later polls are served locally.
    assert await spent(pq, store) == Counter(
        {"PUT create": 2, "LIST": 1, "GET": 1, "PUT if-match": polls - 1, "DELETE": 2}
    )


@pytest.mark.parametrize("settle", ["one by one", "ack_all"])
async def test_a_poll_loop_pays_a_lease_write_per_ack_unless_it_acks_together(
    counted: tuple[PawnQueue, CountingStore], settle: str
) -> None:
    """Polls of 10 from an object of 30: each ack() of a member the object outlives is a
    lease write of its own (rule 13), where a poll's acks given together share one."""
    pq, store = counted
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    await producer.publish_batch("t", [{"n": n} for n in range(30)])
    await spent(pq, store)
    acked = 0
    while acked < 30:
        messages = await consumer.poll()
        if settle == "ack_all":
            await consumer.ack_all(messages)
        else:
            for message in messages:
                await message.ack()
        acked += len(messages)
    lease_writes = 2 if settle == "ack_all" else 29
    assert await spent(pq, store) == Counter(
        {"LIST": 1, "PUT create": 1, "GET": 1, "PUT if-match": lease_writes, "DELETE": 2}
    )


async def listen_until(
    consumer: Any, count: int, handle: Any, concurrency: int | None = None
) -> None:
    """Run ``consumer.listen(handle)`` until ``handle`` was called ``count`` times."""
    calls = 0
    done = asyncio.Event()

    async def counting(message: Any) -> None:
        nonlocal calls
        await handle(message)
        calls += 1
        if calls == count:
            done.set()

    listener = asyncio.create_task(consumer.listen(counting, concurrency=concurrency))
    await asyncio.wait_for(done.wait(), 30)
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)


async def drain_batches(
    counted: tuple[PawnQueue, CountingStore], sizes: list[int], concurrency: int | None
) -> Counter[str]:
    """Publish batch objects of ``sizes`` members, listen() until a handler acked each
    member once, and return the requests the drain cost."""
    pq, store = counted
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    total = 0
    for size in sizes:
        await producer.publish_batch("t", [{"n": n} for n in range(total, total + size)])
        total += size
    await spent(pq, store)
    acked: list[int] = []

    async def handle(message: Any) -> None:
        await message.ack()
        acked.append(message.payload["n"])

    await listen_until(consumer, total, handle, concurrency)
    assert sorted(acked) == list(range(total))
    return await spent(pq, store)


# Alone: a member-ack write waits a bounded time for the others; a busy machine's slow acks
# let it go out first (2 lease writes, seen with 4 workers).
@pytest.mark.alone
@pytest.mark.parametrize("concurrency", [None, 4])
async def test_listen_writes_the_acks_of_a_batch_of_100_in_one_lease_write_at_most(
    counted: tuple[PawnQueue, CountingStore], concurrency: int | None
) -> None:
    """listen() hands out the next poll (or fills a slot) while the acks of the last ones
    wait for their write, and that write waits for the members still to be settled: the
    object's delete makes them all durable. With a write per poll it took 9 lease writes
    (about 25 with 4 slots)."""
    counts = await drain_batches(counted, [100], concurrency)
    assert counts["PUT if-match"] <= 1, counts
    assert counts["DELETE"] == 2, counts  # the object, then its lease


# Alone: a member-ack write waits a bounded time for the others; a busy machine's slow acks
# let it go out first (2 lease writes, seen with 4 workers).
@pytest.mark.alone
@pytest.mark.parametrize("concurrency", [None, 4])
async def test_an_object_s_last_members_handed_out_with_a_claim_still_share_its_delete(
    counted: tuple[PawnQueue, CountingStore], concurrency: int | None
) -> None:
    """Polls of 10 over two batch objects of 12: a poll hands out the first object's last
    members and then claims (a request the loop waits for). The acks made before wait for
    those members too, not only for the poll that takes them: each object's delete makes
    its acks durable, with no lease write."""
    counts = await drain_batches(counted, [12, 12], concurrency)
    assert counts["PUT if-match"] == 0, counts


class SlowListings(StoreWrapper):
    """A store whose listings take 0.1 s, five times a member-ack write's longest wait."""

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "list":
            await asyncio.sleep(0.1)
        return await run()


async def test_a_slow_claim_does_not_cost_the_acks_of_the_object_before_it_a_lease_write(
    queue_config: dict[str, Any],
) -> None:
    """listen() hands out an object's last members as a poll of their own, not with the
    claim of the next object: the acks of its earlier members, which wait for those last
    ones, would otherwise be written when the wait ends, however slow the claim is. Two
    objects of 12 drained by polls of 10, on a store that lists slowly: no lease write."""
    async with counted_queue(queue_config, SlowListings) as counted:
        counts = await drain_batches(counted, [12, 12], None)
    assert counts["PUT if-match"] == 0, counts


async def test_consumers_of_one_queue_do_not_race_each_other_for_a_message(
    counted: tuple[PawnQueue, CountingStore],
) -> None:
    """A message another consumer of the same queue is claiming is skipped, not claimed a
    second time: no create-only PUT (nor the GET that follows a lost one) is wasted."""
    pq, store = counted
    producer = await pq.register_producer("p")
    consumers = [await pq.register_consumer(f"c{n}", topics=["t"]) for n in range(2)]
    published = await producer.publish("t", {"n": 1})
    await spent(pq, store)
    polls = await asyncio.gather(*(consumer.poll() for consumer in consumers))
    assert sorted(len(messages) for messages in polls) == [0, 1]
    assert [m.id for messages in polls for m in messages] == [published]
    counts = await spent(pq, store)
    assert (counts["PUT create"], counts["GET"]) == (1, 1), counts


async def test_a_listener_s_member_ack_is_durable_when_it_returns(
    counted: tuple[PawnQueue, CountingStore],
) -> None:
    """Rule 13 holds while the write waits for the next polls' acks: once ``ack()`` returned,
    the stored lease lists the member, or the object is gone."""
    pq = counted[0]
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    await producer.publish_batch("t", [{"n": n} for n in range(35)])
    durable: list[bool] = []

    async def handle(message: Any) -> None:
        await message.ack()
        claimed = message._claimed
        try:
            lease = await pq.store.get(layout.lease_key("t", claimed.lease.message_id))
            listed = message._index in LeaseBody.decode(lease.data).settled
        except NotFoundError:
            listed = False
        try:
            await pq.store.head(claimed.key)
            durable.append(listed)
        except NotFoundError:
            durable.append(True)

    await listen_until(consumer, 35, handle)
    assert durable == [True] * 35


async def test_each_ack_of_a_batch_member_is_durable_when_it_returns(
    counted: tuple[PawnQueue, CountingStore],
) -> None:
    pq, store = counted
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    await producer.publish_batch("t", ["a", "b", "c"])
    await spent(pq, store)
    first, *rest = await consumer.poll()
    await first.ack()
    assert await spent(pq, store) == Counter(
        {"LIST": 1, "PUT create": 1, "GET": 1, "PUT if-match": 1}
    )
    lease = await pq.store.get(layout.lease_key("t", first._claimed.lease.message_id))
    assert LeaseBody.decode(lease.data).settled == (0,)  # stored before ack() returned
    for message in rest:
        await message.ack()


async def test_competing_consumer_stops_paying_for_held_messages(
    counted: tuple[PawnQueue, CountingStore], queue_config: dict[str, Any]
) -> None:
    pq = counted[0]
    producer = await pq.register_producer("p")
    for n in range(10):
        await producer.publish("t", {"n": n})
    holder = await pq.register_consumer("holder", topics=["t"])
    assert len(await holder.poll()) == 10
    # Another process: it cannot know what this one holds.
    config = load_config(queue_config)
    other_store = CountingStore(open_store(config))
    async with PawnQueue(config, store=other_store) as other:
        rival = await other.register_consumer("rival", topics=["t"])
        other_store.reset()
        assert await rival.poll() == []
        first = other_store.reset()
        # It claims the head alone first (it just started), loses it and learns its expiry.
        assert first["PUT create"] == 1 and first["GET"] == 1
        assert await rival.poll() == []
        second = other_store.reset()
        assert second["PUT create"] == 0 and second["GET"] == 0
        assert second["LIST"] <= 2


async def test_concurrent_acks_share_two_deletes(counted: tuple[PawnQueue, CountingStore]) -> None:
    pq, store = counted
    producer = await pq.register_producer("p")
    for n in range(10):
        await producer.publish("t", {"n": n})
    messages = await (await pq.register_consumer("c", topics=["t"])).poll()
    await spent(pq, store)
    await asyncio.gather(*(m.ack() for m in messages))
    # All messages in one delete_many, then all leases in another (messages before leases).
    assert await spent(pq, store) == Counter({"DELETE": 2})
    assert await pq.store.list("t/") == [await pq.store.head("t/.topic")]


# -- idle topics with change signals on (docs/protocol.md, rule 14) ----------------------------


class ListCounter:
    """Counts LISTs by prefix, and wakes waiters once ``_notify/`` was looked at again."""

    def __init__(self) -> None:
        self.lists: Counter[str] = Counter()
        self.ring_gets = 0
        self._look = asyncio.Event()  # set, and replaced, at each look

    async def hook(self, operation: str, key: str) -> None:
        if operation == "list":
            self.lists[key] += 1
        if operation == "get" and layout.is_notify_ring_key(key):
            self.ring_gets += 1
        if operation in ("list", "head", "get") and key.startswith(layout.NOTIFY):
            look, self._look = self._look, asyncio.Event()
            look.set()

    async def next_look(self) -> None:
        """Wait for the next look at the signals (a HEAD or GET under ``_notify/``)."""
        await asyncio.wait_for(self._look.wait(), 10)


@contextlib.asynccontextmanager
async def watched_queue(
    queue_config: dict[str, Any], topics: int, **notify: float
) -> AsyncIterator[tuple[PawnQueue, CountingStore, ListCounter]]:
    """A queue with topics ``t0``.. and change signals on, its requests counted."""
    queue_config["polling"]["visibility_timeout_seconds"] = 60
    queue_config["polling"]["lease_refresh_interval_seconds"] = 20
    queue_config["notify"] = {
        "check_interval_seconds": 0.02,
        "idle_check_interval_seconds": 0.02,
        "backfill_interval_seconds": 60,
        "sweep_interval_seconds": 600,
        "sweep_pace_seconds": 60,
        **notify,
    }
    config = load_config(queue_config)
    counter = ListCounter()
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=FaultyStore(store, hooks=[counter.hook])) as pq:
        for n in range(topics):
            await pq.create_topic(f"t{n}")
        counter.lists.clear()  # what creating the topics listed
        yield pq, store, counter


def topic_lists(counter: ListCounter) -> int:
    """The LISTs of topics' messages counted."""
    return sum(n for key, n in counter.lists.items() if key.endswith("/messages/"))


async def test_poll_of_an_idle_topic_lists_nothing_between_sweeps(
    queue_config: dict[str, Any],
) -> None:
    """poll() answers from what the queue knows: after its first listing, a poll of a topic
    nobody signalled sends no LIST (the watch's one HEAD per check serves every topic)."""
    async with watched_queue(queue_config, 1) as (pq, store, counter):
        consumer = await pq.register_consumer("c", topics=["t0"])
        store.reset()
        assert await consumer.poll() == []
        # The first look at the signals (the ring's keys, read at once, and a HEAD of
        # 0.2.0's root), then the listing.
        first = Counter({"GET": layout.NOTIFY_RING_SIZE, "HEAD": 1, "LIST": 1})
        assert store.reset() == first
        for _ in range(10):
            await counter.next_look()  # the watch keeps looking while polls go on
            assert await consumer.poll() == []
        spent_idle = store.reset()
        assert spent_idle["LIST"] == 0 and set(spent_idle) <= {"HEAD"}, spent_idle
        producer = await pq.register_producer("p")
        mid = await producer.publish("t0", {"n": 1})
        store.reset()
        [message] = await consumer.poll()  # a publish here: one listing, then the claim
        assert message.id == mid and store.reset()["LIST"] == 1
        await message.ack()


async def test_idle_listeners_cost_a_head_per_check_and_a_signal_needs_no_list(
    queue_config: dict[str, Any],
) -> None:
    """Five idle listeners of five topics: the process's checks are HEADs of the signal
    ring, with no LIST at all; another process's publish to one topic costs a GET of the
    ring's next version, which names the message, and its claim: no LIST of any topic."""
    async with watched_queue(queue_config, 5) as (pq, store, counter):
        consumers = [await pq.register_consumer(f"c{n}", topics=[f"t{n}"]) for n in range(5)]
        store.reset()
        async with acking(*consumers) as received:
            # The listeners' first listings, done (the hook sees a LIST begin, the count
            # its end).
            while topic_lists(counter) < 5 or store.counts["LIST"] < 5:
                await counter.next_look()
            await pq.runtime.signals.marked()  # the signal that listeners started, written
            await counter.next_look()  # and seen (its own: later looks are HEADs again)
            await counter.next_look()
            counter.lists.clear()
            store.reset()
            # 60 checks of at least 0.02 s: the ring is then over a second old, so the
            # publish below is signalled at once (not as busy, which has topics listed).
            for _ in range(60):
                await counter.next_look()
            idle = store.reset()
            # HEADs; and maybe the shares' read of the process records that signal asked
            # for (docs/protocol.md, strategy `conditional_write`).
            assert set(idle) <= {"HEAD", "LIST"} and idle["HEAD"] >= 60, idle
            assert set(counter.lists) <= {layout.INSTANCES}, counter.lists
            counter.lists.clear()
            gets_before = counter.ring_gets
            async with await PawnQueue.from_config(queue_config) as elsewhere:
                mid = await (await elsewhere.register_producer("p")).publish("t2", {"n": 1})
            assert await asyncio.wait_for(received.get(), 10) == mid
            assert topic_lists(counter) == 0, counter.lists
            spent = store.reset()
            # The ring's keys (a GET per look for 10 s after a version came: more are
            # likely to come) and the message; the claim; the ack's deletes.
            ring_gets = counter.ring_gets - gets_before
            assert ring_gets >= 1 and spent["GET"] == ring_gets + 1, spent
            assert spent["PUT create"] == 1, spent


async def test_the_sweep_lists_one_topic_per_pace_whatever_the_number_of_topics(
    queue_config: dict[str, Any],
) -> None:
    """Every topic is overdue for the sweep at once (a tiny interval): still, at most one
    topic is listed per pace, and each of them in turn."""
    pace = 0.1
    notify = {"sweep_interval_seconds": 0.01, "sweep_pace_seconds": pace}
    async with watched_queue(queue_config, 8, **notify) as (pq, _, counter):
        consumers = [await pq.register_consumer(f"c{n}", topics=[f"t{n}"]) for n in range(8)]
        tasks = [asyncio.create_task(c.listen(lambda m: m.ack())) for c in consumers]
        try:
            while topic_lists(counter) < 8:
                await counter.next_look()
            counter.lists.clear()
            started = time.monotonic()
            while topic_lists(counter) < 8:  # each topic swept once
                await counter.next_look()
            elapsed = time.monotonic() - started
            # One topic per pace: the count bounds the time, however long the wait took.
            assert topic_lists(counter) <= elapsed / pace + 1, (counter.lists, elapsed)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
