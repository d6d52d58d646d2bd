"""The ``pawn-queue`` command line (Typer + Rich, the ``cli`` extra).

The store comes from ``--url``, ``--config FILE`` or the ``PAWNQUEUE_*`` environment
(``PAWNQUEUE_URL`` and the credentials in ``PAWNQUEUE_S3_ACCESS_KEY`` /
``PAWNQUEUE_S3_SECRET_KEY``). Errors are one line on stderr and exit code 1 (2 for a usage
error); ``--debug`` adds the traceback. Listings take ``--json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from pawn_queue import __version__
from pawn_queue.cli_admin import consumers, dlq_app, producers, topics_app
from pawn_queue.cli_common import LOG_LEVELS, Options, setup_logging
from pawn_queue.cli_doctor import demo, doctor, metrics
from pawn_queue.cli_messages import consume, peek, publish

app = typer.Typer(
    name="pawn-queue",
    help="Operate a pawn-queue: topics, messages, dead letters, registry, store checks.",
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
        str, typer.Option(help=f"Library log level on stderr: {', '.join(LOG_LEVELS)}.")
    ] = "warning",
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = None,
) -> None:
    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"choose one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    setup_logging(log_level.lower())
    ctx.obj = Options(url=url, config=config, json=json_output, debug=debug, log_level=log_level)


app.add_typer(topics_app, name="topics")
app.add_typer(dlq_app, name="dlq")
app.command()(publish)
app.command()(consume)
app.command()(peek)
app.command()(consumers)
app.command()(producers)
app.command()(doctor)
app.command()(demo)
app.command()(metrics)


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
