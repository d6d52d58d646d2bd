"""The web dashboard (the ``dashboard`` extra: Starlette, uvicorn, Jinja2).

``pawn-queue dashboard`` serves it; in code, :func:`create_app` builds the ASGI app and
:func:`serve` runs it on a socket from :func:`listen`. Modules: ``app.py`` (the app and its
routes), ``pages.py`` (the HTML pages), ``actions.py`` (redrive, purge, refresh),
``api.py`` (the JSON), ``rendering.py`` (templates, filters, error pages), ``snapshots.py``
(what it knows of the queue and how it stays fresh), ``reader.py`` (reading the queue into
it), ``views.py`` (what it knows of one topic), ``security.py`` (bind check, token, CSRF,
headers), ``meter.py`` (its own request count), ``charts.py`` (inline SVG),
``prometheus.py`` (flow from exporters), ``server.py`` (uvicorn), ``settings.py`` (its
options).

Importing this package imports none of the extra's libraries: the names below load them
when first used, so ``settings`` works without the extra.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pawn_queue.dashboard.app import create_app
    from pawn_queue.dashboard.security import check_bind, is_loopback
    from pawn_queue.dashboard.server import DashboardServer, listen, serve
    from pawn_queue.dashboard.settings import TOKEN_ENV_VAR, DashboardSettings

_HOMES = {
    "create_app": "app",
    "check_bind": "security",
    "is_loopback": "security",
    "DashboardServer": "server",
    "listen": "server",
    "serve": "server",
    "TOKEN_ENV_VAR": "settings",
    "DashboardSettings": "settings",
}

__all__ = [
    "TOKEN_ENV_VAR",
    "DashboardServer",
    "DashboardSettings",
    "check_bind",
    "create_app",
    "is_loopback",
    "listen",
    "serve",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(f"pawn_queue.dashboard.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
