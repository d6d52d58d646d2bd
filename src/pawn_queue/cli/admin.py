"""``pawn-queue topics ...``, ``dlq ...``, ``consumers`` and ``producers``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue._internal.durations import short_age
from pawn_queue.cli.common import (
    EXIT_USAGE,
    CliError,
    JsonOption,
    fail,
    open_queue,
    options,
    payload_fields,
    print_json,
    run,
    short,
    stdout_console,
)
from pawn_queue.client import PawnQueue
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.exceptions import TopicSettingsConflictError
from pawn_queue.registry import Liveness
from pawn_queue.topics import NotGiven, TopicSettings, TopicStats, given_settings

topics_app = typer.Typer(
    help="Create, update, list, show, purge and delete topics; show their counts.",
    no_args_is_help=True,
)
dlq_app = typer.Typer(help="Dead letters: list, show, redrive, purge.", no_args_is_help=True)

NOT_GIVEN = NotGiven(None)  # an option left out
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


# -- topics ---------------------------------------------------------------------------------


@topics_app.command("list")
def topics_list(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """List the topics (sorted)."""
    opts = options(ctx, json_output)

    async def main() -> list[str]:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.list_topics()

    names = run(ctx, main)
    if opts.json:
        print_json(names)
    else:
        for name in names:
            typer.echo(name)


def _conflict(exc: TopicSettingsConflictError) -> CliError:
    shown = ", ".join(
        f"{name} is {_shown(stored)}, asked {_shown(asked)}"
        for name, (stored, asked) in exc.differences.items()
    )
    return CliError(
        f"topic {exc.topic} exists with other settings: {shown} "
        f"(change them with 'pawn-queue topics update')"
    )


def _shown(value: object) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


@topics_app.command("create")
def topics_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    max_receive_count: Annotated[
        int | None, typer.Option(help="Dead-letter a message received more often than this.")
    ] = None,
    retention_seconds: Annotated[
        float | None, typer.Option(help="Expire messages not consumed within this.")
    ] = None,
    retention_action: Annotated[
        str | None, typer.Option(help="What expiry does: delete (default) or dead_letter.")
    ] = None,
    max_pending: Annotated[
        int | None, typer.Option(help="publish waits (then fails) at this many pending.")
    ] = None,
    dedup_window_seconds: Annotated[
        float | None, typer.Option(help="How long a dedup id is remembered (default 300).")
    ] = None,
) -> None:
    """Create a topic, or check that it exists; never changes its settings.

    An existing topic is fine if the settings given match the stored ones (settings not
    given are not compared); a difference is an error. Change settings with 'topics update'.
    """
    opts = options(ctx)
    options_given: dict[str, Any] = {
        "max_receive_count": max_receive_count,
        "retention_seconds": retention_seconds,
        "max_pending": max_pending,
        "dedup_window_seconds": dedup_window_seconds,
        "retention_action": retention_action,
    }
    given = {key: value for key, value in options_given.items() if value is not None}

    async def main() -> None:
        async with open_queue(opts) as pq:
            try:
                await pq.create_topic(name, **given)
            except TopicSettingsConflictError as exc:
                raise _conflict(exc) from None

    run(ctx, main)
    typer.echo(f"topic {name} ready", err=True)


def _limit(value: str | None, option: str, *, whole: bool) -> object:
    """A limit given as text: not given (None), ``none`` (clear it) or a number."""
    if value is None:
        return NOT_GIVEN
    if value.strip().lower() == "none":
        return None
    try:
        return int(value) if whole else float(value)
    except ValueError:
        what = "a whole number" if whole else "a number"
        fail(f"{option}: expected {what} or 'none', got {value!r}", EXIT_USAGE)


@topics_app.command("update")
def topics_update(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    max_receive_count: Annotated[
        str | None, typer.Option(metavar="N|none", help="Dead-letter after N receives.")
    ] = None,
    retention_seconds: Annotated[
        str | None, typer.Option(metavar="SECONDS|none", help="Expire messages after this.")
    ] = None,
    retention_action: Annotated[
        str | None, typer.Option(help="What expiry does: delete or dead_letter.")
    ] = None,
    max_pending: Annotated[
        str | None, typer.Option(metavar="N|none", help="publish waits at this many pending.")
    ] = None,
    dedup_window_seconds: Annotated[
        float | None, typer.Option(help="How long a dedup id is remembered.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Change the settings given ('none' clears a limit) and keep the others.

    Other processes see the change within 30 s (they cache topic settings that long).
    """
    opts = options(ctx, json_output)
    options_given = (
        max_receive_count,
        retention_seconds,
        retention_action,
        max_pending,
        dedup_window_seconds,
    )
    if all(value is None for value in options_given):
        fail(
            "nothing to update: give at least one of --max-receive-count, "
            "--retention-seconds, --retention-action, --max-pending, --dedup-window-seconds",
            EXIT_USAGE,
        )
    given = given_settings(
        max_receive_count=_limit(max_receive_count, "--max-receive-count", whole=True),
        retention_seconds=_limit(retention_seconds, "--retention-seconds", whole=False),
        max_pending=_limit(max_pending, "--max-pending", whole=True),
        dedup_window_seconds=NOT_GIVEN if dedup_window_seconds is None else dedup_window_seconds,
        retention_action=NOT_GIVEN if retention_action is None else retention_action,
    )

    async def main() -> TopicSettings:
        async with open_queue(opts) as pq:
            return await pq.update_topic(name, **given)

    settings = run(ctx, main)
    if opts.json:
        print_json({"topic": name, "settings": asdict(settings)})
    else:
        typer.echo(f"topic {name} updated: {_settings_line(settings)}", err=True)


