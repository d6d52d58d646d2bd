"""Subscriptions on every store of the matrix: each subscription of a topic is a queue of its
own that receives a copy of every message published after it was created (that its filter
takes), whatever the other subscriptions and their consumers do.

Creating, changing and deleting a subscription waits ``INDEX_CACHE_SECONDS`` (plus a margin)
so that every publish started afterwards, in any process, sees the change. The tests run
with that time shortened (both the producers' cache and the wait read the same constant),
except the one that proves the rule with the shipped constant across two PawnQueues.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pawn_queue import (
    ArgumentError,
    ConfigError,
    Consumer,
    Message,
    PawnQueue,
    TopicNotFoundError,
    TopicSettingsConflictError,
    TopicStats,
)
from pawn_queue._protocol import layout
from pawn_queue._protocol import subscriptions as subscriptions_module
from pawn_queue._protocol.envelope import decode_batch
from pawn_queue.config import load_config
from pawn_queue.exceptions import SubscriptionConflictError, SubscriptionNotFoundError
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from tests.helpers.stores import BACKENDS, CONDITIONAL, STORE_MATRIX
from tests.helpers.support import ack_patiently, keys_under, poll_count, settled

SHIPPED_INDEX_CACHE_SECONDS = subscriptions_module.INDEX_CACHE_SECONDS
QUICK_INDEX_CACHE_SECONDS = 0.1
SHIPPED_CHANGE_MARGIN_SECONDS = subscriptions_module._CHANGE_MARGIN_SECONDS
DEADLINE = 60.0  # the longest any loop of these tests waits for the store to get there

conditional = pytest.mark.parametrize("backend", sorted(CONDITIONAL), indirect=True)


@pytest.fixture(params=STORE_MATRIX)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def quick_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Producers trust the index 0.1 s, and changes wait that long (and a margin for timers
    firing early): the rule is the same."""
    monkeypatch.setattr(subscriptions_module, "INDEX_CACHE_SECONDS", QUICK_INDEX_CACHE_SECONDS)
    monkeypatch.setattr(subscriptions_module, "_CHANGE_MARGIN_SECONDS", 0.05)


@pytest.fixture
def config(queue_config: dict[str, Any]) -> dict[str, Any]:
    """Change signals looked at often: a consumer in another PawnQueue learns of a publish
    within a few hundredths of a second."""
    queue_config["notify"] = {"check_interval_seconds": 0.02, "idle_check_interval_seconds": 0.05}
    # Leases that outlast a loaded machine's pauses: no redelivery but where a test asks.
    queue_config["polling"]["visibility_timeout_seconds"] = 10.0
    queue_config["polling"]["lease_refresh_interval_seconds"] = 1.0
    return queue_config


@pytest.fixture
async def pq(config: dict[str, Any]) -> AsyncIterator[PawnQueue]:
    async with await PawnQueue.from_config(config) as queue:
        await queue.create_topic("t")
        yield queue


@pytest.fixture
async def other(config: dict[str, Any]) -> AsyncIterator[PawnQueue]:
    """A second PawnQueue on the same store: another process, as far as caches go."""
    async with await PawnQueue.from_config(config) as queue:
        yield queue


def queue_of(subscription: str) -> str:
    return layout.subscription_queue("t", subscription)


async def ids_in(pq: PawnQueue, queue: str) -> list[str]:
    """The ids of the messages stored in ``queue`` (each message object, and each member of
    a batch object), read from the store: what was written there, delivered or not."""
    found: list[str] = []
    for meta in await pq.store.list(layout.messages_prefix(queue)):
        pending = layout.parse_pending_key(meta.key)
        assert pending is not None, meta.key
        if pending.kind == "batch":
            found += [m.id for m in decode_batch((await pq.store.get(meta.key)).data)]
        else:
            found.append(pending.object_id)
    return found


def counts(stats: TopicStats) -> tuple[int, int, int, int]:
    return (stats.pending, stats.in_flight, stats.delayed, stats.dead_letter)


async def objects_in(pq: PawnQueue, queue: str) -> list[str]:
    return [m.key for m in await pq.store.list(layout.messages_prefix(queue))]


async def drain(consumers: list[Consumer], count: int) -> list[Message]:
    """Poll the competing ``consumers`` concurrently, acking each message, until ``count``
    messages were delivered in all; then each polls once more, to catch any extra one."""
    received: list[Message] = []

    async def consume(consumer: Consumer) -> None:
        while len(received) < count:
            for message in await consumer.poll(wait=0.2):
                received.append(message)
                await ack_patiently(message)

    async with asyncio.timeout(DEADLINE):
        await asyncio.gather(*(consume(c) for c in consumers))
        for consumer in consumers:
            for message in await consumer.poll():
                received.append(message)
                await ack_patiently(message)
    return received


