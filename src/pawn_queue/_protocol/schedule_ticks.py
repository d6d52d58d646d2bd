"""When a schedule's ticks fall: fixed intervals from an anchor, or a cron expression in a
time zone (evaluated by cronsim, whose DST rules are Debian cron's). Every runner computes
the same ticks from the definition alone, whatever its clock says, so a tick is named by
its scheduled time (docs/concepts/schedules.md)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from pawn_queue.exceptions import ArgumentError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The anchor of ``every`` ticks without a ``start``: the same for every process."""
MIN_EVERY_SECONDS = 1.0
"""The shortest interval: a store takes about one write a second on one key prefix."""
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class TickRule:
    """When ticks fall: exactly one of ``cron`` and ``every``, within [start, end)."""

    cron: str | None
    every: float | None
    timezone: str = "UTC"
    start: datetime | None = None
    end: datetime | None = None

    def after(self, moment: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``moment``, in UTC and in order, within [start, end)."""
        if self.start is not None and moment < self.start:
            moment = self.start - _MICROSECOND  # so that start itself is a tick
        for tick in self._unbounded_after(moment):
            if self.end is not None and tick >= self.end:
                return
            yield tick

    def next(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment``, None once the schedule has ended."""
        return next(self.after(moment), None)

    def _unbounded_after(self, moment: datetime) -> Iterator[datetime]:
        if self.every is not None:
            # Whole microseconds: float steps would drift apart between processes.
            step = max(1, round(self.every * 1_000_000))
            anchor = self.start or EPOCH
            k = (moment - anchor) // _MICROSECOND // step + 1
            while True:
                yield anchor + timedelta(microseconds=k * step)
                k += 1
        assert self.cron is not None
        local = moment.astimezone(ZoneInfo(self.timezone))
        try:
            for tick in CronSim(self.cron, local):
                yield tick.astimezone(UTC)
        except StopIteration:  # an expression that never matches again (30 February)
            return


def plan(
    rule: TickRule, last: datetime, now: datetime, catch_up_seconds: float
) -> tuple[list[datetime], int]:
    """The ticks after ``last`` up to ``now``: those at most ``catch_up_seconds`` old, to
    fire, and how many older ones are missed."""
    due: list[datetime] = []
    missed = 0
    oldest = now - timedelta(seconds=catch_up_seconds)
    for tick in rule.after(last):
        if tick > now:
            break
        if tick < oldest:
            missed += 1
        else:
            due.append(tick)
    return due, missed


def check_cron(expression: object) -> str:
    """``expression`` if cronsim accepts it, else an ArgumentError with cronsim's reason."""
    if not isinstance(expression, str):
        raise ArgumentError(f"cron: got {expression!r}, must be a string such as '0 * * * *'")
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as error:
        raise ArgumentError(f"cron: {expression!r} is not a cron expression: {error}") from None
    return expression


def check_timezone(name: object) -> str:
    """``name`` if it names a time zone of the zoneinfo database, else an ArgumentError."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"timezone: got {name!r}, must be a zone name such as 'Europe/Berlin'")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ArgumentError(
            f"timezone: {name!r} is not a known time zone (use a name such as 'Europe/Berlin')"
        ) from None
    return name


def check_every(value: object) -> float:
    """``value`` as an interval in seconds: a finite number >= 1, else an ArgumentError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < MIN_EVERY_SECONDS
    ):
        raise ArgumentError(f"every: got {value!r}, must be a finite number of seconds >= 1")
    return float(value)


def check_moment(name: str, value: object) -> datetime | None:
    """``value`` if it is None or a timezone-aware datetime (in UTC), else an ArgumentError."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ArgumentError(f"{name}: got {value!r}, must be a timezone-aware datetime or None")
    return value.astimezone(UTC)
