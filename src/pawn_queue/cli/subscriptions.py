"""``pawn-queue subscriptions ...``: create, list, show, update, delete and seek a topic's
subscriptions.

A subscription receives a copy of every message published to its topic after it was
created (those whose attributes its filter takes), in a queue of its own; the consumers of
one subscription compete for its messages. A filter is JSON: an object mapping attribute
names to a string (equals), a list of strings (any of), ``{"exists": true|false}`` or
``{"prefix": "..."}``, all of which must hold.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from pawn_queue._internal.durations import short_age
from pawn_queue._protocol import layout
from pawn_queue._protocol.counts import Counts
from pawn_queue._protocol.filters import parse_filter
from pawn_queue._protocol.subscriptions import MAX_LINGER_SECONDS, Subscription
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
    YesOption,
    fail,
    json_line,
    limit,
    message_counts,
    open_queue,
    options,
    print_json,
    run,
    shown,
    stdout_console,
)
from pawn_queue.exceptions import ArgumentError, SubscriptionConflictError

subscriptions_app = typer.Typer(
    help="A topic's subscriptions (each gets a copy of every message published to the "
    "topic): create, list, show, update, delete, seek.",
    no_args_is_help=True,
)

TopicArgument = Annotated[str, typer.Argument(metavar="TOPIC", help="Topic name.")]
NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="Subscription name.")]
FilterOption = Annotated[
    str | None,
    typer.Option(
        "--filter",
        metavar="JSON",
        help='Attributes the messages must have, e.g. \'{"region": ["eu", "us"], "tier": '
        '{"exists": true}, "sku": {"prefix": "pawn-"}}\'; none: every message.',
    ),
]
StartOption = Annotated[
    str,
    typer.Option(
        "--start",
        metavar="latest|earliest|TIME",
        help="Where a new subscription starts: latest (what is published from now on), "
        "earliest or an ISO-8601 time with its zone (what the topic's replay window kept "
        "from then on).",
    ),
]
LingerOption = Annotated[
    float | None,
    typer.Option(
        "--linger-seconds",
        min=0,
        max=MAX_LINGER_SECONDS,
        help="Hold the subscription's copies back this long (0-1 s) so that more share one "
        "object: fewer requests for a filter that takes few messages, more latency on the "
        "publishes it takes. Default 0.",
    ),
]
# The settings a subscription has of a topic's (max_pending and the dedup window are the
# topic's own: they act when a message is published).
SETTINGS = ("max_receive_count", "retention_seconds", "retention_action")


def _filter(text: str) -> dict[str, Any] | None:
    """The filter ``--filter`` gives, in its canonical form (None: every message), or a
    usage error saying what is wrong with it."""
    if text.strip().lower() in ("none", "null", ""):
        return None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        fail(f"--filter: invalid JSON ({reason}): {text!r}", EXIT_USAGE)
    try:
        return parse_filter(value).to_json()
    except ArgumentError as exc:
        fail(f"--filter: {exc}", EXIT_USAGE)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _check(topic: str, name: str, given: dict[str, Any]) -> None:
    """Names and settings refused before the store is opened (a refusal creates nothing)."""
    layout.validate_name(topic, "topic name")
    layout.validate_name(name, "subscription name")
    TopicSettings(**given)  # ConfigError, as creating or updating it would raise


def _settings(subscription: Subscription) -> dict[str, Any]:
    settings = {key: getattr(subscription.settings, key) for key in SETTINGS}
    return settings | {"linger_seconds": subscription.linger_seconds}


def subscription_dict(subscription: Subscription) -> dict[str, Any]:
    return {
        "topic": subscription.topic,
        "subscription": subscription.name,
        "filter": subscription.filter,
        "created_at": subscription.created_at,
        "settings": _settings(subscription),
    }


def _filter_shown(value: dict[str, Any] | None) -> str:
    return "every message" if value is None else json_line(value)


def _line(subscription: Subscription) -> str:
    settings = " ".join(f"{key}={shown(value)}" for key, value in _settings(subscription).items())
    return f"filter={_filter_shown(subscription.filter)} {settings}"


def _conflict(exc: SubscriptionConflictError) -> CliError:
    differences = ", ".join(
        f"{name} is {_difference(name, stored)}, asked {_difference(name, asked)}"
        for name, (stored, asked) in exc.differences.items()
    )
    return CliError(
        f"subscription {exc.subscription} of topic {exc.topic} exists with other settings: "
        f"{differences} (change them with 'pawn-queue subscriptions update')"
    )


def _difference(name: str, value: object) -> str:
    if name == "filter":
        return _filter_shown(value)  # type: ignore[arg-type]
    return shown(value)


@subscriptions_app.command("create")
def subscriptions_create(
    ctx: typer.Context,
    topic: TopicArgument,
    name: NameArgument,
    filter_text: FilterOption = None,
    max_receive_count: MaxReceiveCountOption = None,
    retention_seconds: RetentionSecondsOption = None,
    retention_action: RetentionActionOption = None,
    start: StartOption = "latest",
    linger_seconds: LingerOption = None,
    json_output: JsonOption = False,
) -> None:
    """Create a subscription of a topic, or check that it exists; never changes it.

    From then on, every message published to the topic (that --filter takes) is also
    delivered to the subscription, to be consumed with 'pawn-queue consume TOPIC
    --subscription NAME' or an app's @app.subscriber(TOPIC, subscription=NAME); messages
    published before are not, unless --start names 'earliest' or a time: then a new
    subscription first receives what the topic's replay window kept from then on. Once a
    topic has subscriptions, its messages go to them only. It takes about 2 s, until every
    producer copies to it.

    An existing subscription is fine if the filter and the settings given match its own
    (settings not given are not compared); a difference is an error. Change them with
    'subscriptions update'.
    """
    opts = options(ctx, json_output)
    wanted = _filter(filter_text) if filter_text is not None else None
    options_given: dict[str, Any] = {
        "max_receive_count": max_receive_count,
        "retention_seconds": retention_seconds,
        "retention_action": retention_action,
    }
    given = {key: value for key, value in options_given.items() if value is not None}

    since = _start(start, "--start")

    async def main() -> Subscription:
        _check(topic, name, given)
        async with open_queue(opts) as pq:
            try:
                return await pq.create_subscription(
                    topic, name, filter=wanted, start=since, linger_seconds=linger_seconds, **given
                )
            except SubscriptionConflictError as exc:
                raise _conflict(exc) from None

    subscription = run(ctx, main)
    if opts.json:
        print_json(subscription_dict(subscription))
    else:
        typer.echo(f"subscription {name} of topic {topic} ready: {_line(subscription)}", err=True)


@subscriptions_app.command("list")
def subscriptions_list(
    ctx: typer.Context, topic: TopicArgument, json_output: JsonOption = False
) -> None:
    """List a topic's subscriptions (by name) with their filters."""
    opts = options(ctx, json_output)

    async def main() -> list[Subscription]:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.list_subscriptions(topic)

    subscriptions = run(ctx, main)
    if opts.json:
        print_json([subscription_dict(s) for s in subscriptions])
        return
    table = Table(title=f"subscriptions of {topic} ({len(subscriptions)})")
    for column in ("subscription", "filter", "created at", *SETTINGS, "linger_seconds"):
        table.add_column(column)
    for subscription in subscriptions:
        settings = [shown(value) for value in _settings(subscription).values()]
        table.add_row(
            subscription.name,
            _filter_shown(subscription.filter),
            subscription.created_at,
            *settings,
        )
    stdout_console().print(table)


