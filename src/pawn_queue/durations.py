"""Durations as people read them, for the command line and the dashboard."""

from __future__ import annotations


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