async def create_all(pq: PawnQueue, filters: dict[str, Any], **settings: Any) -> None:
    """Create the subscriptions: at once (one wait for all), or one after the other where
    the store has no conditional writes (s3rver: two changes of the index at once may lose
    one, as docs/protocol.md says)."""
    calls = [pq.create_subscription("t", n, filter=f, **settings) for n, f in filters.items()]
    if pq.strategy == "conditional_write":
        await asyncio.gather(*calls)
    else:
        for call in calls:
            await call


async def test_each_subscription_gets_every_message_once(
    backend: str, pq: PawnQueue, other: PawnQueue
) -> None:
    """Three subscriptions, each drained by two competing consumers (one per PawnQueue):
    each gets every message published after it was created, once, whichever way it was
    published: publish, concurrent publishes sharing objects (group commit), publish_batch,
    publish with a dedup id. The topic's own queue receives nothing."""
    names = ["a", "b", "c"]
    await create_all(pq, dict.fromkeys(names))
    producer = await pq.register_producer("p")
    published: list[str] = []
    for n in range(3):
        published.append(await producer.publish("t", {"n": n}, attributes={"k": str(n)}))
    # Concurrent publishes join objects, per subscription.
    gathered = await asyncio.gather(*(producer.publish("t", {"n": n}) for n in range(3, 23)))
    published += gathered
    for name in names:
        assert len(await objects_in(pq, queue_of(name))) < len(published)
    published += await producer.publish_batch("t", [{"n": n} for n in range(23, 28)])
    once = await producer.publish("t", {"n": 28}, dedup_id="d-1")
    if backend in CONDITIONAL:  # a dedup marker is a create-only write
        assert await producer.publish("t", {"n": 28}, dedup_id="d-1") == once  # no write
    published.append(once)
    published.append(await producer.publish("t", {"n": 29}, delay=0.1, group="g"))
    assert len(set(published)) == 30

    for name in names:
        assert sorted(await ids_in(pq, queue_of(name))) == sorted(published), name
    assert await objects_in(pq, "t") == []  # the topic's own queue: nothing

    async def deliveries(name: str) -> list[Message]:
        competing = [
            await pq.register_consumer(f"{name}-1", ["t"], subscription=name),
            await other.register_consumer(f"{name}-2", ["t"], subscription=name),
        ]
        assert competing[0].subscription == name and competing[0].topics == ["t"]
        return await drain(competing, len(published))

    for name, received in zip(names, await asyncio.gather(*map(deliveries, names)), strict=True):
        ids = [m.id for m in received]
        assert len(ids) == len(set(ids)), f"{name}: delivered twice {Counter(ids).most_common(3)}"
        assert sorted(ids) == sorted(published), name
        for message in received:
            assert (message.topic, message.subscription, message.queue) == (
                "t",
                name,
                queue_of(name),
            )
        by_id = {m.id: m for m in received}
        assert by_id[published[1]].payload == {"n": 1}
        assert by_id[published[1]].attributes == {"k": "1"}
        assert by_id[published[-1]].group == "g"
    await settled(other)  # its lease deletes too
    for name in names:
        assert await keys_under(pq, f"{queue_of(name)}/messages/") == []
        assert await keys_under(pq, f"{queue_of(name)}/leases/") == []


# The subscriptions of the filter test, and the messages each must get (by name below).
FILTERS: dict[str, Any] = {
    "all": None,
    "eu": {"region": "eu"},
    "eu-or-us": {"region": ["eu", "us"]},
    "vip": {"vip": {"exists": True}},
    "not-vip": {"vip": {"exists": False}},
    "a-sku": {"sku": {"prefix": "A-"}},
    "eu-vip-a": {"region": "eu", "vip": {"exists": True}, "sku": {"prefix": "A-"}},
}
MESSAGES: dict[str, dict[str, str]] = {
    "plain": {},
    "eu": {"region": "eu"},
    "us": {"region": "us"},
    "ap-vip": {"region": "ap", "vip": ""},
    "eu-vip-a": {"region": "eu", "vip": "1", "sku": "A-1"},
    "eu-vip-b": {"region": "eu", "vip": "1", "sku": "B-1"},
    "us-a": {"region": "us", "sku": "A-2"},
    "EU": {"region": "EU", "sku": "a-3"},
}
EXPECTED = {
    "all": set(MESSAGES),
    "eu": {"eu", "eu-vip-a", "eu-vip-b"},
    "eu-or-us": {"eu", "us", "eu-vip-a", "eu-vip-b", "us-a"},
    "vip": {"ap-vip", "eu-vip-a", "eu-vip-b"},
    "not-vip": {"plain", "eu", "us", "us-a", "EU"},
    "a-sku": {"eu-vip-a", "us-a"},
    "eu-vip-a": {"eu-vip-a"},
}


