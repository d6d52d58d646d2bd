"""Shared pieces of the ``pawn-queue`` command line: options, connection, errors, output.

Only the CLI modules import this (it needs Typer and Rich, the ``cli`` extra).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import logging
import math
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from pawn_queue._protocol import layout
from pawn_queue._protocol.counts import BatchSizes, Counts, read_topic
from pawn_queue._protocol.topics import NotGiven, TopicSettings
from pawn_queue.client import PawnQueue
from pawn_queue.config import URL_ENV_VAR, PawnQueueConfig, load_config
from pawn_queue.exceptions import ArgumentError, ConfigError, PawnQueueError
from pawn_queue.store import open_store

if TYPE_CHECKING:
    from pawn_queue.metrics import QueueMetrics

T = TypeVar("T")

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
EXIT_USAGE = 2
"""The exit code of a command refused before it did anything: a bad option or argument."""


class CliError(Exception):
    """A human error: printed as one line on stderr, exit code 1 (2 for usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Options:
    """The global options, kept in ``ctx.obj``."""

    url: str | None = None
    config: Path | None = None
    json: bool = False
    debug: bool = False
    log_level: str | None = None  # None: the command's default


JsonOption = Annotated[bool, typer.Option("--json", help="Output as JSON on stdout.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
SubscriptionOption = Annotated[
    str | None,
    typer.Option(
        "--subscription",
        metavar="NAME",
        help="That subscription of the topic instead of the topic's own messages.",
    ),
]
PriorityOption = Annotated[
    int, typer.Option(min=0, max=9, help="0 (the default, the lowest) to 9 (the highest).")
]
"""``--priority`` of ``publish`` and ``schedules create``: a publish's ``priority``."""
NOT_GIVEN = NotGiven(None)  # an option left out


def where(topic: str, subscription: str | None) -> str:
    """How output names a queue: ``orders``, or ``subscription billing of orders``."""
    return topic if subscription is None else f"subscription {subscription} of {topic}"


def with_subscription(fields: dict[str, Any], subscription: str | None) -> dict[str, Any]:
    """``fields`` (JSON output about a topic) with ``"subscription"`` after ``"topic"``,
    when there is one: output about a topic's own queue stays as it was."""
    if subscription is None:
        return fields
    out: dict[str, Any] = {}
    for key, value in fields.items():
        out[key] = value
        if key == "topic":
            out["subscription"] = subscription
    return out


def options(ctx: typer.Context, json_output: bool = False) -> Options:
    """The global options; ``json_output`` is the command's own ``--json``."""
    obj = ctx.find_root().obj
    opts = obj if isinstance(obj, Options) else Options()
    if json_output:
        opts.json = True
    return opts


def setup_logging(level: str) -> None:
    """Library log lines (``key=value`` events) go to stderr at ``level`` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("pawn_queue")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def build_config(opts: Options) -> PawnQueueConfig:
    """``--url``, else ``--config``, else the ``PAWNQUEUE_*`` environment."""
    if opts.url and opts.config:
        raise CliError("give either --url or --config, not both", EXIT_USAGE)
    if opts.url:
        return PawnQueueConfig.from_url(opts.url)
    if opts.config is not None:
        if not opts.config.is_file():
            raise CliError(f"config file not found: {opts.config}", EXIT_USAGE)
        return load_config(opts.config)
    if any(k.startswith("PAWNQUEUE_") and v for k, v in os.environ.items()):
        return PawnQueueConfig.from_env()
    raise CliError(
        f"no store given: use --url (e.g. file://./queue), --config FILE or set {URL_ENV_VAR}",
        EXIT_USAGE,
    )


def open_queue(
    opts: Options,
    metrics: QueueMetrics | None = None,
    config: PawnQueueConfig | None = None,
    *,
    must_exist: bool = False,
) -> PawnQueue:
    """A queue (not set up yet); with ``metrics`` its store requests and messages are observed.

    ``must_exist`` (commands that only read): a local directory that does not exist raises
    RootNotFound naming it, before anything (a consumer's registration) could create it.
    A missing S3 bucket fails at setup either way.
    """
    config = config or build_config(opts)
    if must_exist and config.backend == "filesystem" and config.filesystem is not None:
        from pawn_queue.store.filesystem import require_root

        require_root(config.filesystem.path)
    if metrics is None:
        return PawnQueue(config)
    return PawnQueue(
        config, store=metrics.wrap_store(open_store(config)), observers=[metrics.observer]
    )


async def message_counts(pq: PawnQueue, topic: str, subscription: str | None = None) -> Counts:
    """The counts of the topic, or of one of its subscriptions, in messages as the dashboard
    shows them, with the objects beside them (``pending_objects``...): ``topic_stats`` counts
    objects, and one batch object holds many messages (a GET each tells how many)."""
    queue = layout.queue(topic, subscription)
    await pq.runtime.topics.settings(queue)  # TopicNotFoundError, as topic_stats raises it
    visibility = pq.config.polling.visibility_timeout_seconds
    reading = await read_topic(pq.store, queue, visibility, pq.runtime.clock, BatchSizes())
    return reading.counts


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code`` (anywhere in a command)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def require_extra(module: str, extra: str, what: str) -> None:
    """Exit 2 (missing_extra) unless ``module``, of ``extra``, imports."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        missing_extra(extra, what, exc)


def missing_extra(extra: str, what: str, error: ImportError) -> NoReturn:
    """Exit 2 naming the extra to install: ``what`` (a command, an option) is refused before
    it does anything."""
    install = f"pip install 'pawn-queue[{extra}]'"
    fail(f"{what} needs the {extra} extra: {install} ({error})", EXIT_USAGE)


def finite_seconds(value: float | None, option: str) -> None:
    """Exit 2 if ``value`` (an option's seconds) is infinite: the option's ``min`` already
    refuses a negative value and NaN, not infinity."""
    if value is not None and not math.isfinite(value):
        fail(f"{option}: expected a finite number of seconds, got {value}", EXIT_USAGE)


def run(ctx: typer.Context, main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` on a fresh event loop; errors become one line on stderr and exit 1, or
    2 for a value refused (ArgumentError, ConfigError: an option, an argument, the config),
    as typer's own checks.

    ``--debug`` prints the traceback as well. Ctrl-C exits with 130, SIGTERM with 143: both
    first release what the command holds (its messages can be consumed again at once).
    """
    opts = options(ctx)
    try:
        return asyncio.run(_call(main))
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None
    except _Terminated:
        typer.echo("terminated", err=True)
        raise typer.Exit(128 + signal.SIGTERM) from None
    except CliError as exc:
        _report(opts, f"error: {exc}", exc)
        raise typer.Exit(exc.code) from None
    except (ArgumentError, ConfigError) as exc:  # a value refused: a usage error
        _report(opts, f"error: {exc}", exc)
        raise typer.Exit(EXIT_USAGE) from None
    except PawnQueueError as exc:
        _report(opts, f"error: {exc}", exc)
        raise typer.Exit(1) from None
    except Exception as exc:
        hint = "" if opts.debug else " (run with --debug for the traceback)"
        _report(opts, f"error: unexpected {type(exc).__name__}: {exc}{hint}", exc)
        raise typer.Exit(1) from None


class _Terminated(Exception):
    """The command was stopped by SIGTERM."""


async def _call(main: Callable[[], Awaitable[T]]) -> T:
    # SIGTERM cancels the command as Ctrl-C does, so its cleanup (releasing leases) runs.
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # no signals here
        loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await main()
    except asyncio.CancelledError:
        if terminated:
            raise _Terminated from None
        raise
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGTERM)


def _report(opts: Options, line: str, exc: BaseException) -> None:
    if opts.debug:
        traceback.print_exception(exc, file=sys.stderr)
    first = line.splitlines()[0] if line else "error"
    typer.echo(first, err=True)


# -- output ---------------------------------------------------------------------------------


def stdout_console() -> Console:
    # Not a terminal (a pipe, a test): wide enough for ids and timestamps.
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def stderr_console() -> Console:
    return Console(stderr=True)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, default=str, ensure_ascii=False, indent=2))


def json_line(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


def attribute_options(values: list[str] | None) -> dict[str, str]:
    """The ``--attribute KEY=VALUE`` options given, as attributes (a usage error if one has
    no ``=`` or no key)."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--attribute: expected KEY=VALUE, got {item!r}", EXIT_USAGE)
        out[key] = value
    return out


def payload_fields(payload: Any) -> dict[str, Any]:
    """``{"payload": ...}``, or ``{"payload_base64": ...}`` for a bytes payload."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return {"payload_base64": base64.b64encode(bytes(payload)).decode("ascii")}
    return {"payload": payload}


def shown(value: object) -> str:
    """A setting as output shows it: ``none`` for no limit, floats without a trailing .0."""
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def settings_line(settings: TopicSettings) -> str:
    return " ".join(f"{key}={shown(value)}" for key, value in asdict(settings).items())


def limit(value: str | None, option: str, *, whole: bool) -> object:
    """A limit given as text: not given (NOT_GIVEN), ``none`` (clear it) or a number."""
    if value is None:
        return NOT_GIVEN
    if value.strip().lower() == "none":
        return None
    try:
        return int(value) if whole else float(value)
    except ValueError:
        what = "a whole number" if whole else "a number"
        fail(f"{option}: expected {what} or 'none', got {value!r}", EXIT_USAGE)


def purge_confirmed(
    ctx: typer.Context,
    *,
    confirm: str,
    fields: dict[str, Any],
    done: str,
    purge: Callable[[PawnQueue], Awaitable[int]],
    yes: bool,
    json_output: bool,
) -> None:
    """Ask ``confirm`` (unless ``yes``), run ``purge``, say ``done`` with the count (``{}``
    in it), or with ``--json`` print ``fields`` and ``"purged"``."""
    if not yes and not typer.confirm(confirm):
        fail("not confirmed; nothing deleted (use --yes)")
    opts = options(ctx, json_output)

    async def main() -> int:
        async with open_queue(opts) as pq:
            return await purge(pq)

    count = run(ctx, main)
    if opts.json:
        print_json({**fields, "purged": count})
    else:
        typer.echo(done.format(count))


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json_line(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# The settings a topic and a subscription share, as options: given when created...
MaxReceiveCountOption = Annotated[
    int | None, typer.Option(help="Dead-letter a message received more often than this.")
]
RetentionSecondsOption = Annotated[
    float | None, typer.Option(help="Expire messages not consumed within this.")
]
RetentionActionOption = Annotated[
    str | None, typer.Option(help="What expiry does: delete (default) or dead_letter.")
]
# ...and changed ('none' clears a limit).
MaxReceiveCountLimit = Annotated[
    str | None, typer.Option(metavar="N|none", help="Dead-letter after N receives.")
]
RetentionSecondsLimit = Annotated[
    str | None, typer.Option(metavar="SECONDS|none", help="Expire messages after this.")
]
RetentionActionChange = Annotated[
    str | None, typer.Option(help="What expiry does: delete or dead_letter.")
]
