"""Schedules and their stats, as ``create_schedule``, ``schedule`` and ``schedule_stats``
return them. Schedules are kept and fired by :mod:`pawn_queue._protocol.schedules`."""

from pawn_queue._protocol.schedules import Schedule, ScheduleStats

__all__ = ["Schedule", "ScheduleStats"]

for _public in (Schedule, ScheduleStats):
    _public.__module__ = __name__
