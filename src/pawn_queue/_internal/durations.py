"""Numbers and flags as API arguments take them (durations, counts, rates), and durations as people
read them (the command line and the dashboard)."""

from __future__ import annotations

import math
import reprlib
from typing import TypeGuard

from pawn_queue.exceptions import ArgumentError

MAX_SECONDS = 100 * 365 * 86400.0
"""The longest duration an argument may give: a lease expiry must stay a datetime."""


def seconds_argument(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as a number of seconds, > 0 (>= 0 with ``zero``) and finite; else an
    ArgumentError naming ``name`` (a bool, NaN and infinity are refused)."""
    if not (_is_number(value) and (value >= 0 if zero else value > 0) and value < MAX_SECONDS):
        bound = ">= 0" if zero else "> 0"
        raise ArgumentError(f"{name}: got {value!r}, must be a number of seconds {bound}")
    return float(value)


def rate_argument(name: str, value: object) -> float:
    """``value`` as a finite number > 0 (so many per second); else an ArgumentError naming
    ``name``."""
    if not (_is_number(value) and 0 < value < math.inf):
        raise ArgumentError(f"{name}: got {value!r}, must be a finite number > 0")
    return float(value)


def count_argument(name: str, value: object, *, minimum: int) -> int:
    """``value`` as a whole number >= ``minimum``; else an ArgumentError naming ``name`` (a
    bool and a float are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(f"{name}: got {value!r}, must be a whole number >= {minimum}")
    return value


def flag_argument(name: str, value: object) -> bool:
    """``value`` if it is True or False; else an ArgumentError naming ``name`` (a truthy
    string or number is not a flag)."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name}: got {reprlib.repr(value)}, must be True or False")
    return value


def _is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, not a bool (NaN fails every comparison made with it)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def short_age(seconds: float | None) -> str:
    """``seconds`` in the largest unit that keeps it readable: ``4.2s``, ``3.5m``, ``2.0h``,
    ``1.5d``; ``-`` for none."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
