"""The JSON codec gives the standard library's answers: the same values accepted, refused and
decoded, with the same error classes, whichever of its paths (orjson or the standard library)
runs."""

from __future__ import annotations

import enum
import json
import math
import random
import uuid
from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from pawn_queue import PayloadError
from pawn_queue._protocol import codec
from pawn_queue._protocol.envelope import (
    CorruptObject,
    Envelope,
    LeaseBody,
    decode_batch,
    encode_batch,
)


def stdlib_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def outcome(call: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", call(*args)
    except (ValueError, TypeError, RecursionError) as exc:
        return "error", type(exc)


class Color(enum.IntEnum):
    RED = 1


class Name(enum.StrEnum):
    ADA = "ada"


@dataclass
class Point:
    x: int


Pair = namedtuple("Pair", "a b")


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def circular() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**40,
    {"big": [2**64, -(2**70)], "ok": 1},
    0.1,
    -0.0,
    1e16,
    1e-5,
    5e-324,
    1.7976931348623157e308,
    math.nan,
    math.inf,
    -math.inf,
    {"x": [1.0, math.nan]},
    {"x": None, "y": math.inf},
    {"x": None, "y": 1.5},
    "",
    "naïve café 注文 \U0001f600",
    "\x00\x1f\x7f\u2028\u2029</script>",
    "a\udc80",  # a lone surrogate: not UTF-8
    {"k": "a\ud800"},
    {1: "int key"},
    {1.5: "float key", None: "none key", True: "bool key"},
    {(1, 2): "tuple key"},
    {"a": 1, "b": 2, "c": {"z": 0, "a": 1}},  # key order kept
    (1, 2, 3),
    [(), [], {}],
    Pair(1, 2),
    OrderedDict(b=1, a=2),
    defaultdict(int, a=1),
    Color.RED,
    Name.ADA,
    {Name.ADA: 1},
    {1, 2},
    frozenset(),
    b"bytes",
    bytearray(b"x"),
    datetime.now(UTC),
    {"when": datetime.now(UTC)},
    Point(1),
    Decimal("1.5"),
    1j,
    object(),
    nested(200),
    nested(300),  # deeper than orjson writes: the standard library does
    nested(100_000),
    circular(),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_dumps_accepts_and_refuses_what_the_standard_library_does(value: Any) -> None:
    ours, theirs = outcome(codec.dumps, value), outcome(stdlib_dumps, value)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "ok":
        assert json.loads(ours[1]) == json.loads(theirs[1])
        assert list(_keys(json.loads(ours[1]))) == list(_keys(json.loads(theirs[1])))
    else:
        assert ours[1] is theirs[1]


def test_payload_errors_stay_payload_errors() -> None:
    """What the producer refuses today it refuses with the same error."""
    from pawn_queue._protocol.envelope import encode_json

    for bad in (math.nan, {"x": [math.inf]}, {"x": None, "y": -math.inf}, {1, 2}, nested(100_000)):
        with pytest.raises(PayloadError):
            encode_json(bad)
    assert encode_json({"n": 2**100}) == b'{"n":1267650600228229401496703205376}'


def test_uuids_and_enums_are_written_as_text_and_value_on_every_path() -> None:
    """orjson knows UUIDs and enum members; the standard library path writes them the same,
    so whether one is accepted never depends on what else the value holds."""

    class Plain(enum.Enum):
        A = "a"

    key = uuid.UUID(int=5)
    assert codec.dumps({"id": key, "e": Plain.A}) == f'{{"id":"{key}","e":"a"}}'.encode()
    assert json.loads(codec.dumps({"id": key, "e": Plain.A, "n": None})) == {
        "id": str(key),
        "e": "a",
        "n": None,
    }
    assert json.loads(codec.dumps([key, 2**70])) == [str(key), 2**70]


def _keys(value: Any) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


DOCUMENTS: list[bytes] = [
    b"{}",
    b"[]",
    b"0",
    b"-0",
    b"-0.0",
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"NaN",
    b"[NaN, Infinity, -Infinity]",
    b"18446744073709551615",  # 2**64 - 1: orjson reads it
    b"18446744073709551616",  # 2**64: orjson would read a float
    b"-9223372036854775809",
    b"[18446744073709551616]",
    b"[\r\n\t 18446744073709551616,-18446744073709551616]",
    b'{"k":"orders/18446744073709551616","n":18446744073709551616}',
    b'{"k":"orders/18446744073709551616"}',  # digits in a string: orjson reads it right
    b'{"n": 123456789012345678901234567890}',
    b'{"s": "1234567890123456789012"}',  # a long digit run in a string: still exact
    b"0.12345678901234567890123",
    b'"\\ud800"',
    b'"\\ud83d\\ude00"',
    b'"\\u00e9"',
    '"é"'.encode(),
    b'"\xed\xa0\x80"',  # an encoded surrogate
    b'"\xff"',  # not UTF-8
    b"\xef\xbb\xbf{}",  # a byte order mark
    '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32-le"),
    b'{"a": 1, "b": 2, "a": 3}',
    b'{"a":1,}',
    b"[1,]",
    b'"\x01"',
    b"  [1 , 2 ]\n\t\r ",
    b"[1] [2]",
    b"",
    b" ",
    b"{'a': 1}",
    b"\x00",
    b"[" * 300 + b"]" * 300,
    b"[" * 1100 + b"]" * 1100,
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": tru}',
    b"true false",
]


def same_value(a: Any, b: Any) -> bool:
    """Equal, NaN included, with the same types (1 is not 1.0) and the same key order."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: repr(d[:30]))
def test_loads_reads_what_the_standard_library_reads(document: bytes) -> None:
    ours, theirs = outcome(codec.loads, document), outcome(json.loads, document)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "ok":
        assert same_value(ours[1], theirs[1]), (ours, theirs)
    else:
        assert ours[1] is theirs[1]


def test_loads_of_text_reads_what_the_standard_library_reads() -> None:
    for document in ("[1, 2.5]", '"\\ud800"', "\ud800", "NaN", "1" * 30, '{"é": 1}', "[1,]"):
        ours, theirs = outcome(codec.loads, document), outcome(json.loads, document)
        assert ours[0] == theirs[0] and same_value(ours[1], theirs[1]), (document, ours, theirs)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([rng.randrange(-(10**6), 10**6), rng.randrange(-(2**80), 2**80)])
    if kind == 2:
        return rng.choice([rng.uniform(-1e6, 1e6), rng.random() * 10 ** rng.randrange(-300, 300)])
    if kind in (3, 4, 5):
        alphabet = 'ab"\\/\n\t\x00\x7fé注\U0001f600\u2028 0123456789'
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(25)))
    if kind in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {f"k{rng.randrange(9)}": random_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_random_values_round_trip_as_with_the_standard_library() -> None:
    rng = random.Random(19)
    for _ in range(3000):
        value = random_value(rng)
        data = codec.dumps(value)
        assert same_value(codec.loads(data), json.loads(stdlib_dumps(value)))
        assert same_value(json.loads(data), codec.loads(stdlib_dumps(value)))


def test_text_keeps_nan_and_infinity_as_the_spark_column_showed_them() -> None:
    assert codec.text({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    assert codec.text([math.nan, math.inf, None]) == "[NaN,Infinity,null]"
    assert codec.text(2**70) == str(2**70)


def test_envelopes_batches_and_leases_keep_their_bytes() -> None:
    """The bodies written are the same bytes the standard library wrote (0.1.x reads them)."""
    envelope = Envelope(
        id=str(uuid.UUID(int=1)),
        topic="orders",
        producer_id=str(uuid.UUID(int=2)),
        created_at="2025-01-01T00:00:00+00:00",
        payload={"n": 1, "s": "naïve", "f": 0.5, "l": [True, False], "big": 2**70},
        attributes={"k": "v"},
    )
    assert envelope.encode() == stdlib_dumps(envelope.to_dict())
    assert Envelope.decode(envelope.encode()) == envelope
    batch = encode_batch(str(uuid.UUID(int=3)), [envelope, envelope])
    assert json.loads(batch) == json.loads(stdlib_dumps(json.loads(batch)))
    assert decode_batch(batch) == [envelope, envelope]
    lease = LeaseBody("c", "m", "2025-01-01T00:00:00+00:00", "2025-01-01T00:00:30+00:00", "n")
    assert lease.encode() == stdlib_dumps(json.loads(lease.encode()))
    assert LeaseBody.decode(lease.encode()) == lease
    with pytest.raises(CorruptObject, match="not valid JSON"):
        Envelope.decode(b'{"id": "\xff"}')
