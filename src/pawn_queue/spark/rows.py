"""The rows a pawnqueue read produces: the schema, and messages as Arrow record batches.

Readers yield ``pyarrow.RecordBatch`` es (not tuples): Spark takes them as they are, which
is several times faster than converting rows one by one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

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

from pawn_queue import codec
from pawn_queue.envelope import DeadLetterInfo, Envelope, parse_time

ROWS_PER_RECORD_BATCH = 8192


def message_schema() -> StructType:
    """``id, topic, key, producer_id, created_at, payload, attributes, receive_count``."""
    return StructType(
        [
            StructField("id", StringType()),
            StructField("topic", StringType()),
            StructField("key", StringType()),
            StructField("producer_id", StringType()),
            StructField("created_at", TimestampType()),
            StructField("payload", StringType()),
            StructField("attributes", MapType(StringType(), StringType())),
            StructField("receive_count", IntegerType()),
        ]
    )


def dead_letter_schema() -> StructType:
    """The message schema plus ``reason, error, dead_lettered_at``."""
    return StructType(
        [
            *message_schema().fields,
            StructField("reason", StringType()),
            StructField("error", StringType()),
            StructField("dead_lettered_at", TimestampType()),
        ]
    )


def payload_json(payload: Any) -> str:
    """A payload as compact JSON text (what the ``payload`` column holds)."""
    return codec.text(payload)


class RowBuffer:
    """Columns of rows on their way into Arrow record batches of ``schema``."""

    def __init__(self, schema: StructType) -> None:
        self._arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._dead_letters = len(schema.fields) > len(message_schema().fields)
        self._columns: list[list[Any]] = [[] for _ in schema.fields]
        self._times: dict[str, datetime | None] = {}

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
        c[1] += [e.topic for e in envelopes]
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

    def _time(self, value: str) -> datetime | None:
        if value not in self._times:
            if len(self._times) > 1024:
                self._times.clear()
            try:
                self._times[value] = parse_time(value) if value else None
            except ValueError:
                self._times[value] = None
        return self._times[value]
