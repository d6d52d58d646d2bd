"""What a write makes of rows: each row's payload, attributes, priority and expiry.

The columns are checked when the write starts (their types), and each record batch's
values before the first of its rows is published.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from itertools import repeat
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.types import (
    DataType,
    DoubleType,
    FloatType,
    IntegralType,
    MapType,
    NullType,
    StringType,
    StructType,
)

from pawn_queue._protocol import codec
from pawn_queue._protocol.envelope import priority_argument
from pawn_queue.exceptions import ArgumentError, ConfigError, PayloadError
from pawn_queue.producer import check_timing


@dataclass(frozen=True, slots=True)
class RowShape:
    """Which columns make a message.

    ``payload``: the column holding it (a string is JSON text, any other type is converted
    to JSON); None: all other columns form a JSON object. Optional columns, as publish's
    arguments: ``attributes`` (``map<string,string>``), ``priority`` (an integer 0-9, null
    0) and ``expires_in`` (seconds, null: none).
    """

    payload: str | None
    payload_is_text: bool
    attributes: str | None
    priority: str | None = None
    expires_in: str | None = None

    @classmethod
    def of(cls, schema: StructType) -> RowShape:
        names = schema.fieldNames()
        optional = {
            name: _check_column(name, schema[name].dataType)
            for name in _OPTIONAL_COLUMNS
            if name in names
        }
        attributes, priority, expires_in = (
            name if name in optional else None for name in _OPTIONAL_COLUMNS
        )
        if "payload" in names:
            is_text = isinstance(schema["payload"].dataType, StringType)
            return cls("payload", is_text, attributes, priority, expires_in)
        if all(name in optional for name in names):
            raise ConfigError("pawnqueue: nothing to publish: give a 'payload' column")
        return cls(None, False, attributes, priority, expires_in)

    def messages(self, batch: pa.RecordBatch) -> Iterator[Row]:
        """``(payload, attributes, priority, expires_in)`` of each row. Every row of the
        record batch is checked before the first is given: a bad one publishes none."""
        priorities = self._numbers(batch, self.priority, priority_argument, 0, "0")
        expiries = self._numbers(batch, self.expires_in, _expires_in, None, "none")
        if self.payload is None:
            columns = [name for name in batch.schema.names if name not in _OPTIONAL_COLUMNS]
            rows = batch.select(columns)
            kind = pa.struct(list(rows.schema))
            payloads = [_jsonable(row, kind) for row in rows.to_pylist()]
        else:
            column = batch.column(self.payload)
            values = column.to_pylist()
            if self.payload_is_text:
                payloads = [_parse(text, i) for i, text in enumerate(values)]
            else:
                payloads = [_jsonable(value, column.type) for value in values]
        if self.attributes is None:
            for payload, priority, expires_in in zip(payloads, priorities, expiries, strict=True):
                yield payload, {}, priority, expires_in
            return
        pairs = batch.column(self.attributes).to_pylist()
        for payload, given, priority, expires_in in zip(
            payloads, pairs, priorities, expiries, strict=True
        ):
            yield payload, {k: v for k, v in given or () if v is not None}, priority, expires_in

    @staticmethod
    def _numbers(
        batch: pa.RecordBatch,
        name: str | None,
        check: Callable[[Any], Any],
        null: Any,
        null_means: str,
    ) -> Iterable[Any]:
        """Column ``name``'s values as ``check`` takes them (``null`` for a null, or for
        every row without the column); an ArgumentError naming the first bad row."""
        if name is None:
            return repeat(null, batch.num_rows)
        out = []
        for row, value in enumerate(batch.column(name).to_pylist()):
            try:
                out.append(null if value is None else check(value))
            except ArgumentError as exc:
                raise ArgumentError(
                    f"pawnqueue: row {row} of a record batch: column {exc} (null: {null_means})"
                ) from None
        return out


Row = tuple[Any, dict[str, str], int, float | None]
_OPTIONAL_COLUMNS = ("attributes", "priority", "expires_in")


def _check_column(name: str, kind: DataType) -> str:
    """Refuse an optional column of a type that cannot hold what it means."""
    if name == "attributes":
        ok = (
            isinstance(kind, MapType)
            and isinstance(kind.keyType, StringType)
            and isinstance(kind.valueType, StringType)
        )
        wanted = "map<string,string>"
    elif name == "priority":
        ok, wanted = isinstance(kind, IntegralType | NullType), "an integer type (0 to 9)"
    else:
        ok = isinstance(kind, IntegralType | FloatType | DoubleType | NullType)
        wanted = "a number of seconds (an integer, float or double type)"
    if not ok:
        raise ConfigError(
            f"pawnqueue: column {name!r} must be {wanted}, not {kind.simpleString()}: it "
            f"sets each message's {name}, as publish's argument does (rename a column meant "
            "for the payload)"
        )
    return name


def _expires_in(value: Any) -> float:
    check_timing(None, value)
    return float(value)


def _parse(text: str | None, row: int) -> Any:
    if text is None:
        return None
    try:
        return codec.loads(text)
    except ValueError as exc:
        raise PayloadError(
            f"pawnqueue: row {row} of a record batch: 'payload' is not JSON text: {exc}"
        ) from None


def _jsonable(value: Any, kind: pa.DataType) -> Any:
    """A value of Arrow type ``kind`` (as ``to_pylist`` gives it) as a JSON value."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise PayloadError(f"pawnqueue: {value} cannot be a JSON value")
    if pa.types.is_map(kind):
        return {str(k): _jsonable(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _jsonable(value.get(f.name), f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_jsonable(v, kind.value_type) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise PayloadError(f"pawnqueue: cannot convert {type(value).__name__} to JSON")
