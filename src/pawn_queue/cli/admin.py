"""``pawn-queue topics ...``, ``consumers`` and ``producers``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue._internal.durations import short_age
from pawn_queue._protocol.counts import Counts
from pawn_queue._protocol.registry import Liveness
from pawn_queue._protocol.topics import TopicSettings, given_settings
from pawn_queue.cli.common import (
    EXIT_USAGE,
    NOT_GIVEN,
    CliError,
    JsonOption,
    MaxReceiveCountLimit,
    MaxReceiveCountOption,
    RetentionActionChange,
    RetentionActionOption,
    RetentionSecondsLimit,
    RetentionSecondsOption,
    SubscriptionOption,
    YesOption,
    fail,
    limit,
    message_counts,
    open_queue,
    options,
    print_json,
    purge_confirmed,
    run,
    settings_line,
    shown,
    stdout_console,
)
from pawn_queue.exceptions import TopicSettingsConflictError

topics_app = typer.Typer(
    help="Create, update, list, show, purge and delete topics; show their counts.",
    no_args_is_help=True,
)


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
    differences = ", ".join(
        f"{name} is {shown(stored)}, asked {shown(asked)}"
        for name, (stored, asked) in exc.differences.items()
    )
    return CliError(
        f"topic {exc.topic} exists with other settings: {differences} "
        f"(change them with 'pawn-queue topics update')"
    )


ClaimsOption = Annotated[
    str | None,
    typer.Option(
        metavar="message|second",
        help="'second' (a new topic's default): one claim covers a run of messages "
        "(pawn-queue 0.2.0 and older do not read them); 'message': a claim a message.",
    ),
]


@topics_app.command("create")
def topics_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    max_receive_count: MaxReceiveCountOption = None,
    retention_seconds: RetentionSecondsOption = None,
    retention_action: RetentionActionOption = None,
    max_pending: Annotated[
        int | None, typer.Option(help="publish waits (then fails) at this many pending.")
    ] = None,
    dedup_window_seconds: Annotated[
        float | None, typer.Option(help="How long a dedup id is remembered (default 300).")
    ] = None,
    replay_window_seconds: Annotated[
        float | None, typer.Option(help="Keep every message this long, for 'subscriptions seek'.")
    ] = None,
    claims: ClaimsOption = None,
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
        "replay_window_seconds": replay_window_seconds,
        "claims": claims,
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


@topics_app.command("update")
def topics_update(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    max_receive_count: MaxReceiveCountLimit = None,
    retention_seconds: RetentionSecondsLimit = None,
    retention_action: RetentionActionChange = None,
    max_pending: Annotated[
        str | None, typer.Option(metavar="N|none", help="publish waits at this many pending.")
    ] = None,
    dedup_window_seconds: Annotated[
        float | None, typer.Option(help="How long a dedup id is remembered.")
    ] = None,
    replay_window_seconds: Annotated[
        float | None, typer.Option(help="Keep every message this long (0: not at all).")
    ] = None,
    claims: ClaimsOption = None,
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
        replay_window_seconds,
        claims,
    )
    if all(value is None for value in options_given):
        fail(
            "nothing to update: give at least one of --max-receive-count, "
            "--retention-seconds, --retention-action, --max-pending, --dedup-window-seconds, "
            "--replay-window-seconds, --claims",
            EXIT_USAGE,
        )
    given = given_settings(
        max_receive_count=limit(max_receive_count, "--max-receive-count", whole=True),
        retention_seconds=limit(retention_seconds, "--retention-seconds", whole=False),
        max_pending=limit(max_pending, "--max-pending", whole=True),
        dedup_window_seconds=NOT_GIVEN if dedup_window_seconds is None else dedup_window_seconds,
        retention_action=NOT_GIVEN if retention_action is None else retention_action,
        replay_window_seconds=NOT_GIVEN if replay_window_seconds is None else replay_window_seconds,
        claims=NOT_GIVEN if claims is None else claims,
    )

    async def main() -> TopicSettings:
        async with open_queue(opts) as pq:
            return await pq.update_topic(name, **given)

    settings = run(ctx, main)
    if opts.json:
        print_json({"topic": name, "settings": asdict(settings)})
    else:
        typer.echo(f"topic {name} updated: {settings_line(settings)}", err=True)


@topics_app.command("show")
def topics_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    json_output: JsonOption = False,
) -> None:
    """A topic's settings, approximate counts and subscriptions.

    A topic with subscriptions keeps none of the messages published to it: each goes to
    its subscriptions (see 'pawn-queue subscriptions show TOPIC NAME' for their counts).
    """
    opts = options(ctx, json_output)

    async def main() -> tuple[TopicSettings, Counts, list[str]]:
        async with open_queue(opts, must_exist=True) as pq:
            settings = await pq.topic_settings(name)
            subscriptions = [s.name for s in await pq.list_subscriptions(name)]
            return settings, await message_counts(pq, name), subscriptions

    settings, stats, subscriptions = run(ctx, main)
    if opts.json:
        print_json(
            {
                "topic": name,
                "settings": asdict(settings),
                "stats": asdict(stats),
                "subscriptions": subscriptions,
            }
        )
        return
    table = Table(title=f"topic {name}", show_header=False)
    table.add_column("name")
    table.add_column("value", justify="right")
    for key, value in asdict(settings).items():
        table.add_row(key, shown(value))
    table.add_section()
    for key, value in asdict(stats).items():
        table.add_row(key, short_age(value) if key == "oldest_age_seconds" else str(value))
    table.add_section()
    table.add_row("subscriptions", ", ".join(subscriptions) or "none")
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
    purge_confirmed(
        ctx,
        confirm=f"delete all messages of topic {name!r}?",
        fields={"topic": name},
        done=f"purged {{}} message objects of {name}",
        purge=lambda pq: pq.purge_topic(name),
        yes=yes,
        json_output=json_output,
    )


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
    subscription: SubscriptionOption = None,
    json_output: JsonOption = False,
) -> None:
    """Approximate pending, in-flight, delayed, dead-letter counts and the oldest age.

    Of every topic and its subscriptions (a row each), of one topic, or with
    --subscription of one subscription of the topic (its lag: the oldest age).

    The counts are of messages, as the dashboard shows them: a batch object (publish
    --batch) is read to count its messages. --json adds the objects (pending_objects...).
    """
    opts = options(ctx, json_output)
    if subscription is not None and name is None:
        fail("--subscription needs the TOPIC it belongs to", EXIT_USAGE)

    async def main() -> list[dict[str, Any]]:
        async with open_queue(opts, must_exist=True) as pq:
            if name is not None:
                if subscription is not None:
                    await pq.topic_settings(name)  # a missing topic, said as such
                    stats = await message_counts(pq, name, subscription)
                    return [{"topic": name, "subscription": subscription, **asdict(stats)}]
                return [{"topic": name, **asdict(await message_counts(pq, name))}]
            rows = []
            for topic in await pq.list_topics():
                rows.append({"topic": topic, **asdict(await message_counts(pq, topic))})
                for sub in await pq.list_subscriptions(topic):
                    stats = await message_counts(pq, topic, sub.name)
                    rows.append({"topic": topic, "subscription": sub.name, **asdict(stats)})
            return rows

    rows = run(ctx, main)
    if opts.json:
        print_json(rows if name is None else rows[0])
        return
    table = Table(title="topics")
    table.add_column("topic")
    with_subscriptions = any("subscription" in row for row in rows)
    if with_subscriptions:
        table.add_column("subscription")
    for column in ("pending", "in flight", "delayed", "dead letters", "oldest age"):
        table.add_column(column, justify="right")
    for row in rows:
        first = [row["topic"], *([row.get("subscription", "")] if with_subscriptions else [])]
        table.add_row(
            *first,
            str(row["pending"]),
            str(row["in_flight"]),
            str(row["delayed"]),
            str(row["dead_letter"]),
            short_age(row["oldest_age_seconds"]),
        )
    stdout_console().print(table)


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
    publishes is listed after its first heartbeat), as 'pawn-queue consumers' shows them."""
    _registry(ctx, "producers", json_output)