async def test_filters_decide_what_is_written_to_each_subscription(pq: PawnQueue) -> None:
    """Each subscription stores (and delivers) exactly the messages its filter takes,
    published one by one, as a batch or concurrently; the others are never
    written to it."""
    await create_all(pq, FILTERS)
    producer = await pq.register_producer("p")
    ids: dict[str, str] = {}
    for label, attributes in MESSAGES.items():
        ids[label] = await producer.publish("t", label, attributes=attributes)
    # The same, as batches (one per attribute set) and concurrently.
    batches = {
        label: await producer.publish_batch("t", [label, label], attributes=attributes)
        for label, attributes in MESSAGES.items()
    }
    labels = list(MESSAGES)
    together = await asyncio.gather(
        *(producer.publish("t", label, attributes=MESSAGES[label]) for label in labels)
    )
    expected: dict[str, list[str]] = {}
    for name, wanted in EXPECTED.items():
        expected[name] = sorted(
            [ids[label] for label in wanted]
            + [i for label in wanted for i in batches[label]]
            + [i for label, i in zip(labels, together, strict=True) if label in wanted]
        )
        assert sorted(await ids_in(pq, queue_of(name))) == expected[name], name
        # 2 objects for each message taken, and the concurrent ones share objects.
        assert 2 * len(wanted) < (await pq.subscription_stats("t", name)).pending <= 3 * len(wanted)
    assert await objects_in(pq, "t") == []

    async def delivered(name: str) -> list[Message]:
        consumer = await pq.register_consumer(f"c-{name}", ["t"], subscription=name)
        return await drain([consumer], len(expected[name]))

    for name, received in zip(
        EXPECTED, await asyncio.gather(*map(delivered, EXPECTED)), strict=True
    ):
        assert sorted(m.id for m in received) == expected[name], name
        assert {m.payload for m in received} == EXPECTED[name], name


async def test_a_message_no_subscription_takes_is_written_nowhere(pq: PawnQueue) -> None:
    await create_all(pq, {"eu": {"region": "eu"}, "vip": {"vip": {"exists": True}}})
    producer = await pq.register_producer("p")
    await producer.publish("t", "warm")  # the index is cached from here on
    before = {m.key: m.etag for m in await pq.store.list("t/")}
    nowhere = [
        await producer.publish("t", "x", attributes={"region": "us"}),
        await producer.publish("t", "x", delay=60, group="g"),
        *await producer.publish_batch("t", ["x", "y"], attributes={"region": "EU"}),
        *await asyncio.gather(*(producer.publish("t", n) for n in range(5))),
    ]
    assert len(set(nowhere)) == len(nowhere)  # ids, as for any publish
    assert {m.key: m.etag for m in await pq.store.list("t/")} == before
    taken = await producer.publish("t", "eu", attributes={"region": "eu"})
    assert await ids_in(pq, queue_of("eu")) == [taken]
    assert await ids_in(pq, queue_of("vip")) == []


async def test_a_topic_without_subscriptions_is_a_work_queue(pq: PawnQueue) -> None:
    """No index object is written, messages wait in the topic's own queue, and consumers
    of the topic compete for them; another topic's subscriptions change nothing."""
    await pq.create_topic("u")
    await pq.create_subscription("u", "s")
    producer = await pq.register_producer("p")
    published = [await producer.publish("t", n) for n in range(3)]
    published += await producer.publish_batch("t", [3, 4])
    published += await asyncio.gather(*(producer.publish("t", n) for n in range(5, 10)))
    assert await pq.list_subscriptions("t") == []
    assert sorted(await ids_in(pq, "t")) == sorted(published)
    assert [m.key for m in await pq.store.list("t/") if "/messages/" not in m.key] == [
        layout.topic_marker_key("t")
    ]
    competing = [await pq.register_consumer(f"c{n}", ["t"]) for n in range(2)]
    assert competing[0].subscription is None
    received = await drain(competing, len(published))
    assert sorted(m.id for m in received) == sorted(published)
    assert {(m.topic, m.subscription, m.queue) for m in received} == {("t", None, "t")}
    assert await ids_in(pq, queue_of("s")) == []


