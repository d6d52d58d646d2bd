"""The ``pawn-queue`` command line (Typer + Rich, the ``cli`` extra).

The store comes from ``--url``, ``--config FILE`` or the ``PAWNQUEUE_*`` environment
(``PAWNQUEUE_URL`` and the credentials in ``PAWNQUEUE_S3_AWS_ACCESS_KEY_ID`` /
``PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY``). The global options go before or after the command.
Errors are one line on stderr and exit code 1 (2 for a usage error); ``--debug`` adds the
traceback. Listings take ``--json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:
    from typer import _click as click  # Typer 0.20 and later carry their own copy of Click
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef, import-not-found, unused-ignore]

from pawn_queue._version import __version__
from pawn_queue.cli.admin import consumers, producers, topics_app
from pawn_queue.cli.common import LOG_LEVELS, Options, setup_logging
from pawn_queue.cli.dashboard import dashboard
from pawn_queue.cli.dlq import dlq_app
from pawn_queue.cli.doctor import demo, doctor, metrics
from pawn_queue.cli.messages import consume, peek, publish
from pawn_queue.cli.schedules import schedules_app
from pawn_queue.cli.subscriptions import subscriptions_app
from pawn_queue.cli.worker import worker

# The global options, accepted anywhere on the line: before the command or after it.
_GLOBAL_FLAGS = frozenset({"--json", "--debug"})
_GLOBAL_VALUED = frozenset({"--url", "--config", "-c", "--log-level"})


class MissingValue(ValueError):
    """A global option at the end of the line, without its value."""


def hoist_global_options(args: list[str]) -> list[str]:
    """``args`` with the global options (and their values) moved to the front, in order, so
    ``pawn-queue topics list --url X`` means ``pawn-queue --url X topics list``. Nothing
    after ``--`` moves."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        name, has_value, _ = arg.partition("=")
        if arg in _GLOBAL_FLAGS or (name in _GLOBAL_VALUED and name.startswith("--") and has_value):
            front.append(arg)
        elif arg in _GLOBAL_VALUED:
            if i + 1 == len(args) or args[i + 1] == "--":
                raise MissingValue(arg)
            front.extend(args[i : i + 2])
            i += 1
        else:
            rest.append(arg)
        i += 1
    return front + rest


class _Root(TyperGroup):
    """The top command: global options anywhere, and usage errors as one line."""

    def parse_args(self, ctx: click.core.Context, args: list[str]) -> list[str]:
        try:
            hoisted = hoist_global_options(args)
        except MissingValue as exc:
            message = f"Option '{exc}' requires an argument."
            raise click.exceptions.UsageError(message, ctx) from None
        return super().parse_args(ctx, hoisted)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            # Not standalone: an exit or an error comes back here instead of being printed.
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.ClickException as exc:
            message = " ".join(exc.format_message().split())
            ctx = getattr(exc, "ctx", None)
            if isinstance(exc, click.exceptions.UsageError) and ctx is not None:
                message += f" (see '{ctx.command_path} --help')"
            typer.echo(f"error: {message}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_Root,
    name="pawn-queue",
    help="Operate a pawn-queue: topics, subscriptions, messages, dead letters, schedules, "
    "registry, store checks.",
    no_args_is_help=True,
    # Never print locals in a traceback: they may hold credentials.
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pawn-queue {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            help="Store URL: file://./queue, memory://, s3://bucket/prefix?endpoint_url=... "
            "(default: PAWNQUEUE_URL and the PAWNQUEUE_* environment)."
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Listings as JSON on stdout.")
    ] = False,
    debug: Annotated[bool, typer.Option(help="Show tracebacks of errors.")] = False,
    log_level: Annotated[
        str | None,
        typer.Option(
            help=f"Library log level on stderr: {', '.join(LOG_LEVELS)} "
            "(default: warning; info for the worker)."
        ),
    ] = None,
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = None,
) -> None:
    level = log_level.lower() if log_level is not None else None
    if level is not None and level not in LOG_LEVELS:
        raise typer.BadParameter(f"choose one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    setup_logging(level or "warning")
    ctx.obj = Options(url=url, config=config, json=json_output, debug=debug, log_level=level)


app.add_typer(topics_app, name="topics")
app.add_typer(subscriptions_app, name="subscriptions")
app.add_typer(dlq_app, name="dlq")
app.add_typer(schedules_app, name="schedules")
app.command()(publish)
app.command()(consume)
app.command()(peek)
app.command()(consumers)
app.command()(producers)
app.command()(doctor)
app.command()(demo)
app.command()(metrics)
app.command()(dashboard)
app.command()(worker)


def main() -> None:
    """The console script.

    Exits with ``os._exit`` once output is flushed: the S3 client's native threads can abort
    the interpreter's own shutdown (SIGABRT after all work is done, a few percent of runs),
    which would turn a successful command into exit code -6.
    """
    code: int = 0
    try:
        app()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)
