"""Malformed and foreign objects planted in the bucket, on every store: a corrupt message is
quarantined with its reason and blocks nothing, foreign keys are ignored at no extra cost,
corrupt leases and metadata are recovered from, and no consumer crashes."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import CorruptObject, decode_batch, now_utc
from pawn_queue.config import load_config
from pawn_queue.consumer import Consumer
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from tests.helpers.support import keys_under

DEEP = b"[" * 100_000 + b"]" * 100_000


def body(message_id: str, topic: str = "t", **extra: Any) -> bytes:
    fields = {"id": message_id, "topic": topic, "producer_id": "p", "created_at": "c"}
    return json.dumps({**fields, "payload": {"planted": True}, **extra}).encode()


def batch_body(batch_id: str, member_ids: list[str]) -> bytes:
    members = [{"id": i, "payload": n} for n, i in enumerate(member_ids)]
    shared = {"topic": "t", "producer_id": "p", "created_at": "c"}
    return json.dumps({"id": batch_id, **shared, "batch": members}).encode()


def corrupt_objects() -> list[tuple[str, str, bytes]]:
    """(kind, suffix, body) of objects under messages/ that are not valid messages."""
    other = str(uuid.uuid4())
    return [
        ("not-json", ".json", b"{not json"),
        ("zero-bytes", ".json", b""),
        ("json-list", ".json", b"[1, 2]"),
        ("json-string", ".json", b'"text"'),
        ("missing-fields", ".json", b'{"payload": 1}'),
        ("wrong-types", ".json", json.dumps({"id": 5, "topic": [], "payload": 1}).encode()),
        ("bad-attributes", ".json", b"ID"),  # filled in with its own id below
        ("id-not-the-key", ".json", body(other, "other-topic")),
        ("deep-nesting", ".json", DEEP),
        ("binary-no-header", ".json", b'PQB1\n{"id": "x"'),
        ("garbage", ".json", os.urandom(1_000_000)),
        ("batch-corrupt", ".batch", b"{broken"),
        ("batch-empty", ".batch", b'{"id": "b", "batch": []}'),
        ("batch-member-id", ".batch", batch_body("b", ["../../x", str(uuid.uuid4())])),
        ("batch-repeated-id", ".batch", batch_body("b", [other, other])),
        ("group-corrupt", f".{layout.group_hash('g')}.group", b"\x00\x01"),
    ]


def foreign_keys(topic: str) -> list[str]:
    """Keys under messages/ that do not follow the layout: never claimed, never read."""
    return [
        f"{topic}/messages/README.txt",
        f"{topic}/messages/notes.json",
        f"{topic}/messages/20000101T000000_000000-not-a-uuid.json",
        f"{topic}/messages/20000101T000000_000000-{str(uuid.uuid4()).upper()}.json",
        f"{topic}/messages/20000101T000000_000000-{uuid.uuid4()}.lease",
        f"{topic}/messages/20000101T000000_000000-{uuid.uuid4()}.nothex.group",
        f"{topic}/messages/sub/20000101T000000_000000-{uuid.uuid4()}.json",  # one level too deep
    ]


def stamped(object_id: str, suffix: str) -> str:
    """A file name in the layout's form, due now."""
    return f"{now_utc().strftime('%Y%m%dT%H%M%S_%f')}-{object_id}{suffix}"


def planted_key(topic: str, object_id: str, suffix: str) -> str:
    return f"{topic}/messages/{stamped(object_id, suffix)}"


@pytest.fixture
async def counted(queue_config: dict[str, Any]) -> AsyncIterator[tuple[PawnQueue, CountingStore]]:
    config = load_config(queue_config)
    store = CountingStore(open_store(config))
    async with PawnQueue(config, store=store) as pq:
        yield pq, store


async def drain(consumer: Consumer, count: int) -> list[str]:
    """Poll and ack until ``count`` messages came (bounded); their ids in order."""
    got: list[str] = []
    async with asyncio.timeout(60):
        while len(got) < count:
            for message in await consumer.poll(wait=1):
                got.append(message.id)
                await message.ack()
    return got