@subscriptions_app.command("show")
def subscriptions_show(
    ctx: typer.Context,
    topic: TopicArgument,
    name: NameArgument,
    json_output: JsonOption = False,
) -> None:
    """A subscription's filter, settings and approximate counts (its lag: the age of its
    oldest pending message)."""
    opts = options(ctx, json_output)

    async def main() -> tuple[Subscription, Counts]:
        async with open_queue(opts, must_exist=True) as pq:
            await pq.topic_settings(topic)  # a missing topic, said as such
            subscription = await pq.subscription(topic, name)
            return subscription, await message_counts(pq, topic, name)

    subscription, stats = run(ctx, main)
    if opts.json:
        print_json({**subscription_dict(subscription), "stats": asdict(stats)})
        return
    table = Table(title=f"subscription {name} of topic {topic}", show_header=False)
    table.add_column("name")
    table.add_column("value", justify="right")
    table.add_row("filter", _filter_shown(subscription.filter))
    table.add_row("created_at", subscription.created_at)
    for key, value in _settings(subscription).items():
        table.add_row(key, shown(value))
    table.add_section()
    for key, value in asdict(stats).items():
        table.add_row(key, short_age(value) if key == "oldest_age_seconds" else str(value))
    stdout_console().print(table)


@subscriptions_app.command("update")
def subscriptions_update(
    ctx: typer.Context,
    topic: TopicArgument,
    name: NameArgument,
    filter_text: FilterOption = None,
    max_receive_count: MaxReceiveCountLimit = None,
    retention_seconds: RetentionSecondsLimit = None,
    retention_action: RetentionActionChange = None,
    linger_seconds: LingerOption = None,
    json_output: JsonOption = False,
) -> None:
    """Change the filter and settings given ('none' clears a limit, --filter none takes
    every message) and keep the others.

    A new filter applies to the messages published from about 2 s on (the command waits
    for it); those already in the subscription stay.
    """
    opts = options(ctx, json_output)
    changes = (filter_text, max_receive_count, retention_seconds, retention_action, linger_seconds)
    if all(v is None for v in changes):
        fail(
            "nothing to update: give at least one of --filter, --max-receive-count, "
            "--retention-seconds, --retention-action, --linger-seconds",
            EXIT_USAGE,
        )
    wanted: Any = ... if filter_text is None else _filter(filter_text)
    given = given_settings(
        max_receive_count=limit(max_receive_count, "--max-receive-count", whole=True),
        retention_seconds=limit(retention_seconds, "--retention-seconds", whole=False),
        retention_action=NOT_GIVEN if retention_action is None else retention_action,
    )

    async def main() -> Subscription:
        _check(topic, name, given)
        async with open_queue(opts, must_exist=True) as pq:
            await pq.topic_settings(topic)  # a missing topic, said as such
            return await pq.update_subscription(
                topic, name, filter=wanted, linger_seconds=linger_seconds, **given
            )

    subscription = run(ctx, main)
    if opts.json:
        print_json(subscription_dict(subscription))
    else:
        line = _line(subscription)
        typer.echo(f"subscription {name} of topic {topic} updated: {line}", err=True)


