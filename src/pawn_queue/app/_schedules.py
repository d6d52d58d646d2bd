"""The schedules an :class:`~pawn_queue.app.App` declares, and the runner it serves beside
its subscribers.

``@app.schedule("nightly", cron="0 2 * * *", topic="reports")`` declares a schedule
(docs/concepts/schedules.md), checked at once as ``create_schedule`` checks it. When the app
starts it creates each declared schedule that is missing (:func:`ensure_schedules`); one
that exists with another definition stops the start with ScheduleExistsError, naming the
differences, as a subscription with another filter does (SubscriptionConflictError): the
definition is changed with ``update_schedule``, on purpose. Whether it is paused is the
operators' and is left alone.

:func:`run_schedules` is the queue's runner (every schedule of the queue, not only the
app's: processes that run it share each tick, once) kept running beside the subscribers:
a crash of it is logged with its traceback and it starts again after a backoff, so the
handlers go on and the other runners keep firing meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pawn_queue._protocol.schedules import Schedule, decode_schedule, encode_schedule
from pawn_queue.client import PawnQueue
from pawn_queue.client._schedules import new_schedule
from pawn_queue.exceptions import (
    ArgumentError,
    ConfigError,
    ScheduleExistsError,
    ScheduleNotFoundError,
)

logger = logging.getLogger("pawn_queue.app")

RESTART_FIRST_SECONDS = 1.0
"""How long after a crash the runner starts again; doubled after each quick crash."""
RESTART_MAX_SECONDS = 60.0
"""The longest wait before starting it again; a runner that lived this long starts afresh."""

DEFINITION = (
    "topic",
    "cron",
    "every",
    "payload",
    "attributes",
    "timezone",
    "jitter_seconds",
    "catch_up_seconds",
    "start",
    "end",
    "priority",
    "expires_in",
)
"""What a declaration says and a stored schedule is compared on (not ``paused``, which is
the operators', nor ``created_at``)."""

_DECLARED_AT = datetime(1970, 1, 1, tzinfo=UTC)  # replaced by the store's clock when created


def declared_schedule(
    others: Mapping[str, Schedule], name: object, topic: object, options: Mapping[str, Any]
) -> Schedule:
    """The schedule a declaration describes, checked as ``create_schedule`` checks it (its
    errors: ConfigError for a name, PayloadError for the payload and attributes,
    ArgumentError for the rest); ArgumentError if ``others`` has its name."""
    schedule = new_schedule(name, topic, created_at=_DECLARED_AT, **options)
    if schedule.name in others:
        raise ArgumentError(f"the app already declares a schedule {schedule.name!r}")
    return schedule


async def ensure_schedules(queue: PawnQueue, declared: Sequence[Schedule]) -> None:
    """Create the ``declared`` schedules that are missing, and check those that exist
    (ScheduleExistsError for another definition), concurrently."""
    results = await asyncio.gather(
        *(_ensure(queue, schedule) for schedule in declared), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _ensure(queue: PawnQueue, declared: Schedule) -> None:
    try:
        stored = await queue.schedule(declared.name)
    except ScheduleNotFoundError:
        fields = {name: getattr(declared, name) for name in DEFINITION}
        try:
            await queue.create_schedule(declared.name, **fields)
            logger.info("schedule %s created (topic %s)", declared.name, declared.topic)
            return
        except ScheduleExistsError:
            # Created meanwhile by another process (another of --processes N): compare.
            stored = await queue.schedule(declared.name)
    differences = definition_differences(stored, declared)
    if differences:
        shown = ", ".join(
            f"{name} is {was!r}, declared {wanted!r}" for name, (was, wanted) in differences.items()
        )
        raise ScheduleExistsError(
            f"schedule {declared.name!r} exists with another definition: {shown} (change it "
            "with update_schedule, or declare what it is)"
        )


def definition_differences(
    stored: Schedule, declared: Schedule
) -> dict[str, tuple[object, object]]:
    """The :data:`DEFINITION` fields that differ, as ``(stored, declared)``: both as the
    store keeps them (a tuple payload is a list there, ``every=60`` is 60.0)."""
    was, wanted = _as_stored(stored), _as_stored(declared)
    return {
        name: (getattr(was, name), getattr(wanted, name))
        for name in DEFINITION
        if getattr(was, name) != getattr(wanted, name)
    }


def _as_stored(schedule: Schedule) -> Schedule:
    kept = decode_schedule(encode_schedule(schedule))
    return dataclasses.replace(kept, paused=False, created_at=_DECLARED_AT)


async def run_schedules(queue: PawnQueue, app: str, *, alone: bool = False) -> None:
    """``queue.run_schedules()`` until cancelled, started again after a crash (logged at
    ERROR with its traceback), after 1 s, then twice as long after each quick crash.
    ``alone``: the app has no subscriber, so a store where schedules cannot run raises its
    ConfigError instead of being logged."""
    loop = asyncio.get_running_loop()
    delay = RESTART_FIRST_SECONDS
    logger.info("schedule runner started app=%s", app)
    while True:
        started = loop.time()
        failure: BaseException | None = None
        try:
            await queue.run_schedules()
        except ConfigError as exc:  # a store where they cannot fire once: never will
            if alone:
                raise
            logger.error("schedules are not run app=%s: %s (the handlers go on)", app, exc)
            return
        except Exception as exc:
            failure = exc
        if loop.time() - started >= RESTART_MAX_SECONDS:
            delay = RESTART_FIRST_SECONDS
        logger.error(
            "schedule runner %s app=%s: starting it again in %g s (the handlers go on)",
            "failed" if failure is not None else "returned",
            app,
            delay,
            exc_info=failure,
        )
        await asyncio.sleep(delay)
        delay = min(RESTART_MAX_SECONDS, delay * 2)


__all__ = ["declared_schedule", "definition_differences", "ensure_schedules", "run_schedules"]