async def test_corrupt_messages_are_quarantined_around_good_ones(
    counted: tuple[PawnQueue, CountingStore],
) -> None:
    pq, store = counted
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    good, planted = [], {}
    for kind, suffix, data in corrupt_objects():
        good.append(await producer.publish("t", {"before": kind}))
        object_id = str(uuid.uuid4())
        if kind == "bad-attributes":
            data = body(object_id, attributes=["not", "a", "map"])
        await pq.store.put(planted_key("t", object_id, suffix), data)
        planted[object_id] = kind
    foreign = foreign_keys("t")
    for key in foreign:
        await pq.store.put(key, b"{}")
    good.append(await producer.publish("t", {"last": True}))

    consumer = await pq.register_consumer("c", topics=["t"])
    assert await drain(consumer, len(good)) == good  # FIFO, nothing blocked, nothing extra

    letters = {d.id: d for d in await pq.dead_letters("t")}
    assert set(letters) == set(planted), {planted.get(i, i) for i in set(letters) ^ set(planted)}
    for object_id, letter in letters.items():
        assert letter.reason == "corrupt" and not letter.redrivable, planted[object_id]
        assert letter.error and len(letter.error) < 300, (planted[object_id], letter.error)
        assert letter.topic == "t"
    assert await pq.redrive("t") == 0  # a quarantined object is not a message to publish
    assert len(await pq.dead_letters("t")) == len(planted)
    assert sorted(m.key for m in await pq.store.list("t/messages/")) == sorted(foreign)
    assert await keys_under(pq, "t/leases/") == []

    # Foreign keys cost nothing on later polls: no read, no claim (and no LIST while nothing
    # changed: the last listing showed nothing to claim).
    store.reset()
    for _ in range(5):
        assert await consumer.poll() == []
    requests = store.reset()
    assert set(requests) <= {"LIST", "HEAD"} and requests["LIST"] <= 5, requests


