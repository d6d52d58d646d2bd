"""``pawn-queue dashboard``: the web dashboard (needs the ``dashboard`` extra)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from pawn_queue.cli.common import CliError, build_config, fail, missing_extra, options, run
from pawn_queue.dashboard.settings import TOKEN_ENV_VAR
from pawn_queue.exceptions import ArgumentError


def dashboard(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on; any but loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8080,
    token: Annotated[
        str | None,
        typer.Option(
            envvar=TOKEN_ENV_VAR,
            show_default=False,
            help="Require this token (16+ characters) from every client: open the page once "
            "as /?token=... . Required off loopback.",
        ),
    ] = None,
    allow_actions: Annotated[
        bool, typer.Option(help="Allow redrive and purge of dead letters from the page.")
    ] = False,
    refresh: Annotated[
        float,
        typer.Option(help="Seconds between looks at the change signals (one HEAD each)."),
    ] = 2.0,
    full_refresh: Annotated[
        float,
        typer.Option(help="Seconds between reads of every topic and the registry."),
    ] = 60.0,
    max_age: Annotated[
        float, typer.Option(help="A topic whose oldest pending message is older is a problem.")
    ] = 300.0,
    metrics_url: Annotated[
        list[str] | None,
        typer.Option(
            help="A Prometheus exporter's /metrics URL for exact message flow (repeatable)."
        ),
    ] = None,
) -> None:
    """Serve a web dashboard: topics, flow, dead letters, consumers and producers.

    Needs the dashboard extra (pip install 'pawn-queue\\[dashboard]').

    Listens on 127.0.0.1 unless told otherwise; any other address needs a token (--token, or
    the PAWNQUEUE_DASHBOARD_TOKEN variable). Redrive and purge only with --allow-actions.
    """
    opts = options(ctx)
    try:
        from pawn_queue.dashboard import DashboardServer, DashboardSettings, create_app, listen
    except ImportError as exc:
        missing_extra("dashboard", "pawn-queue dashboard", exc)
    try:
        settings = DashboardSettings(
            host=host,
            port=port,
            token=token or None,
            allow_actions=allow_actions,
            refresh=refresh,
            full_refresh=full_refresh,
            max_age=max_age,
            metrics_urls=tuple(metrics_url or ()),
        )
    except ArgumentError as exc:
        fail(str(exc), code=2)

    async def main() -> None:
        config = build_config(opts)
        if config.backend == "filesystem" and config.filesystem is not None:
            from pawn_queue.store.filesystem import require_root

            require_root(config.filesystem.path)  # only reads: a missing directory is a typo
        try:
            sock = listen(settings.host, settings.port, settings.token)
        except ArgumentError as exc:
            raise CliError(str(exc), code=2) from None
        except OSError as exc:
            raise CliError(f"cannot listen on {settings.host}:{settings.port}: {exc}") from None
        # Actions are logged as warnings, so they show at the default log level.
        logging.getLogger("pawn_queue.dashboard").setLevel(logging.INFO)
        server = DashboardServer(create_app(config, settings), sock)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        typer.echo(f"dashboard on http://{shown}:{bound_port}/", err=True)
        await server.run()

    run(ctx, main)