def _settings_line(settings: TopicSettings) -> str:
    return " ".join(f"{key}={_shown(value)}" for key, value in asdict(settings).items())


@topics_app.command("show")
def topics_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    json_output: JsonOption = False,
) -> None:
    """A topic's settings and approximate counts."""
    opts = options(ctx, json_output)

    async def main() -> tuple[TopicSettings, TopicStats]:
        async with open_queue(opts, must_exist=True) as pq:
            settings = await pq.topic_settings(name)
            return settings, await pq.topic_stats(name)

    settings, stats = run(ctx, main)
    if opts.json:
        print_json({"topic": name, "settings": asdict(settings), "stats": asdict(stats)})
        return
    table = Table(title=f"topic {name}", show_header=False)
    table.add_column("name")
    table.add_column("value", justify="right")
    for key, value in asdict(settings).items():
        table.add_row(key, _shown(value))
    table.add_section()
    for key, value in asdict(stats).items():
        table.add_row(key, short_age(value) if key == "oldest_age_seconds" else str(value))
    stdout_console().print(table)


@topics_app.command("purge")
def topics_purge(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    yes: YesOption = False,
    json_output: JsonOption = False,
) -> None:
    """Delete all messages of a topic (pending, in flight, delayed); keep its dead letters.

    A consumer holding a purged message finds it gone: see docs/protocol.md.
    """
    confirm = f"delete all messages of topic {name!r}?"
    _purge(ctx, name, confirm, "message objects", PawnQueue.purge_topic, yes, json_output)


@topics_app.command("delete")
def topics_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    yes: YesOption = False,
) -> None:
    """Delete a topic with all its messages, leases and dead letters."""
    if not yes and not typer.confirm(f"delete topic {name!r} and all its messages?"):
        fail("not confirmed; nothing deleted (use --yes)")
    opts = options(ctx)

    async def main() -> None:
        async with open_queue(opts) as pq:
            await pq.delete_topic(name)

    run(ctx, main)
    typer.echo(f"topic {name} deleted", err=True)


