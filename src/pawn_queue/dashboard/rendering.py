"""How the dashboard turns what it knows into HTML: the Jinja2 environment (every value
escaped, an undefined name an error) with its filters (ages, payload previews, URL quoting),
and :class:`Renderer`, which renders a page whole or only its ``<main>`` (what the page's
script swaps in when the queue changed) with what every page shows (the store, the cost, a
CSRF token), and turns the library's errors into one-line error pages."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from pawn_queue._internal.durations import short_age
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.dashboard.security import Csrf, csrf_cookie
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dashboard.snapshots import LIMITS, OVERVIEW, SCHEDULES, Monitor
from pawn_queue.dashboard.views import reasons_text
from pawn_queue.exceptions import ArgumentError, ConfigError, PawnQueueError, TopicNotFoundError

_PREVIEW_CHARS = 160
_FULL_CHARS = 200_000


class Renderer:
    """Renders the pages of one dashboard (over ``monitor``), and its error pages."""

    def __init__(self, monitor: Monitor, settings: DashboardSettings, store_name: str) -> None:
        self.monitor = monitor
        self.settings = settings
        self.store_name = store_name
        self.csrf = Csrf()
        self.env = Environment(
            loader=PackageLoader("pawn_queue.dashboard", "templates"),
            autoescape=True,  # every value, whatever the template's name
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            age=short_age,
            preview=_preview,
            clip=_clip,
            full=_full,
            ago=_ago,
            q=quoted,
            utc=_utc,
            reasons_text=reasons_text,
        )

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        monitor = self.monitor
        values = {
            "monitor": monitor,
            "settings": self.settings,
            "store_name": self.store_name,
            "cost": monitor.meter.cost(),
            "now": monitor.now(),
            "open_per_minute": monitor.open_per_minute(subject(request.url.path)),
            "csrf": self.csrf.token_for(csrf_cookie(request.scope, request.cookies)),
            "notice": None,
            **context,
        }
        template = self.env.get_template(name)
        if request.headers.get("x-fragment") == "1":
            # The script asks for the part that changes: <main>, nothing around it.
            block = template.blocks["main"]
            html = "".join(block(template.new_context(values)))
        else:
            html = template.render(values)
        return HTMLResponse(html, status_code=status)

    def problem(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "message.html", status, title="Error", message=message)

    async def guarded(self, request: Request, page: Callable[[], Awaitable[Response]]) -> Response:
        """``page()``, with the library's errors as one-line error pages."""
        try:
            return await page()
        except TopicNotFoundError as exc:  # a SubscriptionNotFoundError too
            return self.problem(request, 404, str(exc))
        except (ConfigError, ArgumentError) as exc:
            return self.problem(request, 400, _first_line(exc))
        except PawnQueueError as exc:
            return self.problem(request, 503, f"the store could not be read: {_first_line(exc)}")


def quoted(value: str) -> str:
    """``value`` as one part of a URL's path or query (``/`` quoted too)."""
    return quote(value, safe="")


def subject(path: str) -> str | None:
    """What the page at ``path`` shows of the queue, for :meth:`Monitor.look`: every topic
    (the overview), the schedules, the limits, one topic (its pages), or nothing it reads for
    (None)."""
    if path == "/":
        return OVERVIEW
    if path == "/schedules":
        return SCHEDULES
    if path == "/limits":
        return LIMITS
    name = unquote(path.removeprefix("/topics/").partition("/")[0])
    return name if path.startswith("/topics/") and name else None


def _ago(iso: str) -> float | None:
    try:
        return (now_utc() - datetime.fromisoformat(iso)).total_seconds()
    except (ValueError, TypeError):
        return None


def _utc(moment: datetime | None) -> str:
    """A time in UTC to the second (``2026-12-02 01:00:00Z``); ``-`` for none."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _text(payload: Any, indent: int | None) -> str:
    if isinstance(payload, bytes | bytearray | memoryview):
        raw = bytes(payload)
        return f"({len(raw)} bytes, base64) " + base64.b64encode(raw[:3000]).decode("ascii")
    return json.dumps(payload, ensure_ascii=False, indent=indent, default=str)


def _preview(payload: Any) -> str:
    text = " ".join(_text(payload, None).split())
    return text if len(text) <= _PREVIEW_CHARS else text[: _PREVIEW_CHARS - 1] + "…"


def _clip(text: str) -> str:
    """Text on one line, cut to a preview's length."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _PREVIEW_CHARS else flat[: _PREVIEW_CHARS - 1] + "…"


def _full(payload: Any) -> str:
    text = _text(payload, 2)
    if len(text) > _FULL_CHARS:
        return text[:_FULL_CHARS] + f"\n… ({len(text) - _FULL_CHARS} more characters)"
    return text
