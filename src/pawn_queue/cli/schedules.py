"""``pawn-queue schedules ...``: create, list, show, pause, resume, trigger and delete
schedules, and ``run`` them until stopped.

A schedule publishes a message to a topic on each tick of a cron expression or a fixed
interval; any number of ``schedules run`` processes fire each tick once
(docs/concepts/schedules.md). Names and values are checked by the library, as
``create_schedule`` checks them: a refused value is a usage error that writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue.cli.common import (
    EXIT_USAGE,
    CliError,
    JsonOption,
    PriorityOption,
    YesOption,
    attribute_options,
    fail,
    open_queue,
    options,
    print_json,
    require_extra,
    run,
    setup_logging,
    short,
    shown,
    stdout_console,
)
from pawn_queue.client import PawnQueue
from pawn_queue.exceptions import PayloadError, RootNotFoundError, ScheduleExistsError
from pawn_queue.schedules import Schedule, ScheduleStats

schedules_app = typer.Typer(
    help="Schedules (a message published to a topic on a cron expression or an interval, "
    "once per tick): create, list, show, pause, resume, trigger, delete, run.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="Schedule name.")]
TimeOption = Annotated[
    str | None, typer.Option(metavar="TIME", help="An ISO-8601 time with its zone.")
]


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def schedule_dict(schedule: Schedule) -> dict[str, Any]:
    """A schedule as ``--json`` prints it."""
    return {
        "schedule": schedule.name,
        "topic": schedule.topic,
        "cron": schedule.cron,
        "every": schedule.every,
        "timezone": schedule.timezone,
        "payload": schedule.payload,
        "attributes": dict(schedule.attributes),
        "jitter_seconds": schedule.jitter_seconds,
        "catch_up_seconds": schedule.catch_up_seconds,
        "start": _time(schedule.start),
        "end": _time(schedule.end),
        "priority": schedule.priority,
        "expires_in": schedule.expires_in,
        "paused": schedule.paused,
        "created_at": _time(schedule.created_at),
    }


def stats_dict(stats: ScheduleStats) -> dict[str, Any]:
    return {
        "last_fire_time": _time(stats.last_fire_time),
        "next_fire_time": _time(stats.next_fire_time),
        "fired": stats.fired,
        "missed": stats.missed,
        "paused": stats.paused,
    }


def _when(schedule: Schedule) -> str:
    """``cron '0 2 * * *' in Europe/Berlin`` or ``every 60s``."""
    if schedule.cron is not None:
        return f"cron '{schedule.cron}' in {schedule.timezone}"
    return f"every {shown(schedule.every)}s"


def _what(schedule: Schedule) -> str:
    """How its ticks are published: ``, priority 9, expiring after 30s`` (nothing for the
    defaults)."""
    extras = [f"priority {schedule.priority}"] if schedule.priority else []
    if schedule.expires_in is not None:
        extras.append(f"expiring after {shown(schedule.expires_in)}s")
    return "".join(f", {extra}" for extra in extras)


def _payload(text: str | None) -> Any:
    """The ``--payload`` given as JSON (None without it), or a usage error."""
    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        fail(f"--payload: invalid JSON ({reason}): {text!r}", EXIT_USAGE)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _moment(text: str | None, option: str) -> datetime | None:
    """``--start``/``--end``: an ISO-8601 time with its zone (a usage error if not)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        fail(
            f"{option}: got {text!r}; give an ISO-8601 time with its zone "
            "(2026-11-27T10:00:00+00:00 or 2026-11-27T10:00Z)",
            EXIT_USAGE,
        )
    return when