@topics_app.command("stats")
def topics_stats(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="One topic (default: all).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Approximate pending, in-flight, delayed, dead-letter counts and the oldest age."""
    opts = options(ctx, json_output)

    async def main() -> list[dict[str, Any]]:
        async with open_queue(opts, must_exist=True) as pq:
            names = [name] if name else await pq.list_topics()
            rows = []
            for topic in names:
                stats = await pq.topic_stats(topic)
                rows.append({"topic": topic, **asdict(stats)})
            return rows

    rows = run(ctx, main)
    if opts.json:
        print_json(rows if name is None else rows[0])
        return
    table = Table(title="topics")
    table.add_column("topic")
    for column in ("pending", "in flight", "delayed", "dead letters", "oldest age"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["topic"],
            str(row["pending"]),
            str(row["in_flight"]),
            str(row["delayed"]),
            str(row["dead_letter"]),
            short_age(row["oldest_age_seconds"]),
        )
    stdout_console().print(table)


# -- dead letters ---------------------------------------------------------------------------


def _letter_dict(letter: DeadLetter) -> dict[str, Any]:
    body = asdict(letter)
    body.update(payload_fields(body.pop("payload")))
    return body


@dlq_app.command("list")
def dlq_list(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    json_output: JsonOption = False,
) -> None:
    """List a topic's dead letters with the reason, oldest first."""
    opts = options(ctx, json_output)

    async def main() -> list[DeadLetter]:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.dead_letters(topic, limit=limit)

    letters = run(ctx, main)
    if opts.json:
        print_json([_letter_dict(letter) for letter in letters])
        return
    table = Table(title=f"dead letters of {topic} ({len(letters)})")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("reason", "receives", "dead-lettered at", "error", "payload"):
        table.add_column(column)
    for letter in letters:
        table.add_row(
            letter.id,
            letter.reason,
            str(letter.receive_count),
            letter.dead_lettered_at,
            short(letter.error or "", 40),
            short(payload_fields(letter.payload).popitem()[1], 40),
        )
    stdout_console().print(table)


@dlq_app.command("show")
def dlq_show(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    message_id: Annotated[str, typer.Argument(metavar="ID", help="The dead letter's id.")],
) -> None:
    """Show one dead letter in full (JSON)."""
    opts = options(ctx)

    async def main() -> DeadLetter | None:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.dead_letter(topic, message_id)

    letter = run(ctx, main)
    if letter is None:
        fail(f"no dead letter {message_id!r} in topic {topic!r}")
    print_json(_letter_dict(letter))


@dlq_app.command("redrive")
def dlq_redrive(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="Only these ids (repeatable).")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    per_second: Annotated[float | None, typer.Option(help="Rate limit (messages/s).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Publish dead letters back to their topic (same id, payload, attributes)."""
    opts = options(ctx, json_output)

    async def main() -> int:
        async with open_queue(opts) as pq:
            return await pq.redrive(topic, ids=ids or None, limit=limit, per_second=per_second)

    count = run(ctx, main)
    asked = len(set(ids or ()))
    if opts.json:
        print_json({"topic": topic, "redriven": count})
    else:
        typer.echo(f"redrove {count} dead letters to {topic}")
    if count < asked:
        fail(f"{asked - count} of the {asked} ids given are not dead letters of {topic!r}")


@dlq_app.command("purge")
def dlq_purge(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    yes: YesOption = False,
    json_output: JsonOption = False,
) -> None:
    """Delete all dead letters of a topic."""
    confirm = f"delete all dead letters of {topic!r}?"
    _purge(ctx, topic, confirm, "dead letters", PawnQueue.purge_dead_letters, yes, json_output)


def _purge(
    ctx: typer.Context,
    topic: str,
    confirm: str,
    what: str,
    purge: Callable[[PawnQueue, str], Awaitable[int]],
    yes: bool,
    json_output: bool,
) -> None:
    """Ask ``confirm`` (unless ``yes``), run ``purge`` on ``topic``, say how many ``what``."""
    if not yes and not typer.confirm(confirm):
        fail("not confirmed; nothing deleted (use --yes)")
    opts = options(ctx, json_output)

    async def main() -> int:
        async with open_queue(opts) as pq:
            return await purge(pq, topic)

    count = run(ctx, main)
    if opts.json:
        print_json({"topic": topic, "purged": count})
    else:
        typer.echo(f"purged {count} {what} of {topic}")


# -- registry -------------------------------------------------------------------------------


def _registry(ctx: typer.Context, role: str, json_output: bool) -> None:
    opts = options(ctx, json_output)

    async def main() -> list[Liveness]:
        async with open_queue(opts, must_exist=True) as pq:
            window = 2 * pq.config.registry.heartbeat_interval_seconds
            return await pq.registry.liveness(role, window)  # type: ignore[arg-type]

    rows = run(ctx, main)
    if opts.json:
        print_json([_liveness_dict(row) for row in rows])
        return
    table = Table(title=role)
    table.add_column("name")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("host", "pid", "started", "last seen", "status"):
        table.add_column(column)
    for row in rows:
        instance = row.instance
        table.add_row(
            row.entry.name,
            row.entry.entity_id,
            instance.host if instance else "",
            str(instance.pid) if instance else "",
            instance.started_at if instance else row.entry.registered_at,
            f"{short_age(row.last_seen_seconds_ago)} ago",
            row.status,
        )
    stdout_console().print(table)


def _liveness_dict(row: Liveness) -> dict[str, Any]:
    instance = row.instance
    return {
        **asdict(row.entry),
        "host": instance.host if instance else None,
        "pid": instance.pid if instance else None,
        "started_at": instance.started_at if instance else None,
        "stopped_at": instance.stopped_at if instance else None,
        "last_seen_seconds_ago": row.last_seen_seconds_ago,
        "status": row.status,
        "alive": row.status == "alive",
    }


def consumers(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """Registered consumers, one row per process running each: host, pid, when it was
    last seen, and whether it is alive, stopped (cleanly) or dead.

    Alive: seen within two heartbeat intervals (registry.heartbeat_interval_seconds).
    """
    _registry(ctx, "consumers", json_output)


def producers(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """Registered producers, one row per process running each (a process that only
    publishes is listed after its first heartbeat), as ``consumers`` shows them."""
    _registry(ctx, "producers", json_output)
