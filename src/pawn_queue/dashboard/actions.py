"""What the dashboard changes (:class:`Actions`, the POST handlers): redriving and purging a
topic's or a subscription's dead letters, behind ``allow_actions``, a CSRF token and a page
that asks to confirm, each logged (a warning: who did what to how many); and the refresh
button, which asks for everything to be read again."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pawn_queue._protocol import layout
from pawn_queue.dashboard.pages import Pages, of_subscription
from pawn_queue.dashboard.rendering import quoted
from pawn_queue.dashboard.security import csrf_cookie

logger = logging.getLogger(__name__)

_MAX_FORM_BYTES = 1_000_000


class Actions:
    """The POST handlers, answering with the pages of ``pages`` (a refusal, a confirmation)."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.renderer = pages.renderer
        self.monitor = pages.monitor
        self.settings = pages.settings

    async def _form(self, request: Request) -> dict[str, list[str]] | Response:
        """The posted form once the action may run; else the page that refuses it."""
        if not self.settings.allow_actions:
            return self.renderer.problem(
                request, 403, "actions are off: start the dashboard with --allow-actions"
            )
        body = await request.body()
        if len(body) > _MAX_FORM_BYTES:
            return self.renderer.problem(request, 413, "form too large")
        form: dict[str, list[str]] = {}
        for key, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
            form.setdefault(key, []).append(value)
        cookie = csrf_cookie(request.scope, request.cookies)
        if not self.renderer.csrf.valid(cookie, next(iter(form.get("csrf", [])), None)):
            return self.renderer.problem(
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
            return self.renderer.problem(request, 400, "select the dead letters to redrive")
        bad = [i for i in ids if not layout.is_uuid(i)]
        if bad:
            return self.renderer.problem(request, 400, f"not a message id: {bad[0][:40]!r}")

        async def act() -> Response:
            view = await self.pages.view(name)
            subscription = await self.pages.subscription(request, name)
            if form.get("confirmed") != ["yes"]:
                return self.renderer.render(
                    request,
                    "confirm.html",
                    view=view,
                    action="redrive",
                    ids=ids,
                    everything=everything,
                    **of_subscription(view, subscription),
                )
            count = await self.monitor.queue.redrive(
                name, subscription=subscription, ids=None if everything else ids
            )
            self._log(request, "redrive", name, subscription, count)
            await self.monitor.changed(name)
            return _after(name, subscription, "redrove", count)

        return await self.renderer.guarded(request, act)

    async def purge(self, request: Request) -> Response:
        name = request.path_params["topic"]
        form = await self._form(request)
        if isinstance(form, Response):
            return form

        async def act() -> Response:
            view = await self.pages.view(name)
            subscription = await self.pages.subscription(request, name)
            if form.get("confirmed") != ["yes"]:
                return self.renderer.render(
                    request,
                    "confirm.html",
                    view=view,
                    action="purge",
                    ids=[],
                    everything=True,
                    **of_subscription(view, subscription),
                )
            count = await self.monitor.queue.purge_dead_letters(name, subscription=subscription)
            self._log(request, "purge", name, subscription, count)
            await self.monitor.changed(name)
            return _after(name, subscription, "purged", count)

        return await self.renderer.guarded(request, act)

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
        if not self.renderer.csrf.valid(cookie, body.get("csrf")):
            return self.renderer.problem(request, 403, "missing or wrong CSRF token")
        self.monitor.refresh_soon()
        back = body.get("back", "/")
        if not back.startswith("/") or back.startswith("//"):
            back = "/"  # only a page of this dashboard
        return RedirectResponse(back, status_code=303)


def _after(topic: str, subscription: str | None, done: str, count: int) -> Response:
    url = f"/topics/{quoted(topic)}/dead-letters?done={done}&count={count}"
    if subscription is not None:
        url += f"&subscription={quoted(subscription)}"
    return RedirectResponse(url, status_code=303)
