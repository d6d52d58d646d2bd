"""The dashboard's HTML pages (:class:`Pages`): the overview (sorted, problems first), a
topic's page (counts, charts, groups, its head), its dead letters and one dead letter (of the
topic or of one of its subscriptions), the schedules and the registry; and what a request
names, the topic and the subscription, found in the store or answered with a 404."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from pawn_queue._protocol import layout
from pawn_queue.dashboard import charts
from pawn_queue.dashboard.rendering import Renderer, quoted
from pawn_queue.dashboard.snapshots import DEAD_LETTER_LIMIT, LIMITS, OVERVIEW, SCHEDULES
from pawn_queue.dashboard.views import TopicView
from pawn_queue.exceptions import SubscriptionNotFoundError, TopicNotFoundError

SORT_KEYS = ("name", "pending", "in_flight", "delayed", "dead_letter", "oldest_age")


class Pages:
    """The GET handlers of the HTML pages, rendered by ``renderer`` from its monitor."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.monitor = renderer.monitor
        self.settings = renderer.settings

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
        return self.renderer.render(
            request, "overview.html", views=views, sort=sort, descending=descending
        )

    async def topic(self, request: Request) -> Response:
        name = request.path_params["topic"]

        async def page() -> Response:
            view = await self.view(name)
            now = self.monitor.now()
            span = self.settings.history_seconds
            peeked = await self.monitor.peek(name) if view.valid else []
            groups = sorted(view.groups.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
            return self.renderer.render(
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

        return await self.renderer.guarded(request, page)

    async def dead_letters(self, request: Request) -> Response:
        name = request.path_params["topic"]

        async def page() -> Response:
            view = await self.view(name)
            subscription = await self.subscription(request, name)
            letters = await self.monitor.dead_letters(name, subscription) if view.valid else []
            done = request.query_params.get("done", "")
            count = request.query_params.get("count", "")
            notice = None
            if done in ("redrove", "purged") and count.isdigit():
                notice = f"{done} {count} dead letters"
            return self.renderer.render(
                request,
                "dead_letters.html",
                view=view,
                letters=letters,
                limit=DEAD_LETTER_LIMIT,
                notice=notice,
                **of_subscription(view, subscription),
            )

        return await self.renderer.guarded(request, page)

    async def dead_letter(self, request: Request) -> Response:
        name = request.path_params["topic"]
        message_id = request.path_params["message_id"]

        async def page() -> Response:
            view = await self.view(name)
            subscription = await self.subscription(request, name)
            queue = self.monitor.queue
            letter = await queue.dead_letter(name, message_id, subscription=subscription)
            if letter is None:
                return self.renderer.problem(
                    request, 404, f"no dead letter {message_id!r} in {name!r}"
                )
            return self.renderer.render(
                request,
                "dead_letter.html",
                view=view,
                letter=letter,
                **of_subscription(view, subscription),
            )

        return await self.renderer.guarded(request, page)

    async def schedules(self, request: Request) -> Response:
        await self.monitor.look(SCHEDULES)
        return self.renderer.render(request, "schedules.html", rows=self.monitor.schedules or [])

    async def limits(self, request: Request) -> Response:
        await self.monitor.look(LIMITS)
        return self.renderer.render(request, "limits.html", limits=self.monitor.limits)

    async def registry(self, request: Request) -> Response:
        heartbeat = self.monitor.queue.config.registry.heartbeat_interval_seconds
        return self.renderer.render(request, "registry.html", window=2 * heartbeat)

    async def subscription(self, request: Request, topic: str) -> str | None:
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

    async def view(self, name: str) -> TopicView:
        """The topic's view, its counts no older than ``refresh`` (one the dashboard did not
        know yet is looked for in the store)."""
        view = await self.monitor.look(name, discover=True)
        if view is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return view


def of_subscription(view: TopicView, subscription: str | None) -> dict[str, Any]:
    """What the dead-letter pages show of the subscription they are about: its name, the
    query that keeps their links on it, and its dead-letter count when read."""
    if subscription is None:
        count = view.stats.dead_letter if view.stats else None
        return {"subscription": None, "sq": "", "dead_count": count}
    sub = (view.subscriptions or {}).get(subscription)
    count = sub.stats.dead_letter if sub is not None and sub.stats else None
    return {
        "subscription": subscription,
        "sq": f"?subscription={quoted(subscription)}",
        "dead_count": count,
    }


def _sort_key(view: TopicView, sort: str, now: float) -> str | float:
    if sort == "name":
        return view.name
    if view.stats is None:
        return -1.0
    if sort == "oldest_age":
        age = view.oldest_age(now)
        return -1.0 if age is None else age
    return float(getattr(view.stats, sort))
