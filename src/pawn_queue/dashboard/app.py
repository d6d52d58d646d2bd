"""The dashboard's web app (Starlette): pages rendered on the server with Jinja2 (every value
escaped), a small script that swaps in fresh content when the queue changed, and the two
actions (redrive, purge) behind ``allow_actions``, a confirmation and a CSRF token."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pawn_queue._internal.durations import short_age
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.client import PawnQueue
from pawn_queue.config import PawnQueueConfig
from pawn_queue.dashboard import charts
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.dashboard.security import Csrf, Guard, csrf_cookie
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dashboard.snapshots import DEAD_LETTER_LIMIT, OVERVIEW, Monitor
from pawn_queue.dashboard.views import TopicView
from pawn_queue.exceptions import (
    ArgumentError,
    ConfigError,
    PawnQueueError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.wrapper import StoreWrapper

logger = logging.getLogger(__name__)

SORT_KEYS = ("name", "pending", "in_flight", "delayed", "dead_letter", "oldest_age")
_PREVIEW_CHARS = 160
_FULL_CHARS = 200_000
_MAX_FORM_BYTES = 1_000_000
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
    pages = _Pages(monitor, settings, _describe(meter))

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
            Route(topic + "/dead-letters/redrive", pages.redrive, methods=["POST"]),
            Route(topic + "/dead-letters/purge", pages.purge, methods=["POST"]),
            Route(topic + "/dead-letters/{message_id}", pages.dead_letter),
            Route("/registry", pages.registry),
            Route("/refresh", pages.refresh, methods=["POST"]),
            Route("/api/state", pages.state),
            Route("/api/topics", pages.api_topics),
            Route("/api/topics/{topic}/subscriptions", pages.api_subscriptions),
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


class _Pages:
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
            age=short_age, preview=_preview, clip=_clip, full=_full, ago=self._ago, q=_quote
        )

    # -- rendering --------------------------------------------------------------------------

    def _render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        monitor = self.monitor
        values = {
            "monitor": monitor,
            "settings": self.settings,
            "store_name": self.store_name,
            "cost": monitor.meter.cost(),
            "now": monitor.now(),
            "open_per_minute": monitor.open_per_minute(_subject(request.url.path)),
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

    def _problem(self, request: Request, status: int, message: str) -> Response:
        return self._render(request, "message.html", status, title="Error", message=message)

    async def _guarded(self, request: Request, page: Callable[[], Awaitable[Response]]) -> Response:
        """``page()``, with the library's errors as one-line error pages."""
        try:
            return await page()
        except TopicNotFoundError as exc:  # a SubscriptionNotFoundError too
            return self._problem(request, 404, str(exc))
        except (ConfigError, ArgumentError) as exc:
            return self._problem(request, 400, _first_line(exc))
        except PawnQueueError as exc:
            return self._problem(request, 503, f"the store could not be read: {_first_line(exc)}")

    def _ago(self, iso: str) -> float | None:
        try:
            return (now_utc() - datetime.fromisoformat(iso)).total_seconds()
        except (ValueError, TypeError):
            return None

    # -- pages ------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        sort = request.query_params.get("sort", "")
        descending = request.query_params.get("desc") == "1"
        await self.monitor.look(OVERVIEW)
        now = self.monitor.now()
        views = list(self.monitor.topics.values())
        if sort in SORT_KEYS:
            views.sort(key=lambda v: v.name)  # ties stay by name, either way
            views.sort(key=lambda v: _sort_key(v, sort, now), reverse=descending)
        else:  # problems first, then by name
            views.sort(key=lambda v: (not v.problems(now, self.settings.max_age), v.name))
        return self._render(request, "overview.html", views=views, sort=sort, descending=descending)

    async def topic(self, request: Request) -> Response:
        name = request.path_params["topic"]

        async def page() -> Response:
            view = await self._view(name)
            now = self.monitor.now()
            span = self.settings.history_seconds
            peeked = await self.monitor.peek(name) if view.valid else []
            groups = sorted(view.groups.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
            return self._render(
                request,
                "topic.html",
                view=view,
                peeked=peeked,
                groups=[(self.monitor.group_names.get(h), h, n) for h, n in groups],
                depth=charts.depth_chart(view.history, now, span),
                flow=charts.flow_chart(view.history, now, span),
                metrics=charts.metrics_chart(view.flow, now, span),
                scrape_error=self.monitor.scraper.error,
            )

        return await self._guarded(request, page)

    async def dead_letters(self, request: Request) -> Response:
        name = request.path_params["topic"]

        async def page() -> Response:
            view = await self._view(name)
            subscription = await self._subscription(request, name)
            letters = await self.monitor.dead_letters(name, subscription) if view.valid else []
            done = request.query_params.get("done", "")
            count = request.query_params.get("count", "")
            notice = None
            if done in ("redrove", "purged") and count.isdigit():
                notice = f"{done} {count} dead letters"
            return self._render(
                request,
                "dead_letters.html",
                view=view,
                letters=letters,
                limit=DEAD_LETTER_LIMIT,
                notice=notice,
                **_of_subscription(view, subscription),
            )

        return await self._guarded(request, page)

    async def dead_letter(self, request: Request) -> Response:
        name = request.path_params["topic"]
        message_id = request.path_params["message_id"]

        async def page() -> Response:
            view = await self._view(name)
            subscription = await self._subscription(request, name)
            queue = self.monitor.queue
            letter = await queue.dead_letter(name, message_id, subscription=subscription)
            if letter is None:
                return self._problem(request, 404, f"no dead letter {message_id!r} in {name!r}")
            return self._render(
                request,
                "dead_letter.html",
                view=view,
                letter=letter,
                **_of_subscription(view, subscription),
            )

        return await self._guarded(request, page)

    async def registry(self, request: Request) -> Response:
        heartbeat = self.monitor.queue.config.registry.heartbeat_interval_seconds
        return self._render(request, "registry.html", window=2 * heartbeat)

    async def _subscription(self, request: Request, topic: str) -> str | None:
        """The subscription of ``topic`` whose dead letters the page is about (``?subscription=``;
        None: the topic's own). ArgumentError if it is not a name, SubscriptionNotFoundError
        if the topic has no such subscription (its index, as the queue reads it)."""
        name = request.query_params.get("subscription") or None
        if name is None:
            return None
        layout.validate_name(name, "subscription name")
        queue = layout.subscription_queue(topic, name)
        destinations = await self.monitor.queue.runtime.subscriptions.destinations(topic)
        if all(d.queue != queue for d in destinations):
            raise SubscriptionNotFoundError(f"topic {topic!r} has no subscription {name!r}")
        return name

    async def _view(self, name: str) -> TopicView:
        """The topic's view, its counts no older than ``refresh`` (one the dashboard did not
        know yet is looked for in the store)."""
        view = await self.monitor.look(name, discover=True)
        if view is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return view

    # -- actions ----------------------------------------------------------------------------

    async def _form(self, request: Request) -> dict[str, list[str]] | Response:
        """The posted form once the action may run; else the page that refuses it."""
        if not self.settings.allow_actions:
            return self._problem(
                request, 403, "actions are off: start the dashboard with --allow-actions"
            )
        body = await request.body()
        if len(body) > _MAX_FORM_BYTES:
            return self._problem(request, 413, "form too large")
        form: dict[str, list[str]] = {}
        for key, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
            form.setdefault(key, []).append(value)
        cookie = csrf_cookie(request.scope, request.cookies)
        if not self.csrf.valid(cookie, next(iter(form.get("csrf", [])), None)):
            return self._problem(
                request, 403, "missing or wrong CSRF token: reload the page and try again"
            )
        return form

    async def redrive(self, request: Request) -> Response:
        name = request.path_params["topic"]
        form = await self._form(request)
        if isinstance(form, Response):
            return form
        ids = form.get("id", [])
        everything = form.get("all") == ["1"]
        if not everything and not ids:
            return self._problem(request, 400, "select the dead letters to redrive")
        bad = [i for i in ids if not layout.is_uuid(i)]
        if bad:
            return self._problem(request, 400, f"not a message id: {bad[0][:40]!r}")

        async def act() -> Response:
            view = await self._view(name)
            subscription = await self._subscription(request, name)
            if form.get("confirmed") != ["yes"]:
                return self._render(
                    request,
                    "confirm.html",
                    view=view,
                    action="redrive",
                    ids=ids,
                    everything=everything,
                    **_of_subscription(view, subscription),
                )
            count = await self.monitor.queue.redrive(
                name, subscription=subscription, ids=None if everything else ids
            )
            self._log(request, "redrive", name, subscription, count)
            await self.monitor.changed(name)
            return _after(name, subscription, "redrove", count)

        return await self._guarded(request, act)

    async def purge(self, request: Request) -> Response:
        name = request.path_params["topic"]
        form = await self._form(request)
        if isinstance(form, Response):
            return form

        async def act() -> Response:
            view = await self._view(name)
            subscription = await self._subscription(request, name)
            if form.get("confirmed") != ["yes"]:
                return self._render(
                    request,
                    "confirm.html",
                    view=view,
                    action="purge",
                    ids=[],
                    everything=True,
                    **_of_subscription(view, subscription),
                )
            count = await self.monitor.queue.purge_dead_letters(name, subscription=subscription)
            self._log(request, "purge", name, subscription, count)
            await self.monitor.changed(name)
            return _after(name, subscription, "purged", count)

        return await self._guarded(request, act)

    def _log(
        self, request: Request, action: str, topic: str, subscription: str | None, count: int
    ) -> None:
        client = request.client.host if request.client else "-"
        logger.warning(
            "dashboard action=%s topic=%s subscription=%s dead_letters=%d client=%s",
            action,
            topic,
            subscription or "-",
            count,
            client,
        )

    async def refresh(self, request: Request) -> Response:
        cookie = csrf_cookie(request.scope, request.cookies)
        body = dict(parse_qsl((await request.body())[:4096].decode("utf-8", "replace")))
        if not self.csrf.valid(cookie, body.get("csrf")):
            return self._problem(request, 403, "missing or wrong CSRF token")
        self.monitor.refresh_soon()
        back = body.get("back", "/")
        if not back.startswith("/") or back.startswith("//"):
            back = "/"  # only a page of this dashboard
        return RedirectResponse(back, status_code=303)

    # -- JSON -------------------------------------------------------------------------------

    async def state(self, request: Request) -> Response:
        """Whether the queue changed (``version``), and the cost. ``page``: the path of the
        page asking (its script does, every refresh interval), whose counts are read again
        first when they are a refresh interval old."""
        monitor = self.monitor
        subject = _subject(request.query_params.get("page", ""))
        if subject is not None:
            await monitor.look(subject)  # a topic it does not know is left to the page
        return JSONResponse(
            {
                "version": monitor.version,
                "error": monitor.error,
                "last_full": monitor.last_full,
                "cost": asdict(monitor.meter.cost()),
                "idle_per_minute": monitor.idle_per_minute(),
                "open_per_minute": monitor.open_per_minute(subject),
                "full_refresh_requests": monitor.full_cost,
            }
        )

    async def api_topics(self, request: Request) -> Response:
        await self.monitor.look(OVERVIEW)
        now = self.monitor.now()
        rows = []
        for view in sorted(self.monitor.topics.values(), key=lambda v: v.name):
            stats = asdict(view.stats) if view.stats is not None else None
            if stats is not None:
                stats["oldest_age_seconds"] = view.oldest_age(now)
            rows.append(
                {
                    "topic": view.name,
                    "valid": view.valid,
                    "stats": stats,
                    "settings": asdict(view.settings) if view.settings else None,
                    "problems": view.problems(now, self.settings.max_age),
                }
            )
        return JSONResponse(rows)

    async def api_subscriptions(self, request: Request) -> Response:
        """The topic's subscriptions with their counts, as its page shows them (read again
        when ``refresh`` seconds old); 404 for a topic that does not exist."""
        name = request.path_params["topic"]
        view = await self.monitor.look(name, discover=True)
        if view is None:
            return JSONResponse({"error": f"topic {name!r} does not exist"}, status_code=404)
        now = self.monitor.now()
        rows = []
        for sub in (view.subscriptions or {}).values():
            stats = asdict(sub.stats) if sub.stats is not None else None
            if stats is not None:
                stats["oldest_age_seconds"] = sub.oldest_age(now)
            rows.append({"subscription": sub.name, "filter": sub.filter, "stats": stats})
        return JSONResponse(
            {
                "topic": view.name,
                "subscriptions": rows,
                "unread": view.subscriptions_unread,
                "error": self.monitor.error,
            }
        )


def _after(topic: str, subscription: str | None, done: str, count: int) -> Response:
    url = f"/topics/{_quote(topic)}/dead-letters?done={done}&count={count}"
    if subscription is not None:
        url += f"&subscription={_quote(subscription)}"
    return RedirectResponse(url, status_code=303)


def _of_subscription(view: TopicView, subscription: str | None) -> dict[str, Any]:
    """What the dead-letter pages show of the subscription they are about: its name, the
    query that keeps their links on it, and its dead-letter count when read."""
    if subscription is None:
        count = view.stats.dead_letter if view.stats else None
        return {"subscription": None, "sq": "", "dead_count": count}
    sub = (view.subscriptions or {}).get(subscription)
    count = sub.stats.dead_letter if sub is not None and sub.stats else None
    return {
        "subscription": subscription,
        "sq": f"?subscription={_quote(subscription)}",
        "dead_count": count,
    }


def _quote(value: str) -> str:
    return quote(value, safe="")


def _subject(path: str) -> str | None:
    """What the page at ``path`` shows of the queue, for :meth:`Monitor.look`: every topic
    (the overview), one topic (its pages), or nothing it reads for (None)."""
    if path == "/":
        return OVERVIEW
    name = unquote(path.removeprefix("/topics/").partition("/")[0])
    return name if path.startswith("/topics/") and name else None


def _sort_key(view: TopicView, sort: str, now: float) -> str | float:
    if sort == "name":
        return view.name
    if view.stats is None:
        return -1.0
    if sort == "oldest_age":
        age = view.oldest_age(now)
        return -1.0 if age is None else age
    return float(getattr(view.stats, sort))


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