async def test_nack_retries_and_dead_letters_stay_in_their_subscription(pq: PawnQueue) -> None:
    """A subscription's nacks, delays, receive limit, dead letters and redrives are its
    own: the other subscription (and the topic) never see them."""
    await pq.update_topic("t", claims="message")  # a lease a message, held back for the delay
    await pq.create_subscription("t", "strict", max_receive_count=2)
    await pq.create_subscription("t", "lenient")
    producer = await pq.register_producer("p")
    first = await producer.publish("t", "first", attributes={"k": "v"})
    second = await producer.publish("t", "second")
    strict = await pq.register_consumer("strict", ["t"], subscription="strict")
    lenient = await pq.register_consumer("lenient", ["t"], subscription="lenient")

    held = {m.id: m for m in await strict.poll()}
    assert set(held) == {first, second}
    await held[first].nack(requeue=True, delay=0.3)
    await held[second].ack()
    await settled(pq)
    stats = await pq.subscription_stats("t", "strict")
    assert counts(stats) == (0, 1, 0, 0)  # its lease holds it back for the delay
    assert counts(await pq.topic_stats("t", subscription="strict")) == counts(stats)
    assert counts(await pq.subscription_stats("t", "lenient")) == (2, 0, 0, 0)

    async with asyncio.timeout(DEADLINE):
        [again] = await strict.poll(wait=DEADLINE)  # due after its delay
    assert (again.id, again.receive_count, again.subscription) == (first, 2, "strict")
    await again.nack(requeue=True)
    # Its third receive is over the limit: the claim dead-letters it.
    async with asyncio.timeout(DEADLINE):
        while not await pq.dead_letters("t", subscription="strict"):
            assert await strict.poll(wait=0.2) == []
    [letter] = await pq.dead_letters("t", subscription="strict")
    assert (letter.id, letter.topic, letter.subscription) == (first, "t", "strict")
    assert (letter.reason, letter.payload, letter.attributes) == (
        "max_receive_count",
        "first",
        {"k": "v"},
    )
    assert letter.key == layout.dead_letter_key(queue_of("strict"), first)
    assert await pq.dead_letter("t", first, subscription="strict") == letter
    assert await pq.dead_letter("t", first, subscription="lenient") is None
    assert await pq.dead_letter("t", first) is None
    assert await pq.dead_letters("t", subscription="lenient") == []
    assert await pq.dead_letters("t") == []
    assert (await pq.subscription_stats("t", "strict")).dead_letter == 1

    # The lenient subscription got both messages, each for the first time.
    received = await drain([lenient], 2)
    assert sorted((m.id, m.receive_count) for m in received) == sorted([(first, 1), (second, 1)])

    # Redrive: back to the strict subscription only.
    assert await pq.redrive("t", subscription="lenient") == 0
    assert await pq.redrive("t", subscription="strict") == 1
    assert await ids_in(pq, queue_of("strict")) == [first]
    assert await ids_in(pq, queue_of("lenient")) == []
    assert await objects_in(pq, "t") == []
    [back] = await drain([strict], 1)
    assert (back.id, back.payload, back.attributes, back.subscription) == (
        first,
        "first",
        {"k": "v"},
        "strict",
    )
    assert await lenient.poll() == []

    # A purge empties one subscription's dead letters only.
    doomed = await producer.publish("t", "doomed")
    for consumer in (strict, lenient):
        [message] = await consumer.poll(wait=DEADLINE)
        assert message.id == doomed
        await message.nack()
    assert len(await pq.dead_letters("t", subscription="strict")) == 1
    assert await pq.purge_dead_letters("t", subscription="lenient") == 1
    assert await pq.dead_letters("t", subscription="lenient") == []
    assert len(await pq.dead_letters("t", subscription="strict")) == 1


async def test_retention_is_each_subscription_s_own(pq: PawnQueue) -> None:
    """A message past one subscription's retention is dead-lettered there (its action),
    dropped in another (the default action), and still delivered where there is none."""
    await pq.create_subscription(
        "t", "short", retention_seconds=0.3, retention_action="dead_letter"
    )
    await pq.create_subscription("t", "drop", retention_seconds=0.3)
    await pq.create_subscription("t", "keep")
    producer = await pq.register_producer("p")
    mid = await producer.publish("t", "old", attributes={"k": "v"})
    short = await pq.register_consumer("short", ["t"], subscription="short")
    drop = await pq.register_consumer("drop", ["t"], subscription="drop")
    # Until it is past the retention, a poll may still take it: then it is given back.
    async with asyncio.timeout(DEADLINE):
        while not await pq.dead_letters("t", subscription="short"):
            for message in await short.poll(wait=0.1):
                await message.nack(requeue=True)
        while await ids_in(pq, queue_of("drop")):
            for message in await drop.poll(wait=0.1):
                await message.nack(requeue=True)
    [letter] = await pq.dead_letters("t", subscription="short")
    assert (letter.id, letter.reason, letter.subscription) == (mid, "retention", "short")
    assert await pq.dead_letters("t", subscription="drop") == []
    [kept] = await drain([await pq.register_consumer("keep", ["t"], subscription="keep")], 1)
    assert (kept.id, kept.payload, kept.attributes) == (mid, "old", {"k": "v"})
    assert await ids_in(pq, queue_of("short")) == []


