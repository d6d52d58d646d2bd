"""``pawn-queue topics ...``, ``dlq ...``, ``consumers`` and ``producers``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue.cli_common import (
    JsonOption,
    age,
    fail,
    open_queue,
    options,
    payload_fields,
    print_json,
    run,
    short,
    stdout_console,
)
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.envelope import now_utc

topics_app = typer.Typer(help="Create, list, delete topics and show their counts.")
dlq_app = typer.Typer(help="Dead letters: list, show, redrive, purge.")

YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


# -- topics ---------------------------------------------------------------------------------


@topics_app.command("list")
def topics_list(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """List the topics (sorted)."""
    opts = options(ctx, json_output)

    async def main() -> list[str]:
        async with open_queue(opts) as pq:
            return await pq.list_topics()

    names = run(ctx, main)
    if opts.json:
        print_json(names)
    else:
        for name in names:
            typer.echo(name)


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
        str, typer.Option(help="What expiry does: delete or dead_letter.")
    ] = "delete",
    max_pending: Annotated[
        int | None, typer.Option(help="publish waits (then fails) at this many pending.")
    ] = None,
    dedup_window_seconds: Annotated[
        float, typer.Option(help="How long a dedup id is remembered.")
    ] = 300.0,
) -> None:
    """Create a topic (idempotent; new settings replace the stored ones)."""
    opts = options(ctx)

    async def main() -> None:
        async with open_queue(opts) as pq:
            await pq.create_topic(
                name,
                max_receive_count=max_receive_count,
                retention_seconds=retention_seconds,
                max_pending=max_pending,
                dedup_window_seconds=dedup_window_seconds,
                retention_action=retention_action,
            )

    run(ctx, main)
    typer.echo(f"topic {name} ready", err=True)


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
        async with open_queue(opts) as pq:
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
            age(row["oldest_age_seconds"]),
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
    limit: Annotated[int | None, typer.Option(help="At most this many.")] = None,
    json_output: JsonOption = False,
) -> None:
    """List a topic's dead letters with the reason, oldest first."""
    opts = options(ctx, json_output)

    async def main() -> list[DeadLetter]:
        async with open_queue(opts) as pq:
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

    async def main() -> DeadLetter:
        async with open_queue(opts) as pq:
            for letter in await pq.dead_letters(topic):
                if letter.id == message_id:
                    return letter
        fail(f"no dead letter {message_id!r} in topic {topic!r}")

    print_json(_letter_dict(run(ctx, main)))


@dlq_app.command("redrive")
def dlq_redrive(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="Only these ids (repeatable).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many.")] = None,
    per_second: Annotated[float | None, typer.Option(help="Rate limit (messages/s).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Publish dead letters back to their topic (same id, payload, attributes)."""
    opts = options(ctx, json_output)

    async def main() -> int:
        async with open_queue(opts) as pq:
            return await pq.redrive(topic, ids=ids or None, limit=limit, per_second=per_second)

    count = run(ctx, main)
    if opts.json:
        print_json({"topic": topic, "redriven": count})
    else:
        typer.echo(f"redrove {count} dead letters to {topic}")


@dlq_app.command("purge")
def dlq_purge(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    yes: YesOption = False,
    json_output: JsonOption = False,
) -> None:
    """Delete all dead letters of a topic."""
    if not yes and not typer.confirm(f"delete all dead letters of {topic!r}?"):
        fail("not confirmed; nothing deleted (use --yes)")
    opts = options(ctx, json_output)

    async def main() -> int:
        async with open_queue(opts) as pq:
            return await pq.purge_dead_letters(topic)

    count = run(ctx, main)
    if opts.json:
        print_json({"topic": topic, "purged": count})
    else:
        typer.echo(f"purged {count} dead letters of {topic}")


# -- registry -------------------------------------------------------------------------------


def _registry(ctx: typer.Context, role: str, json_output: bool) -> None:
    opts = options(ctx, json_output)

    async def main() -> list[dict[str, Any]]:
        async with open_queue(opts) as pq:
            entries = await pq.registry.list(role)  # type: ignore[arg-type]
            window = 2 * pq.config.registry.heartbeat_interval_seconds
        now = now_utc()
        rows = []
        for entry in entries:
            try:
                seen_ago = (now - datetime.fromisoformat(entry.last_seen)).total_seconds()
            except ValueError:
                seen_ago = None
            alive = seen_ago is not None and seen_ago <= window
            rows.append({**asdict(entry), "last_seen_seconds_ago": seen_ago, "alive": alive})
        return rows

    rows = run(ctx, main)
    if opts.json:
        print_json(rows)
        return
    table = Table(title=role)
    table.add_column("name")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("registered", "last seen", "alive"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["name"],
            row["entity_id"],
            row["registered_at"],
            f"{age(row['last_seen_seconds_ago'])} ago",
            "yes" if row["alive"] else "no",
        )
    stdout_console().print(table)


def consumers(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """Registered consumers, when each was last seen and whether it is alive.

    Alive: seen within two heartbeat intervals (registry.heartbeat_interval_seconds).
    """
    _registry(ctx, "consumers", json_output)


def producers(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """Registered producers, when each was last seen and whether it is alive."""
    _registry(ctx, "producers", json_output)
