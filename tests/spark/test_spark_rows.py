"""The rows a Spark read makes of stored objects, without Spark: batch objects decoded on the
fast path give exactly the rows of the envelope path (types, nulls, attributes, timestamps),
unusual bodies fall back to it, and partitions are planned in balanced groups."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import (
    CorruptObject,
    Envelope,
    decode_batch,
    encode_batch,
    parse_time,
)
from pawn_queue.spark.options import SourceOptions
from pawn_queue.spark.reading import ObjectRef, ObjectsPartition, pack, read_partition
from pawn_queue.spark.rows import message_schema, plain_batch
from pawn_queue.store.filesystem import FilesystemStore

TOPIC = "t"
CREATED = "2026-03-01T12:00:00.123456+00:00"
PAYLOADS: list[Any] = [
    {"order_id": 1, "customer": "c01", "item": "widget", "qty": 2},
    [1, 2.5, -0.0, 1e16, 1e-7, 0.1, True, False],
    'text with "quotes", a \\ backslash, a\nnewline, \t tab, \x01 control, é, ✓, 😀',
    None,
    {"nested": {"deep": [None, {"x": None}]}, "empty": {}, "list": []},
    12345678901234567,
    -(2**63),
    "",
    0,
]


def _member_id() -> str:
    return str(uuid.uuid4())


def _envelopes(
    payloads: list[Any], attributes: list[dict[str, str]] | None = None, priority: int = 0
) -> list[Envelope]:
    attributes = attributes or [{} for _ in payloads]
    return [
        Envelope(_member_id(), TOPIC, "producer-1", CREATED, payload, attrs, priority=priority)
        for payload, attrs in zip(payloads, attributes, strict=True)
    ]


def _batch_body(members: list[dict[str, Any]], created_at: str = CREATED, **extra: Any) -> bytes:
    """A batch object written by hand (the standard library: NaN, big integers)."""
    body = {"id": _member_id(), "topic": TOPIC, "producer_id": "producer-1"}
    body.update(created_at=created_at, batch=members, **extra)
    return json.dumps(body, ensure_ascii=False).encode()


def _time(value: str) -> datetime | None:
    try:
        return parse_time(value) if value else None
    except ValueError:
        return None


def _expected(
    data: bytes, key: str, receives: int, skip: frozenset[int] = frozenset()
) -> list[dict[str, Any]]:
    """The rows of a batch object as the envelope path defines them."""
    return [
        {
            "id": e.id,
            "topic": e.topic,
            "key": key,
            "producer_id": e.producer_id,
            "created_at": _time(e.created_at),
            "payload": codec.text(e.payload),
            "attributes": list(e.attributes.items()),
            "receive_count": e.prior_receives + receives,
            "priority": e.priority,
        }
        for index, e in enumerate(decode_batch(data))
        if index not in skip
    ]


def _read(
    tmp_path: Path, bodies: list[bytes], refs: list[ObjectRef] | None = None
) -> tuple[list[str], list[pa.RecordBatch]]:
    """Store ``bodies`` as batch objects of topic t and read them as a stream task would."""
    root = tmp_path / "queue"
    keys = [
        layout.message_key(
            TOPIC, _member_id(), datetime(2026, 3, 1, 12, 0, 0, i, tzinfo=UTC), batch=True
        )
        for i in range(len(bodies))
    ]

    async def write() -> None:
        store = FilesystemStore(root)
        try:
            for key, body in zip(keys, bodies, strict=True):
                await store.put(key, body)
        finally:
            await store.close()

    asyncio.run(write())
    options = SourceOptions(url=f"file://{root}", config_path=None, topics=(TOPIC,))
    refs = refs or [
        ObjectRef(key, len(body), receives=2) for key, body in zip(keys, bodies, strict=True)
    ]
    refs = [
        ObjectRef(key, ref.size, ref.skip, ref.receives)
        for key, ref in zip(keys, refs, strict=True)
    ]
    partition = ObjectsPartition(0, refs, 1)
    return keys, list(read_partition(options, partition, message_schema(), "pending"))


def _rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    schema = to_arrow_schema(message_schema(), timezone="UTC")
    assert all(batch.schema.equals(schema) for batch in batches)
    return [row for batch in batches for row in batch.to_pylist()]


def test_plain_batches_give_the_envelope_rows(tmp_path: Path) -> None:
    attrs = [{"k": "v", "é": "✓"}, {}, {"only": ""}, {}, {"a": "1", "b": "2"}, {}, {}, {}, {}]
    bodies = [
        encode_batch(_member_id(), _envelopes(PAYLOADS)),
        encode_batch(_member_id(), _envelopes(PAYLOADS, attrs)),
        encode_batch(_member_id(), _envelopes([1, 2], priority=7)),
    ]
    assert all(plain_batch(body) is not None for body in bodies)  # the fast path ran
    keys, batches = _read(tmp_path, bodies)
    rows = _rows(batches)
    assert rows == [
        row for key, body in zip(keys, bodies, strict=True) for row in _expected(body, key, 2)
    ]
    assert [r["priority"] for r in rows] == [0] * 18 + [7, 7]
    assert rows[2]["payload"] == codec.text(PAYLOADS[2]) and rows[3]["payload"] == "null"
    assert rows[9 + 0]["attributes"] == [("k", "v"), ("é", "✓")]
    assert rows[0]["created_at"] == datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def test_what_orjson_cannot_write_alone_is_written_as_before(tmp_path: Path) -> None:
    """NaN, infinities and integers beyond 64 bits (read by the standard library) and a body
    over 1 MiB with a large string: the payload texts are codec.text's."""
    odd = [float("nan"), {"x": float("inf")}, [float("-inf"), None], 2**70, {"big": -(2**65)}]
    bodies = [
        _batch_body([{"id": _member_id(), "payload": p} for p in odd]),
        _batch_body(
            [{"id": _member_id(), "payload": {"n": None}}, {"id": _member_id(), "payload": 1e999}]
        ),
        _batch_body(
            [
                {"id": _member_id(), "payload": "x" * (1 << 20) + "é"},
                {"id": _member_id(), "payload": 1},
            ]
        ),
    ]
    keys, batches = _read(tmp_path, bodies)
    rows = _rows(batches)
    assert rows == [
        row for key, body in zip(keys, bodies, strict=True) for row in _expected(body, key, 2)
    ]
    assert [r["payload"] for r in rows[:4]] == [
        "NaN",
        '{"x":Infinity}',
        "[-Infinity,null]",
        str(2**70),
    ]
    assert rows[6]["payload"] == "Infinity"