async def test_groups_keep_their_order_in_each_subscription(
    pq: PawnQueue, other: PawnQueue
) -> None:
    """Two subscriptions, each with two competing listeners (one per PawnQueue): in each,
    every group is handled in order and one message at a time."""
    names = ["x", "y"]
    await create_all(pq, dict.fromkeys(names))
    producer = await pq.register_producer("p")
    groups, per_group = ["g1", "g2"], 4
    for seq in range(per_group):
        for group in groups:
            await producer.publish("t", {"g": group, "seq": seq}, group=group)
    processed: dict[tuple[str, str], list[int]] = defaultdict(list)
    in_flight: Counter[tuple[str, str]] = Counter()
    overlaps: list[tuple[str, str]] = []
    done = {name: asyncio.Event() for name in names}
    errors: list[BaseException] = []
    rng = random.Random(11)

    async def handle(message: Message) -> None:
        try:
            assert message.subscription is not None
            where = (message.subscription, message.payload["g"])
            if in_flight[where]:
                overlaps.append(where)
            in_flight[where] += 1
            await asyncio.sleep(rng.uniform(0, 0.01))  # some work: other groups interleave
            processed[where].append(message.payload["seq"])
            in_flight[where] -= 1
            await message.ack()
        except Exception as exc:  # listen() would dead-letter the message: say why, now
            errors.append(exc)
            for event in done.values():
                event.set()
            raise
        if sum(len(processed[(message.subscription, g)]) for g in groups) == 8:
            done[message.subscription].set()

    listeners = []
    try:
        for n, queue in enumerate((pq, other)):
            for name in names:
                consumer = await queue.register_consumer(f"{name}-{n}", ["t"], subscription=name)
                listeners.append(asyncio.create_task(consumer.listen(handle)))
        async with asyncio.timeout(DEADLINE):
            for event in done.values():
                await event.wait()
    finally:
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
    assert errors == [] and overlaps == []
    for name in names:
        for group in groups:
            assert processed[(name, group)] == list(range(per_group)), (name, group)


async def test_subscription_stats(pq: PawnQueue) -> None:
    await create_all(pq, {"a": None, "b": {"k": "b"}})
    producer = await pq.register_producer("p")
    for n in range(4):
        await producer.publish("t", n)
    await producer.publish("t", "later", delay=3600)
    await producer.publish("t", "b only", attributes={"k": "b"})
    consumer = await pq.register_consumer("c", ["t"], subscription="a")
    # One poll may return fewer on a loaded machine (a claim not checked in time).
    held = await poll_count(consumer, 5)
    assert len(held) == 5  # the delayed one is not due
    await held[0].nack()
    await held[1].ack()
    await settled(pq)
    stats = await pq.subscription_stats("t", "a")
    assert counts(stats) == (0, 3, 1, 1)
    assert counts(await pq.topic_stats("t", subscription="a")) == counts(stats)
    await consumer.release_all()
    await settled(pq)
    stats = await pq.subscription_stats("t", "a")
    assert counts(stats) == (3, 0, 1, 1)
    assert stats.oldest_age_seconds is not None and stats.oldest_age_seconds >= 0
    assert counts(await pq.subscription_stats("t", "b")) == (1, 0, 0, 0)
    own = await pq.topic_stats("t")
    assert counts(own) == (0, 0, 0, 0)
    assert own.oldest_age_seconds is None


async def test_create_is_idempotent_and_refuses_another_filter_or_setting(
    pq: PawnQueue,
) -> None:
    created = await pq.create_subscription(
        "t", "s", filter={"region": ["us", "eu"], "vip": {"exists": True}}, max_receive_count=3
    )
    assert (created.topic, created.name, created.queue) == ("t", "s", queue_of("s"))
    assert created.filter == {"region": ["eu", "us"], "vip": {"exists": True}}
    assert created.settings.max_receive_count == 3
    index = await pq.store.get(layout.subscription_index_key("t"))
    marker = await pq.store.get(layout.topic_marker_key(queue_of("s")))

    # The same filter, written otherwise, and the same (or unnamed) settings: no change.
    again = await pq.create_subscription(
        "t", "s", filter={"vip": {"exists": True}, "region": ("eu", "us", "eu")}
    )
    assert again == created
    assert (
        await pq.create_subscription(
            "t", "s", filter=created.filter, max_receive_count=3, retention_action="delete"
        )
        == created
    )

    conflicts: list[tuple[dict[str, Any], dict[str, tuple[object, object]]]] = [
        ({"filter": {"region": "eu"}}, {"filter": (created.filter, {"region": "eu"})}),
        ({"filter": None}, {"filter": (created.filter, None)}),
        (
            {"filter": created.filter, "max_receive_count": 4},
            {"max_receive_count": (3, 4)},
        ),
        (
            {"filter": created.filter, "retention_seconds": 60},
            {"retention_seconds": (None, 60)},
        ),
        (
            {"filter": created.filter, "linger_seconds": 0.2},
            {"linger_seconds": (0.0, 0.2)},
        ),
    ]
    for kwargs, differences in conflicts:
        with pytest.raises(SubscriptionConflictError) as caught:
            await pq.create_subscription("t", "s", **kwargs)
        assert isinstance(caught.value, TopicSettingsConflictError)
        assert (caught.value.topic, caught.value.subscription) == ("t", "s")
        assert caught.value.differences == differences
        assert "update_subscription" in str(caught.value)
    # Nothing was written by the refused calls.
    assert (await pq.store.get(layout.subscription_index_key("t"))).data == index.data
    assert (await pq.store.get(layout.topic_marker_key(queue_of("s")))).data == marker.data
    assert await pq.list_subscriptions("t") == [created]
    assert await pq.subscription("t", "s") == created


