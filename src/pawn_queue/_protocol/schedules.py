"""Schedules: their definitions (``_schedules/{name}.json``, JSON), their tick markers
(``_schedule_ticks/{name}/{tick}``, create-only, once each) and the messages a tick
publishes. :mod:`pawn_queue._protocol.schedule_runner` fires them
(docs/concepts/schedules.md).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import encode_json, parse_time, priority_argument
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.schedule_ticks import TickRule
from pawn_queue.exceptions import (
    AlreadyExists,
    ArgumentError,
    NotFound,
    PreconditionFailed,
    ScheduleExistsError,
    ScheduleNotFoundError,
)
from pawn_queue.store.base import IfMatch

logger = logging.getLogger(__name__)

SKEW_MARGIN_SECONDS = 300.0
"""How much longer than a runner could still try a tick its marker is kept (clock skew)."""
MIN_KEEP_SECONDS = 3600.0
"""Markers are kept at least this long, for ``schedule_stats``."""
GRACE_SECONDS = 10.0
"""How long after a tick a runner that lost its marker looks whether the winner published
it; the runner trusts the topic's dedup marker only until this long before the topic's
dedup window is past (:func:`dedup_window_needed`)."""
RESERVED_ATTRIBUTES = ("schedule", "schedule_time")
_UPDATE_ATTEMPTS = 10


class Publish(Protocol):
    """``publish(topic, payload, attributes, dedup_id, priority=, expires_in=)``: publishes a
    tick's message as ``Producer.publish`` does; the message's id."""

    def __call__(
        self,
        topic: str,
        payload: Any,
        attributes: Mapping[str, str],
        dedup_id: str,
        /,
        *,
        priority: int,
        expires_in: float | None,
    ) -> Awaitable[str]: ...


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule: what it publishes to which topic, and when (``cron`` or ``every``)."""

    name: str
    topic: str
    cron: str | None
    every: float | None
    payload: Any = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    timezone: str = "UTC"
    jitter_seconds: float = 0.0
    catch_up_seconds: float = 60.0
    start: datetime | None = None
    end: datetime | None = None
    paused: bool = False
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    priority: int = 0
    """Each tick's message's priority (``publish(priority=)``)."""
    expires_in: float | None = None
    """Seconds from each tick's publish after which its message is never delivered
    (``publish(expires_in=)``); None: never."""

    def rule(self) -> TickRule:
        """When its ticks fall."""
        return TickRule(self.cron, self.every, self.timezone, self.start, self.end)

    def keep_seconds(self) -> float:
        """How long its tick markers are kept: while some runner might still try the tick."""
        late = self.catch_up_seconds + self.jitter_seconds
        return max(late, MIN_KEEP_SECONDS) + SKEW_MARGIN_SECONDS


@dataclass(frozen=True, slots=True)
class ScheduleStats:
    """A schedule's recent history, from the tick markers kept (at least the last hour)."""

    name: str
    paused: bool
    last_fire_time: datetime | None
    """The newest tick fired, None if none is kept."""
    next_fire_time: datetime | None
    """The next tick to fire; None while paused or once past ``end``."""
    fired: int
    """Ticks fired among the markers kept."""
    missed: int
    """Ticks skipped (older than ``catch_up_seconds`` when runners came back), as recorded
    in the markers kept."""


def dedup_window_needed(schedule: Schedule, grace_seconds: float = GRACE_SECONDS) -> float:
    """The shortest ``dedup_window_seconds`` of its topic under which a runner can still
    tell each tick it looks at published from lost: it fires a tick up to
    ``catch_up_seconds + jitter_seconds`` after it, looks ``grace_seconds`` later whether
    the winner published it, and trusts the dedup marker until ``grace_seconds`` before the
    window is past."""
    return schedule.catch_up_seconds + schedule.jitter_seconds + 2 * grace_seconds


