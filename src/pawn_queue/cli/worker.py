"""``pawn-queue worker``: run an app's handlers (or one function's) as a service."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any

import typer

from pawn_queue.app import App
from pawn_queue.cli.common import (
    EXIT_USAGE,
    CliError,
    Options,
    build_config,
    fail,
    options,
    require_extra,
)
from pawn_queue.exceptions import PawnQueueError
from pawn_queue.service.logs import LOG_FORMATS, LogFormat, setup_logging
from pawn_queue.service.runner import WorkerOptions, run_worker
from pawn_queue.service.supervisor import supervise


def worker(
    ctx: typer.Context,
    target: Annotated[
        str,
        typer.Argument(
            help="module:app (an App), or module:function with --topic (one handler).",
            show_default=False,
        ),
    ],
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", "-t", help="Topic of a module:function handler (repeatable)."),
    ] = None,
    subscription: Annotated[
        str | None,
        typer.Option(
            help="A module:function handler reads this subscription of each --topic (created "
            "if missing) instead of the topics' own messages (an App declares it with "
            "@app.subscriber(subscription=...)).",
        ),
    ] = None,
    publish_to: Annotated[
        str | None, typer.Option(help="A module:function handler's results go to this topic.")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Handlers running at a time, per subscriber and process."),
    ] = None,
    max_in_flight: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Handlers running at a time per subscriber across every process and host "
            "reading the same topics or subscription.",
        ),
    ] = None,
    rate_limit: Annotated[
        str | None,
        typer.Option(
            help="Handler starts per subscriber across every process and host reading the "
            "same topics or subscription, such as 20/s or 5000/min.",
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="A module:function handler takes lists of up to this many payloads or "
            "messages (an App declares it with @app.subscriber(batch=...)).",
        ),
    ] = None,
    batch_wait: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="With --batch: seconds to collect messages from further polls, until a batch "
            "is full (default 0: what one poll brought).",
        ),
    ] = None,
    processes: Annotated[
        int, typer.Option(min=1, help="Worker processes (restarted if one dies).")
    ] = 1,
    grace: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Seconds running handlers may finish after SIGTERM/SIGINT "
            "(default: polling.shutdown_grace_seconds).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve /metrics, /healthz and /readyz on this port "
            "(with --processes N, process i on port + i).",
        ),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address of those endpoints.")] = "127.0.0.1",
    log_format: Annotated[
        str,
        typer.Option(
            help="One line per handled message (id, topic, receive count, duration, "
            "outcome): text or json.",
        ),
    ] = "text",
    create_topics: Annotated[
        bool, typer.Option(help="Create the topics the app uses if missing.")
    ] = False,
    schedules: Annotated[
        bool,
        typer.Option(
            "--schedules/--no-schedules",
            help="Run the queue's schedules beside the handlers, in every process (each tick "
            "fires once across them all); --no-schedules leaves that to other processes. "
            "An App's declared schedules are created at start either way.",
        ),
    ] = True,
    supervised: Annotated[bool, typer.Option(hidden=True)] = False,
) -> None:
    """Run handlers as a service until SIGTERM or SIGINT.

    The first signal stops claiming, lets running handlers finish within the grace period,
    gives every other message back at once and exits 0; a second one cuts the grace short
    (exit 3). Exit 1: the app could not start or a subscriber failed; 2: usage error.

    A subscriber reads its topics' own messages or, with @app.subscriber(subscription=...)
    or --subscription, that subscription of each topic: created at start if missing (about
    2 s the first time), it receives a copy of every message published from then on.

    Each process also runs the queue's schedules (every schedule, not only those the app
    declares with @app.schedule): each tick is published once across all the processes that
    run them. --no-schedules turns that off.
    """
    opts = options(ctx)
    level = opts.log_level or "info"
    if log_format not in LOG_FORMATS:
        fail(f"--log-format: choose one of {', '.join(LOG_FORMATS)}", EXIT_USAGE)
    fmt: LogFormat = "json" if log_format == "json" else "text"
    try:
        app = _load(target, topic or [], publish_to, opts, batch, batch_wait, subscription)
    except CliError as exc:
        fail(str(exc), exc.code)
    if metrics_port is not None:
        require_extra("prometheus_client", "metrics", "--metrics-port")
    try:
        app.set_limits(concurrency=concurrency, max_in_flight=max_in_flight, rate_limit=rate_limit)
    except PawnQueueError as exc:
        fail(str(exc), EXIT_USAGE)
    if create_topics:
        app.create_topics = True
    if processes > 1:
        setup_logging(fmt, level)

        def command_of(index: int) -> list[str]:
            return _child_command(
                ctx, opts, index, metrics_port=metrics_port, extra=["--log-format", fmt]
            )

        raise typer.Exit(supervise(command_of, processes))
    worker_options = WorkerOptions(
        grace=grace,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        log_format=fmt,
        log_level=level,
        supervised=supervised,
        schedules=schedules,
    )
    raise typer.Exit(run_worker(app, worker_options))


def _load(
    target: str,
    topics: list[str],
    publish_to: str | None,
    opts: Options,
    batch: int | None = None,
    batch_wait: float | None = None,
    subscription: str | None = None,
) -> App:
    """The app ``target`` names (``module:attribute``); a function becomes an app of one
    subscriber (a batch subscriber with ``batch``, one reading ``subscription`` of its
    topics). ``--url``/``--config`` replace the app's own store; an app without one, and a
    function, take the store as every command does (build_config)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(f"expected module:app or module:function, got {target!r}", EXIT_USAGE)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: modules of this directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}", EXIT_USAGE) from None
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise CliError(f"module {module_name!r} has no {attribute!r}", EXIT_USAGE)
        found = getattr(found, part)
    try:
        if isinstance(found, App):
            for_functions = (publish_to, batch, batch_wait, subscription)
            if topics or any(value is not None for value in for_functions):
                raise CliError(
                    "--topic, --subscription, --publish-to, --batch and --batch-wait are for "
                    "module:function (an App declares them in @app.subscriber)",
                    EXIT_USAGE,
                )
            if opts.url or opts.config or found.source is None:
                found.source = build_config(opts)
            return found
        if not callable(found):
            raise CliError(f"{target} is neither an App nor a function", EXIT_USAGE)
        if not topics:
            raise CliError(f"{target} is a function: give its topics with --topic", EXIT_USAGE)
        if batch_wait is not None and batch is None:
            raise CliError("--batch-wait needs --batch", EXIT_USAGE)
        app = App(build_config(opts), name="worker")
        app.subscriber(
            topics,
            publish_to=publish_to,
            batch=batch,
            batch_wait=batch_wait,
            subscription=subscription,
        )(found)
        return app
    except PawnQueueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def _child_command(
    ctx: typer.Context, opts: Options, index: int, *, metrics_port: int | None, extra: list[str]
) -> list[str]:
    """Child ``index``'s command line: this one, as one supervised process."""
    line = [sys.executable, "-m", "pawn_queue"]
    if opts.url:
        line += ["--url", opts.url]
    if opts.config is not None:
        line += ["--config", os.fspath(opts.config)]
    if opts.log_level:
        line += ["--log-level", opts.log_level]
    line += ["worker", *_own_arguments(ctx), "--processes", "1", "--supervised", *extra]
    if metrics_port is not None:
        line += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
    return line


def _own_arguments(ctx: typer.Context) -> list[str]:
    """This command's arguments but --processes, --metrics-port and --log-format (the
    child gets its own)."""
    params = ctx.params
    line = [str(params["target"])]
    for name in ("topic",):
        for value in params.get(name) or []:
            line += [f"--{name}", str(value)]
    valued = (
        *("subscription", "publish_to", "concurrency", "max_in_flight", "rate_limit"),
        *("batch", "batch_wait", "grace"),
    )
    for name in (*valued, "metrics_host"):
        if params.get(name) is not None:
            line += [f"--{name.replace('_', '-')}", str(params[name])]
    if params.get("create_topics"):
        line.append("--create-topics")
    if params.get("schedules") is False:
        line.append("--no-schedules")
    return line
