"""Durations: as API arguments take them, and as people read them (the command line and the
dashboard)."""

from __future__ import annotations

from pawn_queue.exceptions import ArgumentError

MAX_SECONDS = 100 * 365 * 86400.0
"""The longest duration an argument may give: a lease expiry must stay a datetime."""


def seconds_argument(name: str, value: object, *, zero: bool = False) -> float:
    """``value`` as a number of seconds, > 0 (>= 0 with ``zero``) and finite; else an
    ArgumentError naming ``name`` (a bool, NaN and infinity are refused)."""
    valid = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (value >= 0 if zero else value > 0)
        and value < MAX_SECONDS
    )
    if not valid:
        bound = ">= 0" if zero else "> 0"
        raise ArgumentError(f"{name}: got {value!r}, must be a number of seconds {bound}")
    return float(value)  # type: ignore[arg-type]


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
