"""What the dashboard knows of one topic (:class:`TopicView`) and of its subscriptions
(:class:`SubscriptionView`), the points of its charts, and the schedules
(:class:`ScheduleView`)."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pawn_queue._protocol.counts import BatchSizes, Counts, DeadReasons
from pawn_queue._protocol.schedules import Schedule, ScheduleStats
from pawn_queue._protocol.topics import TopicSettings

PROBLEM_WINDOW_SECONDS = 300.0  # dead letters added within this long say "growing"


@dataclass(frozen=True, slots=True)
class Point:
    """One read of a topic: its counts, and the messages that came and went since the last."""

    at: float  # epoch seconds
    pending: int
    in_flight: int
    delayed: int
    dead_letter: int
    published: int  # messages in the objects that appeared since the previous read
    settled: int  # messages that left (acked, dead-lettered, expired, purged)
    dead_lettered: int  # dead letters that appeared


@dataclass(frozen=True, slots=True)
class FlowPoint:
    """Message counters of the Prometheus exporters, per scrape interval (exact flow)."""

    at: float
    published: float
    acked: float
    dead_lettered: float


@dataclass(slots=True)
class SubscriptionView:
    """What the dashboard knows of one subscription of a topic: its filter, and the counts
    of its queue (read while a page of its topic is open)."""

    name: str
    filter: dict[str, Any] | None  # as stored; None takes every message
    stats: Counts | None = None
    read_at: float = 0.0  # epoch seconds of the last read
    batches: BatchSizes = field(default_factory=BatchSizes)
    dead_reasons: dict[str, int] = field(default_factory=dict)  # reason -> dead letters
    dead_unread: int = 0  # dead letters whose reason is not read yet
    reasons: DeadReasons = field(default_factory=DeadReasons)

    @property
    def filter_text(self) -> str:
        """The filter as one line: ``region="eu", tier=["gold","silver"]``."""
        if not self.filter:
            return ""
        return ", ".join(
            f"{name}={json.dumps(condition, ensure_ascii=False, separators=(',', ':'))}"
            for name, condition in self.filter.items()
        )

    def oldest_age(self, now: float) -> float | None:
        """Its lag: the age of its oldest pending message now."""
        if self.stats is None or self.stats.oldest_age_seconds is None:
            return None
        return self.stats.oldest_age_seconds + max(0.0, now - self.read_at)


@dataclass(slots=True)
class TopicView:
    """What the dashboard knows of one topic."""

    name: str
    valid: bool = True  # False for a stored name the library refuses (shown, never read)
    settings: TopicSettings | None = None
    stats: Counts | None = None
    read_at: float = 0.0  # epoch seconds of the last read
    next_due: float | None = None  # epoch seconds when the first delayed message comes due
    groups: dict[str, int] = field(default_factory=dict)  # group hash -> messages
    history: deque[Point] = field(default_factory=deque)
    flow: deque[FlowPoint] = field(default_factory=deque)
    version: int = 0  # bumped whenever what the pages show of it changed
    error: str | None = None
    sizes: dict[str, int] = field(default_factory=dict)  # message object -> messages in it
    dead_keys: frozenset[str] = frozenset()
    batches: BatchSizes = field(default_factory=BatchSizes)
    dead_reasons: dict[str, int] = field(default_factory=dict)  # reason -> dead letters
    dead_unread: int = 0  # dead letters whose reason is not read yet
    reasons: DeadReasons = field(default_factory=DeadReasons)
    # Its subscriptions by name (the first SUBSCRIPTIONS_READ of them, with counts), read
    # while one of its pages is open; None until then.
    subscriptions: dict[str, SubscriptionView] | None = None
    subscriptions_read_at: float | None = None  # epoch seconds
    subscriptions_unread: int = 0  # subscriptions beyond those read

    def oldest_age(self, now: float) -> float | None:
        """Age of the oldest pending message now (it ages between reads too)."""
        if self.stats is None or self.stats.oldest_age_seconds is None:
            return None
        return self.stats.oldest_age_seconds + max(0.0, now - self.read_at)

    def dead_lettered_since(self, since: float) -> int:
        return sum(p.dead_lettered for p in self.history if p.at >= since)

    def problems(self, now: float, max_age: float) -> list[str]:
        """Why an operator should look at this topic now (empty: nothing)."""
        found = []
        if not self.valid:
            found.append("not a valid topic name")
        elif self.error:
            found.append(self.error)
        age = self.oldest_age(now)
        if age is not None and age > max_age:
            found.append(f"oldest pending message older than {max_age:g}s")
        # Any dead letter wants a look (redrive or purge), however old; growth says more.
        dead = self.stats.dead_letter if self.stats is not None else 0
        growth = self.dead_lettered_since(now - PROBLEM_WINDOW_SECONDS)
        window = f"{PROBLEM_WINDOW_SECONDS / 60:g} min"
        if growth:
            found.append(f"dead letters growing: +{growth} in {window}, {dead} in all")
        elif dead:
            found.append(f"{dead} dead letter{'' if dead == 1 else 's'}")
        return found


def counts_key(stats: Counts | None) -> tuple[int, ...] | None:
    """The counts to compare between two reads (the oldest age grows by itself)."""
    if stats is None:
        return None
    return (
        stats.pending,
        stats.in_flight,
        stats.delayed,
        stats.dead_letter,
        stats.pending_objects,
        stats.in_flight_objects,
        stats.delayed_objects,
        stats.uncounted_batches,
    )


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as the schedules page shows it: its definition's topic and rule, the
    priority and expiry of its ticks, and its stats (``schedule_stats``); ``error`` for a
    definition that cannot be read (``priority`` is then None)."""

    name: str
    topic: str = ""
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    paused: bool = False
    priority: int | None = None
    expires_in: float | None = None
    stats: ScheduleStats | None = None
    error: str | None = None

    @classmethod
    def of(cls, schedule: Schedule, stats: ScheduleStats) -> ScheduleView:
        return cls(
            name=schedule.name,
            topic=schedule.topic,
            cron=schedule.cron,
            every=schedule.every,
            timezone=schedule.timezone,
            paused=schedule.paused,
            priority=schedule.priority,
            expires_in=schedule.expires_in,
            stats=stats,
        )

    @property
    def spec(self) -> str:
        """When it fires: ``cron 0 2 * * * (Europe/Berlin)`` or ``every 60 s``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.timezone})"
        if self.every is not None:
            return f"every {self.every:g} s"
        return ""


def reasons_text(reasons: dict[str, int], unread: int) -> str:
    """Dead letters by reason as one line, the most first: ``expired 3, handler_error 1``."""
    ordered = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{reason or '(none)'} {n}" for reason, n in ordered]
    if unread:
        parts.append(f"not read yet {unread}")
    return ", ".join(parts)
