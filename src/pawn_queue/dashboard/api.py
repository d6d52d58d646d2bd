"""The dashboard's JSON (:class:`Api`): ``/api/state``, which the pages' script asks every
refresh interval (whether the queue changed, and what the dashboard costs), the topics and a
topic's subscriptions with their counts (their dead letters by reason too), and the
schedules with their stats, as the pages show them."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pawn_queue.dashboard.rendering import subject
from pawn_queue.dashboard.settings import DashboardSettings
from pawn_queue.dashboard.snapshots import LIMITS, OVERVIEW, SCHEDULES, Monitor


class Api:
    """The JSON handlers, answering from ``monitor``."""

    def __init__(self, monitor: Monitor, settings: DashboardSettings) -> None:
        self.monitor = monitor
        self.settings = settings

    async def state(self, request: Request) -> Response:
        """Whether the queue changed (``version``), and the cost. ``page``: the path of the
        page asking (its script does, every refresh interval), whose counts are read again
        first when they are a refresh interval old."""
        monitor = self.monitor
        page = subject(request.query_params.get("page", ""))
        if page is not None:
            await monitor.look(page)  # a topic it does not know is left to the page
        return JSONResponse(
            {
                "version": monitor.version,
                "error": monitor.error,
                "last_full": monitor.last_full,
                "cost": asdict(monitor.meter.cost()),
                "idle_per_minute": monitor.idle_per_minute(),
                "open_per_minute": monitor.open_per_minute(page),
                "full_refresh_requests": monitor.full_cost,
            }
        )

    async def topics(self, request: Request) -> Response:
        await self.monitor.look(OVERVIEW)
        now = self.monitor.now()
        rows = []
        for view in sorted(self.monitor.topics.values(), key=lambda v: v.name):
            stats = asdict(view.stats) if view.stats is not None else None
            if stats is not None:
                stats["oldest_age_seconds"] = view.oldest_age(now)
                stats.update(_reasons(view.dead_reasons, view.dead_unread))
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

    async def schedules(self, request: Request) -> Response:
        """The schedules with their stats, as their page shows them (read again when
        ``refresh`` seconds old)."""
        await self.monitor.look(SCHEDULES)
        rows = []
        for row in self.monitor.schedules or []:
            stats = row.stats
            rows.append(
                {
                    "schedule": row.name,
                    "topic": row.topic,
                    "cron": row.cron,
                    "every": row.every,
                    "timezone": row.timezone,
                    "paused": row.paused,
                    "priority": row.priority,
                    "expires_in": row.expires_in,
                    "last_fire_time": _iso(stats.last_fire_time) if stats else None,
                    "next_fire_time": _iso(stats.next_fire_time) if stats else None,
                    "fired": stats.fired if stats else None,
                    "missed": stats.missed if stats else None,
                    "error": row.error,
                }
            )
        return JSONResponse(
            {
                "schedules": rows,
                "unread": self.monitor.schedules_unread,
                "error": self.monitor.error,
            }
        )

    async def limits(self, request: Request) -> Response:
        """The concurrency limits, rate limits and pauses, as their page shows them (read
        again when ``refresh`` seconds old)."""
        await self.monitor.look(LIMITS)
        view = self.monitor.limits
        limits = [
            {"limit": row.name, "held": row.held, "slots": [asdict(slot) for slot in row.slots]}
            for row in (view.limits if view else ())
        ]
        rates = [
            {"rate_limit": row.name, "rate": row.rate, "last_won": _iso(row.last_won)}
            for row in (view.rates if view else ())
        ]
        pauses = [
            {"subscriber": row.name, "until": _iso(row.until) if row.until else None}
            for row in (view.pauses if view else ())
        ]
        return JSONResponse(
            {
                "limits": limits,
                "rates": rates,
                "pauses": pauses,
                "slots_unread": view.slots_unread if view else 0,
                "error": self.monitor.error,
            }
        )

    async def subscriptions(self, request: Request) -> Response:
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
                stats.update(_reasons(sub.dead_reasons, sub.dead_unread))
            rows.append({"subscription": sub.name, "filter": sub.filter, "stats": stats})
        return JSONResponse(
            {
                "topic": view.name,
                "subscriptions": rows,
                "unread": view.subscriptions_unread,
                "error": self.monitor.error,
            }
        )


def _reasons(reasons: dict[str, int], unread: int) -> dict[str, object]:
    """The dead letters by reason, and those whose reason is not read yet."""
    return {"dead_letter_reasons": dict(reasons), "dead_letter_reasons_unread": unread}


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
