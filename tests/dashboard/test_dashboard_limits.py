"""The limits on the dashboard: the limits page lists each concurrency limit with the slots
held and their holders, each rate limit with its rate and when its permits were last taken,
and the subscribers paused by ``RateLimited``; what a read of them costs (a LIST of each
prefix, then a GET of each slot, of each rate's newest key and of each pause); names that
are markup shown as text; and, in a real browser (Debian's Chromium through Playwright), the
page following a slot taken elsewhere without a reload.

The app test runs first: the browser fixture keeps Playwright's event loop running in this
thread once it is open (see tests/helpers/browser.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.register_assert_rewrite("tests.helpers.browser")  # imported here, and as a plugin

from pawn_queue import Message, RateLimited  # noqa: E402
from pawn_queue import PawnQueue as AsyncPawnQueue  # noqa: E402
from pawn_queue._protocol import layout  # noqa: E402
from pawn_queue.config import load_config  # noqa: E402
from pawn_queue.dashboard import DashboardSettings  # noqa: E402
from pawn_queue.dashboard.snapshots import LIMITS, Monitor  # noqa: E402
from pawn_queue.store import open_store  # noqa: E402
from pawn_queue.sync import PawnQueue  # noqa: E402
from tests.dashboard.test_dashboard_schedules import HOSTILE, Clock, client_for  # noqa: E402
from tests.helpers.browser import Watched, screenshot, served_dashboard  # noqa: E402
from tests.helpers.dashboard_pages import Requests, in_a_thread  # noqa: E402
from tests.helpers.stores import queue_config_dict  # noqa: E402

pytest_plugins = ["tests.helpers.browser"]  # the browser and watched fixtures

HOLDER = f"{socket.gethostname()}:{os.getpid()}"


def pause_a_subscriber(config: dict[str, Any]) -> None:
    """A handler of ``jobs`` raises RateLimited(retry_after=600): its subscriber pauses."""

    async def work() -> None:
        async with AsyncPawnQueue.from_config(config) as pq:
            await pq.create_topic("jobs")
            await (await pq.register_producer("p")).publish("jobs", 1)
            paused = asyncio.Event()

            async def handle(message: Message) -> None:
                paused.set()
                raise RateLimited(retry_after=600)

            consumer = await pq.register_consumer("c", ["jobs"])
            listening = asyncio.create_task(consumer.listen(handle))
            await asyncio.wait_for(paused.wait(), 30)
            listening.cancel()  # the handler's failure is settled first: the pause written
            await asyncio.gather(listening, return_exceptions=True)
            key = layout.pause_key(layout.subscriber_limit_name(["jobs"], None))
            assert [meta.key for meta in await pq.store.list(key)] == [key]

    in_a_thread(work)


def test_the_limits_page_lists_limits_rates_and_pauses_at_a_bounded_cost(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    pause_a_subscriber(config)
    with PawnQueue.from_config(config) as pq:
        with pq.rate_limit("partner", "20/s"):
            pass
        with pq.concurrency_limit("nightly", 1):
            pass  # given back: its slot stays, free
        with pq.concurrency_limit("api", 3) as slot:
            requests = Requests(open_store(load_config(config)))
            clock = Clock()
            dashboard = DashboardSettings(refresh=2, full_refresh=3600)
            with client_for(config, dashboard, requests, clock) as client:
                answer = client.get("/api/limits").json()
                page = client.get("/limits").text
                assert 'href="/limits"' in client.get("/").text  # in the navigation

                requests.sent.clear()
                clock.advance(dashboard.refresh)
                client.get("/api/limits")
                slot_keys = [layout.limit_slot_key("api", slot.slot)]
                slot_keys.append(layout.limit_slot_key("nightly", 0))
                expected = [("list", p) for p in (layout.LIMITS, layout.RATES, layout.PAUSES)]
                expected += [("get", key) for key in slot_keys]
                expected += [("get", next(k for _, k in requests.sent if "partner" in k))]
                expected += [("get", layout.pause_key("_topics/jobs"))]
                assert requests.reads() == sorted(expected)
                monitor: Monitor = client.app.state.monitor  # type: ignore[attr-defined]
                assert monitor.look_cost[LIMITS] == len(expected)
                requests.sent.clear()
                client.get("/limits")  # not again within the refresh interval
                assert requests.reads() == []
    [api, nightly] = answer["limits"]
    assert (api["limit"], api["held"], nightly["limit"], nightly["held"]) == (
        "api",
        1,
        "nightly",
        0,
    )
    assert api["slots"] == [
        {
            "slot": slot.slot,
            "held": True,
            "holder": HOLDER,
            "expires_at": api["slots"][0]["expires_at"],
        }
    ]
    [rate] = answer["rates"]
    assert (rate["rate_limit"], rate["rate"]) == ("partner", "20/1s")
    [pause] = answer["pauses"]
    assert pause["subscriber"] == "_topics/jobs" and pause["until"] > rate["last_won"]
    assert answer["error"] is None
    assert '<tr data-limit="api">' in page and HOLDER in page
    assert (
        '<tr data-rate="partner">' in page
        and '<tr data-pause="_topics/jobs" class="problem">' in page
    )


def test_no_limits_says_so_and_stored_markup_is_text(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    store = open_store(load_config(config))
    clock = Clock()
    with client_for(config, DashboardSettings(refresh=0.1), store, clock) as client:
        assert "No concurrency limits, rate limits or pauses" in client.get("/limits").text
        empty = {"limits": [], "rates": [], "pauses": [], "slots_unread": 0, "error": None}
        assert client.get("/api/limits").json() == empty

        async def write() -> None:  # what another program could store
            writer = open_store(load_config(config))
            try:
                await writer.put(f"{layout.PAUSES}{HOSTILE}.json", b'{"until": "soon"}')
            finally:
                await writer.close()

        in_a_thread(write)
        clock.advance(1)
        page = client.get("/limits").text
    assert HOSTILE not in page and "&lt;img src=x onerror=window.__pwned=1&gt;" in page
    assert "unreadable" in page


# -- in a browser --------------------------------------------------------------------------


def test_the_limits_page_follows_a_slot_taken_elsewhere(
    tmp_path: Path, request: pytest.FixtureRequest, watched: Watched
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    with PawnQueue.from_config(config) as pq:
        with pq.concurrency_limit("api", 2):
            pass
        with served_dashboard(config, DashboardSettings(refresh=0.3, full_refresh=30)) as served:
            page = watched.page
            page.goto(served.url + "/limits")
            held = page.locator('#limits tr[data-limit="api"] td[data-col="held"]')
            assert held.inner_text() == "0"
            page.evaluate("window.__sameDocument = 1")
            with pq.concurrency_limit("api", 2):
                deadline = time.monotonic() + 30
                while held.inner_text() != "1":
                    assert time.monotonic() < deadline, "the page did not follow"
                    page.wait_for_timeout(100)
                holders = page.locator('#limits tr[data-limit="api"] td[data-col="holders"]')
                assert HOLDER in holders.inner_text()
            assert page.evaluate("window.__sameDocument") == 1
            screenshot(page, "limits")
    assert not watched.errors, watched.errors
