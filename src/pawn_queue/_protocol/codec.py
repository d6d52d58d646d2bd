"""JSON bytes: orjson where it gives exactly the standard library's answer, the standard
library everywhere else.

Every JSON object the library writes or reads goes through :func:`dumps` and :func:`loads`.
The rules are the standard library's (``json.dumps(..., ensure_ascii=False,
allow_nan=False)`` and ``json.loads``), so a value is accepted, refused or decoded the same
way whichever path runs; orjson is only the fast path:

- orjson writes NaN and infinity as ``null``: when its output holds ``null`` and does not read
  back as the value written, the standard library writes the value (and refuses them).
- orjson refuses integers beyond 64 bits, keys that are not strings, nesting deeper than 254
  and types it does not know: the standard library then decides (big integers and int, float,
  bool or None keys are written as before; the rest is refused as before).
- orjson reads integers beyond 64 bits as floats, losing digits: a body with a number of 19
  or more digits is read by the standard library, as is any body orjson refuses (``NaN``,
  lone surrogates, UTF-16, a byte order mark, nesting deeper than 1024), so errors are the
  standard library's too. (The standard library's own depth limit is the interpreter's
  recursion limit less the frames in use, so about 1000 either way.)
- orjson's working memory is about ten times the longest string it writes and thirteen times
  the body it reads: a body over 2 MiB is read, and a value holding a string over 1 MiB near
  its top (a large payload) is written, by the standard library, which needs about one copy.
- orjson writes a UUID as its text and an enum member as its value; the standard library path
  does the same, so those are accepted whatever else the value holds.
"""

from __future__ import annotations

import enum
import json
import uuid
from typing import Any

import orjson

# datetimes and dataclasses stay refused, as the standard library refuses them.
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

# Digits become "0", the bytes a number can follow become "|", the rest ".": "|" and 19 "0"s is
# a number that may not fit in 64 bits (2**63 has 19 digits). Digits after a letter or "/" (in
# a key, a name) never make a body take the slow path.
_NUMBER_START = b"[,:- \t\n\r"
_SHAPES = bytes(
    0x30 if 0x30 <= b <= 0x39 else 0x7C if b in _NUMBER_START else 0x2E for b in range(256)
)
_LONG_DIGITS = b"0" * 19
_LONG_NUMBER = b"|" + _LONG_DIGITS

_LARGE_BODY = 2 << 20  # bytes
_LARGE_STRING = 1 << 20  # characters


def _default(value: Any) -> Any:
    """The types orjson writes natively that the standard library does not know."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_STRICT = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_default
)
_LENIENT = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=True, default=_default
)


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, keys in their order.

    Raises what ``json.dumps`` raises: ValueError for NaN, infinity, a circular reference or a
    lone surrogate, TypeError for what is not JSON, RecursionError for nesting too deep.
    """
    data = _fast(value)
    return _STRICT.encode(value).encode("utf-8") if data is None else data


def text(value: Any) -> str:
    """``value`` as compact JSON text, writing NaN and infinity as ``NaN`` and ``Infinity``
    (a payload read from a body that held them, shown as it was)."""
    data = _fast(value)
    return _LENIENT.encode(value) if data is None else data.decode("utf-8")


def _fast(value: Any) -> bytes | None:
    """orjson's bytes for ``value``, or None where the standard library must write it."""
    if _large_string_near_top(value, 3):
        return None
    try:
        data = orjson.dumps(value, option=_OPTIONS)
    except TypeError:
        return None
    # A NaN or infinity written as null reads back as None, unlike the value written.
    if b"null" in data and orjson.loads(data) != value:
        return None
    return data


def _large_string_near_top(value: Any, depth: int) -> bool:
    """Whether ``value``, or what it holds ``depth`` levels down in containers of at most 32
    items, is a string over 1 MiB (a message's payload lies two levels down in its body).
    Level by level, in one loop: it runs before every body is written."""
    level = [value]
    for remaining in range(depth, -1, -1):
        below: list[Any] = []
        for item in level:
            if isinstance(item, str):
                if len(item) > _LARGE_STRING:
                    return True
            elif remaining and isinstance(item, dict | list | tuple) and len(item) <= 32:
                below.extend(item.values() if isinstance(item, dict) else item)
        if not below:
            return False
        level = below
    return False


def loads(data: bytes | str) -> Any:
    """The value a JSON document holds; raises what ``json.loads`` raises (a ValueError for
    invalid JSON or UTF-8, RecursionError for nesting too deep)."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            return json.loads(data)
    else:
        raw = data
    if len(raw) > _LARGE_BODY:
        return json.loads(data)
    shapes = raw.translate(_SHAPES)
    if _LONG_NUMBER not in shapes and not shapes.startswith(_LONG_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
