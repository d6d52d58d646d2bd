"""The dashboard's web app (Starlette): :func:`create_app` puts together the monitor that
keeps the queue in memory, the pages (:mod:`~pawn_queue.dashboard.pages`, rendered on the
server with Jinja2, every value escaped, and swapped in by a small script when the queue
changed), the actions (:mod:`~pawn_queue.dashboard.actions`: redrive, purge, behind
``allow_actions``, a confirmation and a CSRF token), the JSON (:mod:`~pawn_queue.dashboard.api`)
and the guard in front of them all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pawn_queue.client import PawnQueue
from pawn_queue.config import PawnQueueConfig
from pawn_queue.dashboard.actions import Actions
from pawn_queue.dashboard.api import Api
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.dashboard.pages import Pages
from pawn_queue.dashboard.rendering import Renderer
from pawn_queue.dashboard.security import Guard
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dashboard.snapshots import Monitor
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.wrapper import StoreWrapper

_STATIC = Path(__file__).parent / "static"


def create_app(
    config: PawnQueueConfig,
    settings: DashboardSettings,
    *,
    store: Store | None = None,
    clock: Callable[[], datetime] | None = None,
) -> Starlette:
    """The dashboard over the store ``config`` selects (or ``store``). Its lifespan opens the
    queue and starts refreshing (:attr:`app.state.monitor`, a :class:`Monitor`). ``clock``:
    the UTC wall clock it reads ages and staleness by (tests move it on)."""
    notify = config.notify.model_copy(
        update={
            "check_interval_seconds": settings.refresh,
            "idle_check_interval_seconds": settings.refresh,
        }
    )
    config = config.model_copy(update={"notify": notify})
    meter = RequestMeter(store or open_store(config))
    monitor = Monitor(PawnQueue(config, store=meter, clock=clock), meter, settings)
    pages = Pages(Renderer(monitor, settings, _describe(meter)))
    actions = Actions(pages)
    api = Api(monitor, settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # A server that started the monitor itself (DashboardServer) also stops it.
        started = await monitor.start()
        try:
            yield
        finally:
            if started:
                await monitor.stop()

    topic = "/topics/{topic}"
    app = Starlette(
        routes=[
            Route("/", pages.overview),
            Route(topic, pages.topic),
            Route(topic + "/dead-letters", pages.dead_letters),
            Route(topic + "/dead-letters/redrive", actions.redrive, methods=["POST"]),
            Route(topic + "/dead-letters/purge", actions.purge, methods=["POST"]),
            Route(topic + "/dead-letters/{message_id}", pages.dead_letter),
            Route("/schedules", pages.schedules),
            Route("/limits", pages.limits),
            Route("/registry", pages.registry),
            Route("/refresh", actions.refresh, methods=["POST"]),
            Route("/api/state", api.state),
            Route("/api/topics", api.topics),
            Route("/api/topics/{topic}/subscriptions", api.subscriptions),
            Route("/api/schedules", api.schedules),
            Route("/api/limits", api.limits),
            Mount("/static", StaticFiles(directory=_STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
    app.state.monitor = monitor
    app.add_middleware(Guard, token=settings.token)
    return app


def _describe(store: Store) -> str:
    """The store as the page names it: its repr, which never holds a credential."""
    while isinstance(store, StoreWrapper):
        store = store.inner
    return repr(store)