async def test_linger_gathers_a_sparse_subscription_s_copies_into_one_object(
    pq: PawnQueue,
) -> None:
    """Publishes spread over a few milliseconds, each taken by the filtered subscription:
    with its linger they share one object there (and their own one-message writes in the
    topic's other subscription), without it the first goes out alone."""
    await pq.create_subscription("t", "all")
    await pq.create_subscription("t", "few", filter={"k": "x"}, linger_seconds=0.5)
    producer = await pq.register_producer("p")

    async def spread(payloads: list[int]) -> list[str]:
        tasks = []
        for n in payloads:
            tasks.append(asyncio.create_task(producer.publish("t", n, attributes={"k": "x"})))
            await asyncio.sleep(0.01)  # the scenario: publishes spread out in time
        return await asyncio.gather(*tasks)

    ids = await spread([1, 2, 3, 4, 5])
    few = await objects_in(pq, queue_of("few"))
    assert len(few) == 1 and few[0].endswith(layout.BATCH_SUFFIX)
    assert len(await objects_in(pq, queue_of("all"))) > 1  # the first went out alone
    consumer = await pq.register_consumer("c", ["t"], subscription="few")
    assert sorted(m.id for m in await drain([consumer], 5)) == sorted(ids)

    updated = await pq.update_subscription("t", "few", linger_seconds=0)
    assert updated.linger_seconds == 0.0 and updated.filter == {"k": "x"}
    await spread([6, 7, 8])
    assert len(await objects_in(pq, queue_of("few"))) > 1


async def test_update_applies_to_later_publishes(pq: PawnQueue, other: PawnQueue) -> None:
    """A new filter decides from the next publish on, in this PawnQueue and another whose
    cache of the index is warm; settings change without touching the filter."""
    await pq.create_subscription("t", "s", filter={"region": "eu"})
    producers = [await pq.register_producer("p"), await other.register_producer("q")]

    async def publish_both() -> dict[str, str]:
        return {
            f"{region}-{n}": await producer.publish("t", region, attributes={"region": region})
            for n, producer in enumerate(producers)
            for region in ("eu", "us")
        }

    first = await publish_both()  # caches warm in both
    assert sorted(await ids_in(pq, queue_of("s"))) == sorted([first["eu-0"], first["eu-1"]])
    updated = await pq.update_subscription("t", "s", filter={"region": "us"})
    assert updated.filter == {"region": "us"}
    second = await publish_both()
    stored = set(await ids_in(pq, queue_of("s")))
    assert {second["us-0"], second["us-1"]} <= stored
    assert not {second["eu-0"], second["eu-1"]} & stored

    # Settings only: the filter stays.
    changed = await pq.update_subscription("t", "s", max_receive_count=5)
    assert (changed.filter, changed.settings.max_receive_count) == ({"region": "us"}, 5)
    assert await pq.subscription("t", "s") == changed
    everything = await pq.update_subscription("t", "s", filter=None)
    assert everything.filter is None and everything.settings.max_receive_count == 5
    third = await publish_both()
    assert set(third.values()) <= set(await ids_in(pq, queue_of("s")))
    assert await objects_in(pq, "t") == []
    with pytest.raises(SubscriptionNotFoundError):
        await pq.update_subscription("t", "nope", filter=None)


async def test_delete_removes_the_queue_and_stops_delivery(pq: PawnQueue, other: PawnQueue) -> None:
    await create_all(pq, {"a": None, "b": None})
    producer = await other.register_producer("p")  # another PawnQueue: its own cache
    first = await producer.publish("t", 1)
    consumer = await pq.register_consumer("c", ["t"], subscription="a")
    [held] = await consumer.poll(wait=DEADLINE)
    letter = await producer.publish("t", 2)
    [doomed] = await consumer.poll(wait=DEADLINE)
    await doomed.nack()
    assert await pq.dead_letters("t", subscription="a")

    await pq.delete_subscription("t", "a")
    assert await pq.store.list(f"{queue_of('a')}/") == []
    assert [s.name for s in await pq.list_subscriptions("t")] == ["b"]
    later = await producer.publish("t", 3)
    assert await pq.store.list(f"{queue_of('a')}/") == []
    assert sorted(await ids_in(pq, queue_of("b"))) == sorted([first, letter, later])
    # Its consumer's messages are gone; the subscription is unknown everywhere.
    assert await consumer.poll() == []
    for call in (
        lambda: pq.register_consumer("c2", ["t"], subscription="a"),
        lambda: pq.subscription("t", "a"),
        lambda: pq.subscription_stats("t", "a"),
        lambda: pq.dead_letters("t", subscription="a"),
        lambda: pq.delete_subscription("t", "a"),
        lambda: pq.update_subscription("t", "a", filter=None),
    ):
        with pytest.raises(SubscriptionNotFoundError):
            await call()
    del held

    # Without subscriptions, the topic's own queue receives again.
    await pq.delete_subscription("t", "b")
    assert await pq.list_subscriptions("t") == []
    own = await producer.publish("t", 4)
    assert await ids_in(pq, "t") == [own]
    assert await pq.store.list(f"{layout.subscriptions_prefix('t')}") == []