async def test_listen_keeps_running_through_corrupt_objects(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    handled: list[str] = []
    changed = asyncio.Condition()

    async def handler(message: Message) -> None:
        await message.ack()
        async with changed:
            handled.append(message.id)
            changed.notify_all()

    async def plant_and_publish(kinds: list[tuple[str, str, bytes]]) -> set[str]:
        ids = set()
        for kind, suffix, data in kinds:
            await pq.store.put(planted_key("t", str(uuid.uuid4()), suffix), data)
            ids.add(await producer.publish("t", {"after": kind}))
        return ids

    async def until_handled(wanted: set[str]) -> None:
        async with asyncio.timeout(60), changed:
            await changed.wait_for(lambda: wanted <= set(handled))
        assert not task.done()

    first = await plant_and_publish(corrupt_objects()[:4])
    task = asyncio.create_task(consumer.listen(handler))
    try:
        await until_handled(first)
        await until_handled(await plant_and_publish(corrupt_objects()[4:8]))  # while it runs
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(handled) == len(set(handled)) == 8
    assert {d.reason for d in await pq.dead_letters("t")} == {"corrupt"}
    assert len(await pq.dead_letters("t")) == 8


async def test_a_body_naming_another_topic_stays_in_its_topic(pq: PawnQueue) -> None:
    """Where a message lies decides its topic: its dead letter cannot land elsewhere."""
    for topic in ("t", "other"):
        await pq.create_topic(topic)
    message_id = str(uuid.uuid4())
    await pq.store.put(planted_key("t", message_id, ".json"), body(message_id, "other"))
    consumer = await pq.register_consumer("c", topics=["t"])
    [message] = await consumer.poll(wait=10)
    assert (message.id, message.topic) == (message_id, "t")
    await message.nack()
    assert [d.id for d in await pq.dead_letters("t")] == [message_id]
    assert await pq.dead_letters("other") == []


# Lease bodies that are not valid leases: each counts as expiring when it was written.
CORRUPT_LEASES = [
    b"{bad",
    b"",
    b"[]",
    b'{"expires_at": 5}',
    b'{"consumer_id": "x", "message_id": "y", "expires_at": "not a time"}',
    b'{"consumer_id": "x", "message_id": "y", "expires_at": "2000-01-01T00:00:00+00:00", '
    b'"settled": 5, "receive_count": "many"}',
    b'{"consumer_id": "x", "message_id": "y", "expires_at": "9999-12-31T23:59:59.999999+00:00"}',
    DEEP,
]


async def test_corrupt_leases_delay_but_never_lose_a_message(pq: PawnQueue) -> None:
    await pq.create_topic("t", claims="message")
    producer = await pq.register_producer("p")
    ids = [await producer.publish("t", {"n": n}) for n in range(len(CORRUPT_LEASES))]
    for message_id, data in zip(ids, CORRUPT_LEASES, strict=True):
        await pq.store.put(layout.lease_key("t", message_id), data)
    consumer = await pq.register_consumer("c", topics=["t"])
    assert sorted(await drain(consumer, len(ids))) == sorted(ids)
    assert await keys_under(pq, "t/leases/") == []
    assert await pq.store.list("t/messages/") == []
    assert await pq.dead_letters("t") == []


TOPIC_MARKERS = [
    b"",
    b"{bad",
    b"[1]",
    b'{"settings": [1]}',
    b'{"settings": {"max_pending": -1, "retention_seconds": "soon"}}',
    DEEP,
]


async def test_corrupt_topic_marker_falls_back_to_defaults_and_is_repaired(
    queue_config: dict[str, Any],
) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t", max_receive_count=3)
    for marker in TOPIC_MARKERS:
        async with await PawnQueue.from_config(queue_config) as pq:  # nothing cached
            await pq.store.put("t/.topic", marker)
            assert await pq.list_topics() == ["t"]
            message_id = await (await pq.register_producer("p")).publish("t", {"ok": 1})
            consumer = await pq.register_consumer("c", topics=["t"])
            assert await drain(consumer, 1) == [message_id]
            assert (await pq.topic_stats("t")).pending == 0
            await pq.create_topic("t", max_receive_count=3)  # rewrites the unreadable marker
            stored = json.loads((await pq.store.get("t/.topic")).data)
            assert stored["topic"] == "t" and stored["settings"]["max_receive_count"] == 3


async def test_corrupt_registry_objects(queue_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        first = await pq.register_producer("p")
        await pq.store.put("_registry/producers/garbage.json", b"\xff\xfe")
        await pq.store.put("_registry/producers/notes.txt", b"not an entry")
        await pq.store.put(f"_registry/producers/{uuid.uuid4()}.json", DEEP)
    for index in (b"", b"{bad", b"[]", b'{"entity_id": "../../x"}', DEEP):
        async with await PawnQueue.from_config(queue_config) as pq:
            await pq.store.put(layout.registry_name_key("producers", "p"), index)
            again = await pq.register_producer("p")
            assert again.id == first.id  # found again from its registry entry
            index_key = layout.registry_name_key("producers", "p")
            assert json.loads((await pq.store.get(index_key)).data)["entity_id"] == first.id
            assert [(e.name, e.entity_id) for e in await pq.registry.list("producers")] == [
                ("p", first.id)
            ]
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.store.put(layout.registry_key("producers", first.id), b"{bad")
        assert await pq.registry.list("producers") == []
        assert (await pq.register_producer("p")).id == first.id  # rewrites the entry
        assert [e.entity_id for e in await pq.registry.list("producers")] == [first.id]


async def test_corrupt_dead_letters_are_shown_not_redriven(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    garbage, bad_id = str(uuid.uuid4()), str(uuid.uuid4())
    await pq.store.put(layout.dead_letter_key("t", garbage), b"\x00garbage")
    await pq.store.put(layout.dead_letter_key("t", bad_id), body("../../etc/x"))
    letters = {d.key: d for d in await pq.dead_letters("t")}
    assert {d.reason for d in letters.values()} == {"corrupt"}
    assert len(letters) == 2
    assert await pq.redrive("t") == 0
    assert await pq.redrive("t", ids=[garbage, bad_id, "../../etc/x"]) == 0
    assert await pq.store.list("t/messages/") == []
    assert await pq.purge_dead_letters("t") == 2
    assert await pq.dead_letters("t") == []


async def test_planted_non_files_on_a_local_directory(tmp_path: Path) -> None:
    """A directory, a symlink out of the root and a FIFO where message files belong."""
    root = tmp_path / "queue"
    outside = tmp_path / "outside.json"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        first = await producer.publish("t", {"n": 1})
        linked_id, dir_id, fifo_id = (str(uuid.uuid4()) for _ in range(3))
        outside.write_bytes(body(linked_id))
        messages = root / "t" / "messages"
        directory = messages / stamped(dir_id, ".json")
        directory.mkdir()
        (directory / "inner.json").write_bytes(body(dir_id))
        (messages / stamped(linked_id, ".json")).symlink_to(outside)
        os.mkfifo(messages / stamped(fifo_id, ".json"))
        last = await producer.publish("t", {"n": 2})
        consumer = await pq.register_consumer("c", topics=["t"])
        assert await drain(consumer, 2) == [first, last]
        assert await consumer.poll() == []
        assert await pq.dead_letters("t") == []
        assert outside.read_bytes() == body(linked_id), "a file outside the root was touched"
        assert len(list(messages.iterdir())) == 3  # the planted entries stay, ignored


async def test_queue_operations_stay_inside_the_root(tmp_path: Path) -> None:
    """Purging dead letters and deleting a topic delete nothing behind a planted link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = [outside / f"{n:08d}-0000-4000-8000-000000000000.json" for n in range(3)]
    for victim in victims:
        victim.write_bytes(b"precious")
    root = tmp_path / "queue"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        await pq.create_topic("t")
        (root / "t" / "dead-letter").symlink_to(outside)
        (root / "t" / "messages").mkdir(parents=True, exist_ok=True)
        (root / "t" / "leases").symlink_to(outside)
        assert await pq.dead_letters("t") == []
        assert await pq.purge_dead_letters("t") == 0
        assert (await pq.topic_stats("t")).dead_letter == 0
        await pq.delete_topic("t")
    assert all(v.read_bytes() == b"precious" for v in victims)


@pytest.mark.parametrize(
    ("member", "problem"),
    [
        ({"id": "m"}, "no field 'payload'"),
        ({"id": "m", "payload": 1, "attributes": {"a": 1}}, "invalid 'attributes'"),
        ({"id": "m", "payload": 1, "attributes": "a"}, "invalid 'attributes'"),
        ({"id": 5, "payload": 1}, "no string field 'id'"),
        ({"payload": 1}, "no string field 'id'"),
        (["m", 1], "not a JSON object"),
    ],
)
def test_batch_member_problems_are_named(member: Any, problem: str) -> None:
    data = json.dumps(
        {"id": "b", "topic": "t", "producer_id": "p", "created_at": "c", "batch": [member]}
    ).encode()
    with pytest.raises(CorruptObject, match=problem):
        decode_batch(data)


def test_batch_member_fields_override_the_shared_ones() -> None:
    members = [
        {"id": "a", "payload": 1, "attributes": []},
        {"id": "b", "payload": 2, "attributes": {"k": "v"}, "group": "g", "producer_id": "q"},
    ]
    shared = {"topic": "t", "producer_id": "p", "created_at": "c"}
    a, b = decode_batch(json.dumps({"id": "x", **shared, "batch": members}).encode())
    assert (a.id, a.producer_id, a.payload, a.attributes, a.group) == ("a", "p", 1, {}, None)
    assert (b.id, b.producer_id, b.payload, b.attributes, b.group) == ("b", "q", 2, {"k": "v"}, "g")
