"""The rows a pawnqueue read produces: the schema, and messages as Arrow record batches.

Readers yield ``pyarrow.RecordBatch`` es (not tuples): Spark takes them as they are, which
is several times faster than converting rows one by one. Batch objects whose members are
plain (``id``, ``payload``, ``attributes``: what producers write) are decoded once into
columns without building an envelope per member (:func:`plain_batch`); anything else takes
the envelope path, which gives the same values and raises the same errors.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import BINARY_MAGIC, DeadLetterInfo, Envelope, parse_time

ROWS_PER_RECORD_BATCH = 8192

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_PLAIN_MEMBER = frozenset(("id", "payload", "attributes"))
# A body no longer than this holds no string over 1 MiB characters, the size above which
# codec.text writes with the standard library (orjson's working memory).
_SMALL_BODY = 1 << 20


def _message_fields() -> list[StructField]:
    return [
        StructField("id", StringType()),
        StructField("topic", StringType()),
        StructField("key", StringType()),
        StructField("producer_id", StringType()),
        StructField("created_at", TimestampType()),
        StructField("payload", StringType()),
        StructField("attributes", MapType(StringType(), StringType())),
        StructField("receive_count", IntegerType()),
    ]


# Last in both schemas (added after the others): every earlier column keeps its position.
_PRIORITY = StructField("priority", IntegerType())


def message_schema() -> StructType:
    """``id, topic, key, producer_id, created_at, payload, attributes, receive_count,
    priority``."""
    return StructType([*_message_fields(), _PRIORITY])


def dead_letter_schema() -> StructType:
    """The message columns, then ``reason, error, dead_lettered_at``, then ``priority``."""
    return StructType(
        [
            *_message_fields(),
            StructField("reason", StringType()),
            StructField("error", StringType()),
            StructField("dead_lettered_at", TimestampType()),
            _PRIORITY,
        ]
    )


def payload_json(payload: Any) -> str:
    """A payload as compact JSON text (what the ``payload`` column holds)."""
    return codec.text(payload)


def _payload_texts(payloads: Sequence[Any], small: bool) -> list[str]:
    """:func:`payload_json` of each payload decoded from a body (``small``: of at most
    1 MiB), calling orjson directly where that gives codec.text's answer."""
    if small:
        try:
            # Decoded at once: a list of orjson's bytes costs five times more to build.
            texts = [orjson.dumps(p).decode() for p in payloads]
        except TypeError:  # e.g. an integer beyond 64 bits, read by the standard library
            pass
        else:
            if "null" not in "\n".join(texts):
                return texts
            # "null" may stand for a NaN or an infinity: codec.text decides those.
            return [
                codec.text(p) if "null" in t else t for p, t in zip(payloads, texts, strict=True)
            ]
    return [codec.text(p) for p in payloads]


@dataclass(frozen=True, slots=True)
class PlainBatch:
    """The members of a batch object whose members are all plain, as decoded: the shared
    fields, and per member its id, payload text and attributes."""

    topic: str
    producer_id: str
    created_at: str
    priority: int
    ids: list[str]
    payloads: list[str]
    attributes: list[Sequence[tuple[str, str]]]


def plain_batch(data: bytes, skip: Collection[int] = ()) -> PlainBatch | None:
    """A batch object's members but those at the indexes in ``skip``, decoded once, when the
    body and every member are what producers write; None when the envelope path must decide
    (anything else, errors included)."""
    if data.startswith(BINARY_MAGIC):
        return None
    try:
        obj = codec.loads(data)
    except (ValueError, RecursionError):
        return None
    if type(obj) is not dict:
        return None
    members = obj.get("batch")
    topic, producer_id, created_at = obj.get("topic"), obj.get("producer_id"), obj.get("created_at")
    priority = obj.get("priority", 0)
    if (
        type(members) is not list
        or not members
        or type(topic) is not str
        or type(producer_id) is not str
        or type(created_at) is not str
        or type(priority) is not int
        or not 0 <= priority <= 9  # anything else: the envelope path decides (0)
    ):
        return None
    # Whole-list operations rather than a loop over members: this runs for every row.
    try:
        ids = [m["id"] for m in members]  # only a JSON object has fields
        payloads = [m["payload"] for m in members]
    except (KeyError, TypeError):
        return None
    fields = set().union(*members)
    if not fields <= _PLAIN_MEMBER or set(map(type, ids)) != {str}:
        return None
    attributes: list[Sequence[tuple[str, str]]]
    if "attributes" in fields:
        attributes = []
        for member in members:
            given = member.get("attributes") or {}
            if type(given) is not dict or not all(
                type(k) is str and type(v) is str for k, v in given.items()
            ):
                return None
            attributes.append(list(given.items()))
    else:
        attributes = [()] * len(members)
    if skip:
        skipped = set(skip)
        kept = [i for i in range(len(members)) if i not in skipped]
        ids = [ids[i] for i in kept]
        payloads = [payloads[i] for i in kept]
        attributes = [attributes[i] for i in kept]
    texts = _payload_texts(payloads, len(data) <= _SMALL_BODY)
    return PlainBatch(topic, producer_id, created_at, priority, ids, texts, attributes)