def test_unusual_members_and_times_take_the_envelope_path(tmp_path: Path) -> None:
    member = {"id": _member_id(), "payload": {"n": 1}}
    moved = {"id": _member_id(), "payload": 2, "prior_receives": 3, "producer_id": "other"}
    bodies = [
        _batch_body([member, moved]),  # a requeued member: its receives, its producer
        _batch_body([member], created_at="2026-03-01T14:00:00+02:00"),
        _batch_body([member], created_at="2026-03-01T12:00:00"),  # naive: UTC
        _batch_body([member], created_at="yesterday"),
        _batch_body([{**member, "attributes": None}]),
        *(_batch_body([member], priority=p) for p in ("9", True, 10)),  # garbled: 0
    ]
    assert plain_batch(bodies[0]) is None and plain_batch(bodies[-1]) is None
    keys, batches = _read(tmp_path, bodies)
    rows = _rows(batches)
    assert rows == [
        row for key, body in zip(keys, bodies, strict=True) for row in _expected(body, key, 2)
    ]
    assert [r["receive_count"] for r in rows[:2]] == [2, 5] and rows[1]["producer_id"] == "other"
    noon = datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert [r["created_at"] for r in rows[2:5]] == [noon, noon, None]
    assert all(r["created_at"] is None or r["created_at"].tzinfo is not None for r in rows)
    assert rows[5]["attributes"] == []
    assert [r["priority"] for r in rows[6:]] == [0, 0, 0]


def test_settled_members_are_skipped(tmp_path: Path) -> None:
    bodies = [encode_batch(_member_id(), _envelopes(PAYLOADS))] * 2
    refs = [ObjectRef("", 0, skip=(0, 3, 8), receives=4), ObjectRef("", 0, skip=(), receives=1)]
    keys, batches = _read(tmp_path, bodies, refs)
    rows = _rows(batches)
    expected = _expected(bodies[0], keys[0], 4, frozenset((0, 3, 8))) + _expected(
        bodies[1], keys[1], 1
    )
    assert rows == expected and len(rows) == 9 - 3 + 9


@pytest.mark.parametrize(
    "members",
    [
        [{"id": "a", "payload": 1}, "not an object"],
        [{"id": "a", "payload": 1}, {"id": "b"}],  # no payload
        [{"id": "a", "payload": 1, "attributes": {"k": 1}}],  # a value that is not text
        [{"id": 7, "payload": 1}],  # an id that is not text
    ],
)
def test_corrupt_batch_objects_are_skipped_as_before(tmp_path: Path, members: list[Any]) -> None:
    corrupt = _batch_body(members)
    with pytest.raises(CorruptObject):
        decode_batch(corrupt)
    assert plain_batch(corrupt) is None
    good = encode_batch(_member_id(), _envelopes([1, 2]))
    keys, batches = _read(tmp_path, [good, corrupt, good])
    rows = _rows(batches)
    assert rows == _expected(good, keys[0], 2) + _expected(good, keys[2], 2)


def test_many_objects_keep_their_order(tmp_path: Path) -> None:
    """More objects than are fetched at once, in record batches of at most 8,192 rows."""
    bodies = [encode_batch(_member_id(), _envelopes([i] * 100)) for i in range(150)]
    keys, batches = _read(tmp_path, bodies)
    rows = _rows(batches)
    assert [r["key"] for r in rows] == [key for key in keys for _ in range(100)]
    assert [json.loads(r["payload"]) for r in rows[::100]] == list(range(150))
    # A record batch ends after the object that took it to 8,192 rows.
    assert [batch.num_rows for batch in batches] == [8200, 6800]


def test_pack_balances_groups() -> None:
    refs = [ObjectRef(f"k{i}", 1000 + i % 7) for i in range(200)]
    total = sum(ref.size for ref in refs)
    groups = pack(refs, total // 4, 1000)
    assert [ref for group in groups for ref in group] == refs
    assert len(groups) == 4 and all(48 <= len(group) <= 52 for group in groups)
    assert [len(g) for g in pack(refs, 1 << 30, 64)] == [50, 50, 50, 50]
    assert [len(g) for g in pack(refs[:10], 1 << 30, 1000)] == [10]
    one_large = [ObjectRef("big", 10 << 20), *refs[:3]]
    assert [len(g) for g in pack(one_large, 1 << 20, 1000)] == [1, 3]
    assert pack([], 100, 10) == []