@schedules_app.command("create")
def schedules_create(
    ctx: typer.Context,
    name: NameArgument,
    topic: Annotated[
        str, typer.Option(metavar="TOPIC", help="The topic each tick publishes to (must exist).")
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            metavar="EXPRESSION",
            help="'minute hour day-of-month month day-of-week', e.g. '0 2 * * *' (in "
            "--timezone). Exactly one of --cron and --every.",
        ),
    ] = None,
    every: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="Seconds between ticks, at least 1 (from --start, else from the Unix epoch).",
        ),
    ] = None,
    payload: Annotated[
        str | None, typer.Option(metavar="JSON", help="What each tick publishes (default null).")
    ] = None,
    attribute: Annotated[
        list[str] | None,
        typer.Option("--attribute", "-a", help="KEY=VALUE of each tick's message (repeatable)."),
    ] = None,
    timezone: Annotated[
        str | None,
        typer.Option(help="The zone --cron is read in, e.g. Europe/Berlin (default UTC)."),
    ] = None,
    jitter_seconds: Annotated[
        float | None,
        typer.Option(help="Each runner waits a random 0 to this many seconds before firing."),
    ] = None,
    catch_up_seconds: Annotated[
        float | None,
        typer.Option(
            help="After all runners were down, fire the ticks missed at most this old "
            "(default 60); older ones are counted as missed."
        ),
    ] = None,
    start: TimeOption = None,
    end: TimeOption = None,
    priority: PriorityOption = 0,
    expires_in: Annotated[
        float | None,
        typer.Option(
            min=0,
            metavar="SECONDS",
            help="Never deliver a tick's message after this many seconds from its publish.",
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Create a schedule: each tick publishes --payload (and the --attribute values) to
    --topic, with the attributes 'schedule' and 'schedule_time' added, at --priority, and
    never delivered after --expires-in seconds if given.

    Ticks before --start or from --end on never fire. Nothing fires until some process runs
    'pawn-queue schedules run' (or run_schedules()); each tick fires once, however many do.
    """
    opts = options(ctx, json_output)
    if (cron is None) == (every is None):
        fail("give exactly one of --cron and --every", EXIT_USAGE)
    given: dict[str, Any] = {
        "timezone": timezone,
        "jitter_seconds": jitter_seconds,
        "catch_up_seconds": catch_up_seconds,
    }
    # Left out when not given: the library's defaults apply.
    settings = {key: value for key, value in given.items() if value is not None}
    value = _payload(payload)
    attributes = attribute_options(attribute)
    since, until = _moment(start, "--start"), _moment(end, "--end")
    if since is not None and until is not None and until <= since:
        fail(f"--end: got {end!r}, must be after --start {start!r}", EXIT_USAGE)

    async def main() -> Schedule:
        async with open_queue(opts) as pq:
            try:
                return await pq.create_schedule(
                    name,
                    topic,
                    cron=cron,
                    every=every,
                    payload=value,
                    attributes=attributes,
                    start=since,
                    end=until,
                    priority=priority,
                    expires_in=expires_in,
                    **settings,
                )
            except PayloadError as exc:  # a value refused, as a bad cron is
                raise CliError(str(exc), EXIT_USAGE) from None
            except ScheduleExistsError:
                raise CliError(
                    f"schedule {name!r} exists (delete it first to create it anew)"
                ) from None

    schedule = run(ctx, main)
    if opts.json:
        print_json(schedule_dict(schedule))
    else:
        line = f"publishes to {schedule.topic} {_when(schedule)}{_what(schedule)}"
        typer.echo(f"schedule {name} created: {line}", err=True)


@schedules_app.command("list")
def schedules_list(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """List the schedules (by name): topic, when, the priority and expiry of their ticks,
    paused."""
    opts = options(ctx, json_output)

    async def main() -> list[Schedule]:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.list_schedules()

    schedules = run(ctx, main)
    if opts.json:
        print_json([schedule_dict(s) for s in schedules])
        return
    table = Table(title=f"schedules ({len(schedules)})")
    for column in ("schedule", "topic", "when", "priority", "expires_in", "paused", "payload"):
        table.add_column(column)
    for schedule in schedules:
        table.add_row(
            schedule.name,
            schedule.topic,
            _when(schedule),
            str(schedule.priority),
            shown(schedule.expires_in),
            "yes" if schedule.paused else "no",
            short(schedule.payload, 40),
        )
    stdout_console().print(table)


@schedules_app.command("show")
def schedules_show(ctx: typer.Context, name: NameArgument, json_output: JsonOption = False) -> None:
    """A schedule's definition and stats: last and next fire time, ticks fired and missed
    (over the tick markers kept, the last hour at least), paused."""
    opts = options(ctx, json_output)

    async def main() -> tuple[Schedule, ScheduleStats]:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.schedule(name), await pq.schedule_stats(name)

    schedule, stats = run(ctx, main)
    if opts.json:
        print_json({**schedule_dict(schedule), "stats": stats_dict(stats)})
        return
    table = Table(title=f"schedule {name}", show_header=False)
    table.add_column("name")
    table.add_column("value")
    fields = schedule_dict(schedule)
    del fields["schedule"]
    for key, value in fields.items():
        table.add_row(key, _shown(key, value))
    table.add_section()
    for key, value in stats_dict(stats).items():
        if key != "paused":  # shown above
            table.add_row(key, _shown(key, value))
    stdout_console().print(table)


def _shown(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("payload", "attributes"):
        return short(value, 60)
    return shown(value)


@schedules_app.command("pause")
def schedules_pause(ctx: typer.Context, name: NameArgument) -> None:
    """Stop firing a schedule (runners see it within about 5 s); ticks while paused are
    skipped, not caught up."""
    _set_paused(ctx, name, True)
    typer.echo(f"schedule {name} paused", err=True)


@schedules_app.command("resume")
def schedules_resume(ctx: typer.Context, name: NameArgument) -> None:
    """Fire a paused schedule again, from its next tick on."""
    _set_paused(ctx, name, False)
    typer.echo(f"schedule {name} resumed", err=True)


def _set_paused(ctx: typer.Context, name: str, paused: bool) -> None:
    opts = options(ctx)

    async def main() -> None:
        async with open_queue(opts, must_exist=True) as pq:
            if paused:
                await pq.pause_schedule(name)
            else:
                await pq.resume_schedule(name)

    run(ctx, main)


@schedules_app.command("trigger")
def schedules_trigger(ctx: typer.Context, name: NameArgument) -> None:
    """Publish one tick now (its schedule_time is now), paused or not; prints the message id."""
    opts = options(ctx)

    async def main() -> str:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.trigger_schedule(name)

    typer.echo(run(ctx, main))


@schedules_app.command("delete")
def schedules_delete(ctx: typer.Context, name: NameArgument, yes: YesOption = False) -> None:
    """Delete a schedule and its tick markers; runners stop firing it within about 5 s.
    Messages it published stay."""
    if not yes and not typer.confirm(f"delete schedule {name!r}?"):
        fail("not confirmed; nothing deleted (use --yes)")
    opts = options(ctx)

    async def main() -> None:
        async with open_queue(opts, must_exist=True) as pq:
            await pq.delete_schedule(name)

    run(ctx, main)
    typer.echo(f"schedule {name} deleted", err=True)


@schedules_app.command("run")
def schedules_run(
    ctx: typer.Context,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus metrics (ticks fired, missed, how late) on this port (0: "
            "any free port); needs the metrics extra.",
        ),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address of /metrics.")] = "127.0.0.1",
) -> None:
    """Fire the ticks of every schedule of the queue until SIGTERM or SIGINT, then exit 0.

    Run it in as many processes and hosts as you like: each tick fires once. Schedules
    created, changed, paused or deleted meanwhile are seen within about 5 s. Logs at info
    unless --log-level.
    """
    opts = options(ctx)
    setup_logging(opts.log_level or "info")
    if metrics_port is not None:
        require_extra("prometheus_client", "metrics", "--metrics-port")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # In place of the CLI's own (exit 130/143): stopping is how a runner ends.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, stop.set)
        metrics = None
        if metrics_port is not None:
            from pawn_queue.metrics import default_metrics, start_exporter

            metrics = default_metrics()
            try:
                server, _ = start_exporter(metrics_port, metrics_host)
            except OSError as exc:
                raise CliError(f"cannot listen on {metrics_host}:{metrics_port}: {exc}") from None
            host = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
            # The port bound, which --metrics-port 0 leaves to the system.
            typer.echo(f"serving metrics on http://{host}:{server.server_port}/metrics", err=True)
        async with open_queue(opts, metrics) as pq:
            await _run_until(pq, stop)

    run(ctx, main)
    typer.echo("stopped", err=True)


async def _run_until(pq: PawnQueue, stop: asyncio.Event) -> None:
    """``run_schedules()`` until ``stop`` is set; its error, if it fails first."""
    try:
        names = [schedule.name for schedule in await pq.list_schedules()]
    except RootNotFoundError:  # a new local directory: the runner's first write creates it
        names = []
    listed = ", ".join(names) if names else "none yet"
    typer.echo(f"running schedules ({listed}); stop with Ctrl-C or SIGTERM", err=True)
    runner = asyncio.create_task(pq.run_schedules())
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({runner, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (runner, stopped):
            task.cancel()
        for task in (runner, stopped):
            with contextlib.suppress(asyncio.CancelledError):
                await task