async def test_missing_subscriptions_and_topics(pq: PawnQueue) -> None:
    await pq.create_topic("u")
    await pq.create_subscription("t", "s")
    with pytest.raises(SubscriptionNotFoundError) as caught:
        await pq.register_consumer("c", ["t"], subscription="nope")
    assert isinstance(caught.value, TopicNotFoundError)
    assert "subscription 'nope' of topic 't'" in str(caught.value)
    # A subscription of each topic is needed: "u" has none.
    with pytest.raises(SubscriptionNotFoundError):
        await pq.register_consumer("c", ["t", "u"], subscription="s")
    await pq.create_subscription("u", "s")
    both = await pq.register_consumer("c", ["t", "u"], subscription="s")
    assert both.topics == ["t", "u"] and both.subscription == "s"
    for call in (
        lambda: pq.create_subscription("missing", "s"),
        lambda: pq.list_subscriptions("missing"),
        lambda: pq.register_consumer("c", ["missing"], subscription="s"),
    ):
        with pytest.raises(TopicNotFoundError):
            await call()
    assert await pq.store.list("missing/") == []


BAD_CALLS: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("create_subscription", {"name": "a/b"}, ConfigError),
    ("create_subscription", {"name": "_reserved"}, ConfigError),
    ("create_subscription", {"name": ""}, ConfigError),
    ("create_subscription", {"name": 5}, ConfigError),
    ("create_subscription", {"name": "s", "topic": "t/subscriptions/x"}, ConfigError),
    ("create_subscription", {"name": "s", "filter": ["region"]}, ArgumentError),
    ("create_subscription", {"name": "s", "filter": {"r": {"prefix": ""}}}, ArgumentError),
    ("create_subscription", {"name": "s", "filter": {"r": 1}}, ArgumentError),
    ("create_subscription", {"name": "s", "start": "beginning"}, ArgumentError),
    ("create_subscription", {"name": "s", "max_receive_count": 0}, ConfigError),
    ("create_subscription", {"name": "s", "retention_seconds": -1}, ConfigError),
    ("create_subscription", {"name": "s", "retention_action": "keep"}, ConfigError),
    ("create_subscription", {"name": "s", "linger_seconds": -0.1}, ArgumentError),
    ("create_subscription", {"name": "s", "linger_seconds": 1.5}, ArgumentError),
    ("create_subscription", {"name": "s", "linger_seconds": math.nan}, ArgumentError),
    ("create_subscription", {"name": "s", "linger_seconds": True}, ArgumentError),
    ("create_subscription", {"name": "s", "linger_seconds": "0.1"}, ArgumentError),
    ("update_subscription", {"name": "s", "linger_seconds": math.inf}, ArgumentError),
    ("update_subscription", {"name": "s", "filter": {"r": []}}, ArgumentError),
    ("update_subscription", {"name": "s", "max_receive_count": 1.5}, ConfigError),
    ("update_subscription", {"name": "s/x", "filter": None}, ConfigError),
    ("delete_subscription", {"name": ".s"}, ConfigError),
    ("subscription", {"name": "a b"}, ConfigError),
    ("subscription_stats", {"name": "a/b"}, ConfigError),
    ("dead_letters", {"subscription": "a/b"}, ConfigError),
    ("redrive", {"subscription": "../s"}, ConfigError),
    ("purge_dead_letters", {"subscription": "_s"}, ConfigError),
]


async def test_invalid_names_filters_and_settings_are_refused_before_any_write(
    config: dict[str, Any],
) -> None:
    loaded = load_config(config)
    store = CountingStore(open_store(loaded))
    async with PawnQueue(loaded, store=store) as pq:
        await pq.create_topic("t")
        await pq.create_subscription("t", "s", filter={"r": "x"})
        before = {m.key: m.etag for m in await pq.store.list("t/")}
        store.reset()
        for method, kwargs, error in BAD_CALLS:
            arguments = {"topic": "t", **kwargs}
            positional = [arguments.pop("topic")]
            if "name" in arguments:  # the subscription's name: positional
                positional.append(arguments.pop("name"))
            with pytest.raises(error):
                await getattr(pq, method)(*positional, **arguments)
            writes = {k: v for k, v in store.reset().items() if k.startswith(("PUT", "DEL"))}
            assert writes == {}, (method, kwargs, writes)
        with pytest.raises(ConfigError):
            await pq.register_consumer("c", ["t"], subscription="a/b")
        assert {m.key: m.etag for m in await pq.store.list("t/")} == before


