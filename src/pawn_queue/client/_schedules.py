"""The schedule methods of :class:`pawn_queue.client.PawnQueue` (docs/concepts/schedules.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from types import EllipsisType
from typing import TYPE_CHECKING, Any, cast

from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import check_attributes, encode_json, priority_argument
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.schedule_runner import ScheduleRunner
from pawn_queue._protocol.schedule_ticks import (
    check_cron,
    check_every,
    check_moment,
    check_timezone,
)
from pawn_queue._protocol.schedules import (
    RESERVED_ATTRIBUTES,
    Schedule,
    Schedules,
    ScheduleStats,
    dedup_id,
    tick_attributes,
)
from pawn_queue.exceptions import ArgumentError, ConfigError, PayloadError
from pawn_queue.producer import check_timing

if TYPE_CHECKING:
    from pawn_queue.producer import Producer

SCHEDULE_PRODUCER = "pawn-queue-schedules"
"""The producer name runners and ``trigger_schedule`` publish ticks under."""


class ScheduleMethods:
    """Create, change and run schedules: messages published to a topic on a cron expression
    or at a fixed interval, once per tick across every process that runs them."""

    if TYPE_CHECKING:

        def _ready(self) -> Runtime: ...

        async def register_producer(self, name: str) -> Producer: ...

    async def create_schedule(
        self,
        name: str,
        topic: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        payload: Any = None,
        attributes: Mapping[str, str] | None = None,
        timezone: str = "UTC",
        jitter_seconds: float = 0,
        catch_up_seconds: float = 60,
        start: datetime | None = None,
        end: datetime | None = None,
        priority: int = 0,
        expires_in: float | None = None,
    ) -> Schedule:
        """Create a schedule that publishes ``payload`` (and ``attributes``) to ``topic`` (which
        must exist) on each tick: ``cron`` (``"m h dom mon dow"``, in ``timezone``) or
        ``every`` seconds (>= 1, counted from ``start``, else from the Unix epoch).

        Ticks before ``start`` or from ``end`` on never fire. Each runner waits a random
        0..``jitter_seconds`` before firing a tick. Ticks missed while no runner ran are fired
        if at most ``catch_up_seconds`` old, else counted as missed. Each tick's message has
        ``priority`` and ``expires_in`` as :meth:`Producer.publish
        <pawn_queue.producer.Producer.publish>` takes them (``expires_in`` counts from the
        tick's publish), checked as it checks them. Raises
        ScheduleExistsError if the name is taken, TopicNotFoundError, ConfigError for a bad
        name, PayloadError for a bad payload or attributes and ArgumentError for another bad
        value, or for a topic whose ``dedup_window_seconds`` is under ``catch_up_seconds +
        jitter_seconds + 20`` (runners could not tell a tick published from a lost one;
        nothing written)."""
        runtime = self._ready()
        schedule = new_schedule(
            name,
            topic,
            cron=cron,
            every=every,
            payload=payload,
            attributes=attributes,
            timezone=timezone,
            jitter_seconds=jitter_seconds,
            catch_up_seconds=catch_up_seconds,
            start=start,
            end=end,
            priority=priority,
            expires_in=expires_in,
            created_at=runtime.clock(),
        )
        return await Schedules(runtime).create(schedule)

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule of the queue, by name."""
        return await Schedules(self._ready()).list()

    async def schedule(self, name: str) -> Schedule:
        """One schedule; raises ScheduleNotFoundError."""
        runtime = self._ready()
        return (await Schedules(runtime).get(_name(name)))[0]

    async def update_schedule(
        self,
        name: str,
        *,
        topic: str | EllipsisType = ...,
        cron: str | EllipsisType | None = ...,
        every: float | EllipsisType | None = ...,
        payload: Any = ...,
        attributes: Mapping[str, str] | EllipsisType | None = ...,
        timezone: str | EllipsisType = ...,
        jitter_seconds: float | EllipsisType = ...,
        catch_up_seconds: float | EllipsisType = ...,
        start: datetime | EllipsisType | None = ...,
        end: datetime | EllipsisType | None = ...,
        priority: int | EllipsisType = ...,
        expires_in: float | EllipsisType | None = ...,
    ) -> Schedule:
        """Change the options passed and keep the others; return the new schedule. Giving
        ``cron`` clears ``every`` and the other way round; ``expires_in=None`` clears the
        expiry. Runners apply the change within a few seconds. Raises ScheduleNotFoundError,
        and ArgumentError for a bad value or, when the topic, ``catch_up_seconds`` or
        ``jitter_seconds`` change, for a topic whose dedup window is too short for them (as
        ``create_schedule``)."""
        given = {
            key: value
            for key, value in {
                "topic": topic,
                "cron": cron,
                "every": every,
                "payload": payload,
                "attributes": attributes,
                "timezone": timezone,
                "jitter_seconds": jitter_seconds,
                "catch_up_seconds": catch_up_seconds,
                "start": start,
                "end": end,
                "priority": priority,
                "expires_in": expires_in,
            }.items()
            if value is not ...
        }
        if "cron" in given and given["cron"] is not None:
            given.setdefault("every", None)
        elif "every" in given and given["every"] is not None:
            given.setdefault("cron", None)

        def change(current: Schedule) -> Schedule:
            fields = {f: getattr(current, f) for f in current.__dataclass_fields__}
            return new_schedule(**{**fields, **given})

        new_schedule(**{**_PROBE, **given})  # bad values raise before any request
        return await Schedules(self._ready()).update(_name(name), change)

    async def pause_schedule(self, name: str) -> None:
        """Stop firing (runners see it within a few seconds); ticks while paused are skipped,
        not caught up."""
        await self._set_paused(name, True)

    async def resume_schedule(self, name: str) -> None:
        """Fire again, from the next tick on."""
        await self._set_paused(name, False)

    async def _set_paused(self, name: str, paused: bool) -> None:
        await Schedules(self._ready()).update(
            _name(name), lambda current: dataclasses.replace(current, paused=paused)
        )

    async def trigger_schedule(self, name: str) -> str:
        """Publish one tick now (its ``schedule_time`` is now), once, from this process, paused
        or not; return the message's id."""
        runtime = self._ready()
        schedule, _ = await Schedules(runtime).get(_name(name))
        tick = runtime.clock()
        producer = await self.register_producer(SCHEDULE_PRODUCER)
        return await producer.publish(
            schedule.topic,
            schedule.payload,
            attributes=tick_attributes(schedule, tick),
            dedup_id=dedup_id(schedule.name, tick),
            priority=schedule.priority,
            expires_in=schedule.expires_in,
        )

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule and its tick markers; runners stop it within a few seconds.
        Raises ScheduleNotFoundError."""
        await Schedules(self._ready()).delete(_name(name))

    async def schedule_stats(self, name: str) -> ScheduleStats:
        """Last and next fire time, and the ticks fired and missed over the markers kept
        (the last hour at least). Raises ScheduleNotFoundError."""
        return await Schedules(self._ready()).stats(_name(name))

    async def run_schedules(self) -> None:
        """Fire the ticks of every schedule of the queue until cancelled. Run it in as many
        processes as you like: each tick fires once (docs/concepts/schedules.md).

        Raises ConfigError on a store without conditional writes (strategy
        ``csprng_verify``): there every runner's create-only tick marker would succeed, and
        each tick would fire once per runner."""
        runtime = self._ready()
        if runtime.leases.strategy != "conditional_write":
            raise ConfigError(
                "schedules fire once per tick only on a store with conditional writes: this "
                f"one runs strategy {runtime.leases.strategy} (docs/concepts/schedules.md)"
            )
        producers: list[Producer] = []  # registered at the first tick: most queues have none

        async def publish(
            topic: str,
            payload: Any,
            attributes: Mapping[str, str],
            ident: str,
            *,
            priority: int,
            expires_in: float | None,
        ) -> str:
            if not producers:
                producers.append(await self.register_producer(SCHEDULE_PRODUCER))
            return await producers[0].publish(
                topic,
                payload,
                attributes=attributes,
                dedup_id=ident,
                priority=priority,
                expires_in=expires_in,
            )

        await ScheduleRunner(runtime, publish).run()


def _name(name: object) -> str:
    """A schedule's name; ConfigError if it is not one (as for every name)."""
    return layout.validate_name(name, "schedule name")


def new_schedule(
    name: object,
    topic: object,
    *,
    cron: object,
    every: object,
    payload: object,
    attributes: object,
    timezone: object,
    jitter_seconds: object,
    catch_up_seconds: object,
    start: object,
    end: object,
    priority: object,
    expires_in: object,
    created_at: datetime,
    paused: bool = False,
) -> Schedule:
    """A Schedule of these values, else the error each value's kind raises everywhere:
    ConfigError for names, PayloadError for the payload and attributes, ArgumentError for
    the rest. Each value is checked before how they go together; nothing is read or
    written (``create_schedule``, ``update_schedule`` and ``@app.schedule`` check with it).
    ``priority`` and ``expires_in`` are checked by ``publish``'s own checks."""
    checked = Schedule(
        name=_name(name),
        topic=layout.validate_name(topic, "topic name"),
        cron=None if cron is None else check_cron(cron),
        every=None if every is None else check_every(every),
        payload=_payload(payload),
        attributes=_attributes(attributes),
        timezone=check_timezone(timezone),
        jitter_seconds=seconds_argument("jitter_seconds", jitter_seconds, zero=True),
        catch_up_seconds=seconds_argument("catch_up_seconds", catch_up_seconds, zero=True),
        start=check_moment("start", start),
        end=check_moment("end", end),
        paused=paused,
        created_at=created_at,
        priority=priority_argument(priority),
        expires_in=_expires_in(expires_in),
    )
    if (cron is None) == (every is None):
        raise ArgumentError("give exactly one of cron (an expression) and every (seconds)")
    if checked.start is not None and checked.end is not None and checked.end <= checked.start:
        raise ArgumentError(f"end: got {end!r}, must be after start {start!r}")
    return checked


_PROBE: dict[str, Any] = {
    "name": "probe",
    "topic": "probe",
    "cron": None,
    "every": 60,
    "payload": None,
    "attributes": None,
    "timezone": "UTC",
    "jitter_seconds": 0,
    "catch_up_seconds": 60,
    "start": None,
    "end": None,
    "priority": 0,
    "expires_in": None,
    "paused": False,
    "created_at": datetime(2000, 1, 1, tzinfo=UTC),
}
"""Valid values for every field, so that ``update_schedule`` checks what it was given."""


def _expires_in(expires_in: object) -> float | None:
    """``expires_in`` refused as ``publish`` refuses it, else in seconds (None: never)."""
    check_timing(None, expires_in)
    return None if expires_in is None else float(cast(float, expires_in))


def _payload(payload: object) -> Any:
    if isinstance(payload, bytes | bytearray | memoryview):
        raise PayloadError("payload: a schedule's payload is stored as JSON; bytes cannot be")
    encode_json(payload)  # PayloadError, as for a publish
    return payload


def _attributes(attributes: object) -> dict[str, str]:
    checked = check_attributes(attributes)
    reserved = sorted(set(checked) & set(RESERVED_ATTRIBUTES))
    if reserved:
        raise PayloadError(f"attributes: {reserved} are set by the schedule on each tick")
    return checked