@subscriptions_app.command("delete")
def subscriptions_delete(
    ctx: typer.Context,
    topic: TopicArgument,
    name: NameArgument,
    yes: YesOption = False,
) -> None:
    """Delete a subscription with the messages and dead letters waiting in it.

    Messages published from then on are not copied to it; its consumers find nothing more
    to read. It takes about 2 s, until no producer copies to it any more.
    """
    asked = f"delete subscription {name!r} of topic {topic!r} and all its messages?"
    if not yes and not typer.confirm(asked):
        fail("not confirmed; nothing deleted (use --yes)")
    opts = options(ctx)

    async def main() -> None:
        _check(topic, name, {})
        async with open_queue(opts, must_exist=True) as pq:
            await pq.topic_settings(topic)  # a missing topic, said as such
            await pq.delete_subscription(topic, name)

    run(ctx, main)
    typer.echo(f"subscription {name} of topic {topic} deleted", err=True)


@subscriptions_app.command("seek")
def subscriptions_seek(
    ctx: typer.Context,
    topic: TopicArgument,
    name: NameArgument,
    to: Annotated[
        str,
        typer.Argument(
            metavar="earliest|latest|TIME",
            help="earliest, latest, or an ISO-8601 time with its zone (2026-11-27T10:00Z).",
        ),
    ],
    yes: YesOption = False,
    drop: Annotated[
        bool,
        typer.Option(
            "--drop",
            help="Seek even when messages that wait would be dropped and not brought back "
            "(the topic keeps no replay window, or not that far back).",
        ),
    ] = False,
) -> None:
    """Drop what waits in a subscription, then deliver again what the topic's replay
    window kept from a time on (latest: nothing; the subscription skips its backlog).
    Refused, changing nothing, when a message that waits could not be brought back,
    unless --drop."""
    since = _start(to, "TIME")
    asked = f"drop what waits in subscription {name!r} of topic {topic!r} and seek to {to}?"
    if not yes and not typer.confirm(asked):
        fail("not confirmed; nothing changed (use --yes)")
    opts = options(ctx)

    async def main() -> None:
        _check(topic, name, {})
        async with open_queue(opts, must_exist=True) as pq:
            await pq.seek(topic, name, since, drop=drop)

    run(ctx, main)
    typer.echo(f"subscription {name} of topic {topic} is at {to}", err=True)


def _start(text: str, what: str) -> str | datetime:
    """``latest``, ``earliest`` or an ISO-8601 time with a zone (a usage error if not)."""
    if text in ("latest", "earliest"):
        return text
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        fail(
            f"{what}: got {text!r}; give latest, earliest or an ISO-8601 time with its zone "
            "(2026-11-27T10:00:00+00:00)",
            EXIT_USAGE,
        )
    return when