async def test_delete_topic_removes_its_subscriptions(pq: PawnQueue, other: PawnQueue) -> None:
    """Deleting a topic deletes its subscriptions (queues, messages, dead letters, index);
    a topic created again under the name starts without them, in this PawnQueue too,
    whose producer's cache of the index was warm."""
    await create_all(pq, {"a": None, "b": {"k": "v"}})
    producer = await pq.register_producer("p")
    await producer.publish("t", 1, attributes={"k": "v"})
    consumer = await pq.register_consumer("c", ["t"], subscription="a")
    [message] = await poll_count(consumer, 1)
    await message.nack()
    await pq.delete_topic("t")
    assert await pq.store.list("t/") == []
    with pytest.raises(TopicNotFoundError):
        await pq.list_subscriptions("t")
    with pytest.raises(TopicNotFoundError):
        await other.subscription("t", "a")

    await pq.create_topic("t")
    assert await pq.list_subscriptions("t") == []
    mid = await producer.publish("t", 2)
    assert await ids_in(pq, "t") == [mid]
    assert await pq.store.list(layout.subscriptions_prefix("t")) == []
    [own] = await drain([await pq.register_consumer("own", ["t"])], 1)
    assert own.id == mid and own.subscription is None


@conditional
async def test_concurrent_changes_of_one_topic_s_subscriptions_all_land(
    pq: PawnQueue, other: PawnQueue
) -> None:
    """Creates (and then deletes) of several subscriptions at once, from two PawnQueues:
    each index change is a conditional write, retried on a conflict, so none is lost."""
    names = [f"s{n}" for n in range(6)]
    await asyncio.gather(
        *((pq if n % 2 else other).create_subscription("t", name) for n, name in enumerate(names))
    )
    assert [s.name for s in await pq.list_subscriptions("t")] == names
    producer = await pq.register_producer("p")
    mid = await producer.publish("t", 1)
    for name in names:
        assert await ids_in(pq, queue_of(name)) == [mid]
    await asyncio.gather(
        *((pq if n % 2 else other).delete_subscription("t", name) for n, name in enumerate(names))
    )
    assert await pq.list_subscriptions("t") == []
    assert await pq.store.list(layout.subscriptions_prefix("t")) == []


async def test_a_subscription_created_elsewhere_gets_every_publish_started_after(
    backend: str, pq: PawnQueue, other: PawnQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer of another PawnQueue publishes on and on, its cache of the index warm (no
    subscriptions) when the create starts. Every publish it starts after
    create_subscription returned is in the subscription; each one before is in exactly one
    queue (the topic's or the subscription's). With the shipped cache time on the default
    stores (the others keep the shortened one: the rule does not depend on the store)."""
    if backend in BACKENDS:
        monkeypatch.setattr(
            subscriptions_module, "INDEX_CACHE_SECONDS", SHIPPED_INDEX_CACHE_SECONDS
        )
        monkeypatch.setattr(
            subscriptions_module, "_CHANGE_MARGIN_SECONDS", SHIPPED_CHANGE_MARGIN_SECONDS
        )
    producer = await other.register_producer("p")
    first = await producer.publish("t", "first")  # the cache says: no subscriptions
    created = asyncio.Event()
    before: list[str] = [first]
    after: list[str] = []

    async def publish_on() -> None:
        while len(after) < 5:
            started_after = created.is_set()
            mid = await producer.publish("t", "x")
            (after if started_after else before).append(mid)
            await asyncio.sleep(0.01)  # pace: a publish every 10 ms or so

    publishing = asyncio.create_task(publish_on())
    try:
        await pq.create_subscription("t", "s")
        created.set()
        async with asyncio.timeout(DEADLINE):
            await publishing
    finally:
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
    in_subscription = Counter(await ids_in(pq, queue_of("s")))
    in_topic = Counter(await ids_in(pq, "t"))
    assert first in in_topic
    assert set(after) <= set(in_subscription)
    for mid in before + after:
        assert in_subscription[mid] + in_topic[mid] == 1, mid
    assert not set(after) & set(in_topic)


async def test_a_subscription_deleted_elsewhere_gets_no_publish_started_after(
    pq: PawnQueue, other: PawnQueue
) -> None:
    """The same for a delete: once delete_subscription returned, no publish started in the
    other PawnQueue (whose cache still listed the subscription) writes to it."""
    await create_all(pq, {"s": None, "keep": None})
    producer = await other.register_producer("p")
    await producer.publish("t", "warm")
    deleted = asyncio.Event()
    after: list[str] = []

    async def publish_on() -> None:
        while len(after) < 5:
            started_after = deleted.is_set()
            mid = await producer.publish("t", "x")
            if started_after:
                after.append(mid)
            await asyncio.sleep(0.01)

    publishing = asyncio.create_task(publish_on())
    try:
        await pq.delete_subscription("t", "s")
        deleted.set()
        async with asyncio.timeout(DEADLINE):
            await publishing
    finally:
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
    assert await pq.store.list(f"{queue_of('s')}/") == []
    assert set(after) <= set(await ids_in(pq, queue_of("keep")))