def _topic(named: str) -> str:
    """The topic column: the topic a message was published to, also for a message read
    from a subscription (a dead letter or redriven message there names the subscription's
    queue, ``{topic}/subscriptions/{name}``)."""
    return layout.split_queue(named)[0] if "/" in named else named


class RowBuffer:
    """Columns of rows on their way into Arrow record batches of ``schema``."""

    def __init__(self, schema: StructType) -> None:
        self._arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._dead_letters = len(schema.fields) > len(message_schema().fields)
        self._columns: list[list[Any]] = [[] for _ in schema.fields]
        self._times: dict[str, int | None] = {}

    def __len__(self) -> int:
        return len(self._columns[0])

    def add(
        self,
        envelopes: Sequence[Envelope],
        key: str,
        receives: int,
        dead_letter: DeadLetterInfo | None = None,
    ) -> None:
        """Rows for ``envelopes`` of the object at ``key``, delivered ``receives`` times (plus
        the receives before each was moved)."""
        c = self._columns
        c[0] += [e.id for e in envelopes]
        c[1] += [_topic(e.topic) for e in envelopes]
        c[2] += [key] * len(envelopes)
        c[3] += [e.producer_id for e in envelopes]
        c[4] += [self._time(e.created_at) for e in envelopes]
        c[5] += [codec.text(e.payload) for e in envelopes]
        c[6] += [list(e.attributes.items()) for e in envelopes]
        c[7] += [e.prior_receives + receives for e in envelopes]
        if self._dead_letters:
            info = dead_letter or DeadLetterInfo("", None, "", "")
            c[8] += [info.reason or None] * len(envelopes)
            c[9] += [info.error] * len(envelopes)
            c[10] += [self._time(info.dead_lettered_at)] * len(envelopes)
        c[-1] += [e.priority for e in envelopes]

    def add_plain(self, batch: PlainBatch, key: str, receives: int) -> None:
        """Rows for the members of a plain batch object at ``key`` (the same rows :meth:`add`
        makes of its envelopes), delivered ``receives`` times."""
        if self._dead_letters:
            raise ValueError("a plain batch object is a pending object, not a dead letter")
        n = len(batch.ids)
        c = self._columns
        c[0] += batch.ids
        c[1] += [_topic(batch.topic)] * n
        c[2] += [key] * n
        c[3] += [batch.producer_id] * n
        c[4] += [self._time(batch.created_at)] * n
        c[5] += batch.payloads
        c[6] += batch.attributes
        c[7] += [receives] * n
        c[-1] += [batch.priority] * n

    def take(self) -> pa.RecordBatch:
        """The buffered rows as one record batch; the buffer starts over."""
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(self._columns, self._arrow_schema, strict=True)
        ]
        self._columns = [[] for _ in self._columns]
        return pa.RecordBatch.from_arrays(arrays, schema=self._arrow_schema)

    def batches(self, full: bool = False) -> Iterator[pa.RecordBatch]:
        """A record batch when enough rows are buffered (or any rows at all, with ``full``)."""
        if len(self) >= ROWS_PER_RECORD_BATCH or (full and len(self)):
            yield self.take()

    def _time(self, value: str) -> int | None:
        """An ISO time as microseconds since the epoch (what Arrow stores; converting
        integers costs a tenth of converting datetimes), None when empty or invalid."""
        if value not in self._times:
            if len(self._times) > 1024:
                self._times.clear()
            try:
                self._times[value] = (parse_time(value) - _EPOCH) // _MICROSECOND if value else None
            except (ValueError, OverflowError):
                self._times[value] = None
        return self._times[value]
