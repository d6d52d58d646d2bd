"""``pawn-queue dlq ...``: the dead letters of a topic, or of one of its subscriptions
(``--subscription NAME``): list, show, redrive, purge."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue.cli.common import (
    JsonOption,
    SubscriptionOption,
    YesOption,
    fail,
    open_queue,
    options,
    payload_fields,
    print_json,
    purge_confirmed,
    run,
    short,
    stdout_console,
    where,
    with_subscription,
)
from pawn_queue.client import PawnQueue
from pawn_queue.dead_letters import DeadLetter

dlq_app = typer.Typer(
    help="Dead letters of a topic or of one of its subscriptions: list, show, redrive, purge.",
    no_args_is_help=True,
)

TopicArgument = Annotated[str, typer.Argument(help="Topic name.")]


def _letter_dict(letter: DeadLetter) -> dict[str, Any]:
    body = asdict(letter)
    body.update(payload_fields(body.pop("payload")))
    return body


@dlq_app.command("list")
def dlq_list(
    ctx: typer.Context,
    topic: TopicArgument,
    subscription: SubscriptionOption = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    json_output: JsonOption = False,
) -> None:
    """List the dead letters of a topic (or of its --subscription) with the reason, oldest
    first."""
    opts = options(ctx, json_output)

    async def main() -> list[DeadLetter]:
        async with open_queue(opts, must_exist=True) as pq:
            await _exists(pq, topic, subscription)
            return await pq.dead_letters(topic, subscription=subscription, limit=limit)

    letters = run(ctx, main)
    if opts.json:
        print_json([_letter_dict(letter) for letter in letters])
        return
    table = Table(title=f"dead letters of {where(topic, subscription)} ({len(letters)})")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("reason", "priority", "receives", "dead-lettered at", "error", "payload"):
        table.add_column(column)
    for letter in letters:
        table.add_row(
            letter.id,
            letter.reason,
            str(letter.priority),
            str(letter.receive_count),
            letter.dead_lettered_at,
            short(letter.error or "", 40),
            short(payload_fields(letter.payload).popitem()[1], 40),
        )
    stdout_console().print(table)


@dlq_app.command("show")
def dlq_show(
    ctx: typer.Context,
    topic: TopicArgument,
    message_id: Annotated[str, typer.Argument(metavar="ID", help="The dead letter's id.")],
    subscription: SubscriptionOption = None,
) -> None:
    """Show one dead letter in full (JSON)."""
    opts = options(ctx)

    async def main() -> DeadLetter | None:
        async with open_queue(opts, must_exist=True) as pq:
            await _exists(pq, topic, subscription)
            return await pq.dead_letter(topic, message_id, subscription=subscription)

    letter = run(ctx, main)
    if letter is None:
        shown = f"topic {topic!r}" if subscription is None else _subscription(topic, subscription)
        fail(f"no dead letter {message_id!r} in {shown}")
    print_json(_letter_dict(letter))


@dlq_app.command("redrive")
def dlq_redrive(
    ctx: typer.Context,
    topic: TopicArgument,
    subscription: SubscriptionOption = None,
    ids: Annotated[
        list[str] | None, typer.Option("--id", help="Only these ids (repeatable).")
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many.")] = None,
    per_second: Annotated[float | None, typer.Option(help="Rate limit (messages/s).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Publish dead letters back to their topic, or to the --subscription they came from
    (same id, payload, attributes)."""
    opts = options(ctx, json_output)

    async def main() -> int:
        async with open_queue(opts) as pq:
            await _exists(pq, topic, subscription)
            return await pq.redrive(
                topic,
                subscription=subscription,
                ids=ids or None,
                limit=limit,
                per_second=per_second,
            )

    count = run(ctx, main)
    asked = len(set(ids or ()))
    if opts.json:
        print_json(with_subscription({"topic": topic, "redriven": count}, subscription))
    else:
        typer.echo(f"redrove {count} dead letters to {where(topic, subscription)}")
    if count < asked:
        shown = repr(topic) if subscription is None else _subscription(topic, subscription)
        fail(f"{asked - count} of the {asked} ids given are not dead letters of {shown}")


@dlq_app.command("purge")
def dlq_purge(
    ctx: typer.Context,
    topic: TopicArgument,
    subscription: SubscriptionOption = None,
    yes: YesOption = False,
    json_output: JsonOption = False,
) -> None:
    """Delete all dead letters of a topic (or of its --subscription)."""
    shown = repr(topic) if subscription is None else _subscription(topic, subscription)

    async def purge(pq: PawnQueue) -> int:
        await _exists(pq, topic, subscription)
        return await pq.purge_dead_letters(topic, subscription=subscription)

    purge_confirmed(
        ctx,
        confirm=f"delete all dead letters of {shown}?",
        fields=with_subscription({"topic": topic}, subscription),
        done=f"purged {{}} dead letters of {where(topic, subscription)}",
        purge=purge,
        yes=yes,
        json_output=json_output,
    )


async def _exists(pq: PawnQueue, topic: str, subscription: str | None) -> None:
    """With a subscription, say first that its topic is missing, if it is (the core's own
    check, of the subscription, would call the subscription missing instead)."""
    if subscription is not None:
        await pq.topic_settings(topic)


def _subscription(topic: str, subscription: str) -> str:
    return f"subscription {subscription!r} of topic {topic!r}"