def check_dedup_window(schedule: Schedule, window: float) -> None:
    """ArgumentError if ``window``, its topic's ``dedup_window_seconds``, is shorter than
    the schedule needs (:func:`dedup_window_needed`)."""
    needed = dedup_window_needed(schedule)
    if window < needed:
        late = schedule.catch_up_seconds + schedule.jitter_seconds
        raise ArgumentError(
            f"schedule {schedule.name!r}: topic {schedule.topic!r} has dedup_window_seconds "
            f"{window:g}{' (no dedup)' if window == 0 else ''}, under the {needed:g} its "
            f"runners need to tell a tick published from a lost one (catch_up_seconds "
            f"{schedule.catch_up_seconds:g} + jitter_seconds {schedule.jitter_seconds:g} + "
            f"{needed - late:g}): raise the topic's window (update_topic) or lower "
            "catch_up_seconds"
        )


def tick_iso(tick: datetime) -> str:
    """A tick as its message's ``schedule_time``: ISO 8601 in UTC."""
    return tick.astimezone(UTC).isoformat().replace("+00:00", "Z")


def dedup_id(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick_iso(tick)}"


def tick_attributes(schedule: Schedule, tick: datetime) -> dict[str, str]:
    return {**schedule.attributes, "schedule": schedule.name, "schedule_time": tick_iso(tick)}


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def encode_schedule(schedule: Schedule) -> bytes:
    return encode_json(
        {
            "name": schedule.name,
            "topic": schedule.topic,
            "cron": schedule.cron,
            "every": schedule.every,
            "payload": schedule.payload,
            "attributes": dict(schedule.attributes),
            "timezone": schedule.timezone,
            "jitter_seconds": schedule.jitter_seconds,
            "catch_up_seconds": schedule.catch_up_seconds,
            "start": _time(schedule.start),
            "end": _time(schedule.end),
            "paused": schedule.paused,
            "created_at": _time(schedule.created_at),
            # Ignored by the runners before these fields: they fire at 0, with no expiry.
            "priority": schedule.priority,
            "expires_in": schedule.expires_in,
        }
    )


def decode_schedule(data: bytes) -> Schedule:
    """A stored definition; ValueError if it is not one."""
    try:
        raw = codec.loads(data)

        def moment(name: str) -> datetime | None:
            return None if raw.get(name) is None else parse_time(str(raw[name]))

        every = raw.get("every")
        expires_in = raw.get("expires_in")
        return Schedule(
            name=str(raw["name"]),
            topic=str(raw["topic"]),
            cron=None if raw.get("cron") is None else str(raw["cron"]),
            every=None if every is None else float(every),
            payload=raw.get("payload"),
            attributes={str(k): str(v) for k, v in dict(raw.get("attributes") or {}).items()},
            timezone=str(raw.get("timezone", "UTC")),
            jitter_seconds=float(raw.get("jitter_seconds", 0.0)),
            catch_up_seconds=float(raw.get("catch_up_seconds", 60.0)),
            start=moment("start"),
            end=moment("end"),
            paused=bool(raw.get("paused", False)),
            created_at=moment("created_at") or datetime.now(UTC),
            # Absent (written before them): priority 0, no expiry. Checked as a publish
            # checks them, so a bad value leaves the definition out, not each tick failing.
            priority=priority_argument(raw.get("priority", 0)),
            expires_in=None if expires_in is None else seconds_argument("expires_in", expires_in),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"not a schedule definition: {error}") from None


def marker_body(runner_id: str, written_at: datetime, missed: int) -> bytes:
    body: dict[str, Any] = {
        "runner": runner_id,
        "written_at": written_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    if missed:
        body["missed"] = missed  # left out when 0: a listing's sizes show which markers have it
    return encode_json(body)


_PLAIN_MARKER_SIZE = len(marker_body(str(uuid.UUID(int=0)), datetime.now(UTC), 0))


def schedule_name_of(key: str) -> str | None:
    rest = key.removeprefix(layout.SCHEDULES)
    suffix = layout.MESSAGE_SUFFIX
    return rest[: -len(suffix)] if "/" not in rest and rest.endswith(suffix) else None


class Schedules:
    """The schedules' definitions on one store."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._store = runtime.store

    async def create(self, schedule: Schedule) -> Schedule:
        """Store a new schedule; ScheduleExistsError if one has its name, TopicNotFoundError,
        ArgumentError if its topic's dedup window is too short for it."""
        settings = await self._runtime.topics.settings(schedule.topic)
        check_dedup_window(schedule, settings.dedup_window_seconds)
        try:
            await self._store.put(
                layout.schedule_key(schedule.name), encode_schedule(schedule), "create"
            )
        except AlreadyExists:
            raise ScheduleExistsError(
                f"schedule {schedule.name!r} exists (change it with update_schedule)"
            ) from None
        return schedule

    async def get(self, name: str) -> tuple[Schedule, str]:
        """The schedule and its etag; ScheduleNotFoundError if there is none."""
        try:
            found = await self._store.get(layout.schedule_key(name))
        except NotFound:
            raise ScheduleNotFoundError(f"schedule {name!r} does not exist") from None
        return decode_schedule(found.data), found.meta.etag

    async def list(self) -> list[Schedule]:
        """Every schedule, by name (a definition that cannot be read is left out)."""
        metas = await self._store.list(layout.SCHEDULES)
        names = [n for meta in metas if (n := schedule_name_of(meta.key)) is not None]
        found = await asyncio.gather(*(self._get_or_none(n) for n in names))
        return [schedule for schedule in found if schedule is not None]

    async def _get_or_none(self, name: str) -> Schedule | None:
        try:
            return (await self.get(name))[0]
        except (ScheduleNotFoundError, ValueError):
            return None

    async def update(self, name: str, change: Callable[[Schedule], Schedule]) -> Schedule:
        """Apply ``change`` to the stored schedule (if-match: read again after a race).
        A change of its topic, or of what it needs of the topic's dedup window, is checked
        as :meth:`create` checks it; a pause or a new payload is not (a window lowered
        since is the runners' to report)."""
        for _ in range(_UPDATE_ATTEMPTS):
            current, etag = await self.get(name)
            new = change(current)
            needs = dedup_window_needed(new) != dedup_window_needed(current)
            if new.topic != current.topic or needs:
                settings = await self._runtime.topics.settings(new.topic)
                check_dedup_window(new, settings.dedup_window_seconds)
            try:
                await self._store.put(
                    layout.schedule_key(name), encode_schedule(new), IfMatch(etag)
                )
                return new
            except PreconditionFailed:
                continue
        raise PreconditionFailed(f"schedule {name!r} kept changing; try again")

    async def delete(self, name: str) -> None:
        """Delete the schedule and its tick markers; ScheduleNotFoundError if missing."""
        key = layout.schedule_key(name)
        try:
            await self._store.head(key)
        except NotFound:
            raise ScheduleNotFoundError(f"schedule {name!r} does not exist") from None
        await self._store.delete(key)
        markers = await self._store.list(layout.schedule_ticks_prefix(name))
        await self._store.delete_many([meta.key for meta in markers])

    async def stats(self, name: str) -> ScheduleStats:
        """Counts over the markers kept: a GET of the definition, then :meth:`stats_of`."""
        schedule, _ = await self.get(name)
        return await self.stats_of(schedule)

    async def stats_of(self, schedule: Schedule) -> ScheduleStats:
        """Counts over the markers kept of a schedule already read: one LIST (a page per
        1,000 markers), and a GET per marker that records missed ticks (only those are
        larger than a plain marker)."""
        name = schedule.name
        markers = await self._store.list(layout.schedule_ticks_prefix(name))
        ticks = [tick for meta in markers if (tick := layout.tick_of(meta.key)) is not None]
        recorded = [m.key for m in markers if m.size != _PLAIN_MARKER_SIZE]
        missed = sum(await asyncio.gather(*(self._missed_in(key) for key in recorded)))
        last = max(ticks, default=None)
        now = self._runtime.clock()
        upcoming = schedule.rule().next(max(now, last) if last is not None else now)
        return ScheduleStats(
            name=name,
            paused=schedule.paused,
            last_fire_time=last,
            next_fire_time=None if schedule.paused else upcoming,
            fired=len(ticks),
            missed=missed,
        )

    async def _missed_in(self, key: str) -> int:
        try:
            raw = codec.loads((await self._store.get(key)).data)
            return max(0, int(raw.get("missed", 0)))
        except (NotFound, ValueError, TypeError, AttributeError):
            return 0
