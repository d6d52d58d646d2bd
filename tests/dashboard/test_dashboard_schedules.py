"""The schedules on the dashboard: the schedules page lists each with its topic, its rule
(cron and time zone, or every), its ticks' priority and expiry, whether it is paused, its
last and next fire, and the ticks fired and missed, as ``schedule_stats`` reports them; what
a read of them costs (one LIST of the definitions, then what ``schedule_stats`` reads); and,
in a real browser (Debian's Chromium through Playwright), the page following a runner's
ticks without a reload, with hostile stored strings shown as text.

The app test runs first: the browser fixture keeps Playwright's event loop running in this
thread once it is open (see tests/helpers/browser.py)."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.register_assert_rewrite("tests.helpers.browser")  # imported here, and as a plugin

from starlette.testclient import TestClient  # noqa: E402 - after the skip

from pawn_queue._protocol import layout  # noqa: E402
from pawn_queue._protocol.envelope import now_utc  # noqa: E402
from pawn_queue._protocol.schedules import Schedule, encode_schedule, marker_body  # noqa: E402
from pawn_queue.config import load_config  # noqa: E402
from pawn_queue.dashboard import DashboardSettings, create_app  # noqa: E402
from pawn_queue.dashboard.snapshots import SCHEDULES, Monitor  # noqa: E402
from pawn_queue.store import open_store  # noqa: E402
from pawn_queue.store.base import Store  # noqa: E402
from pawn_queue.sync import PawnQueue  # noqa: E402
from tests.helpers.browser import Watched, screenshot, served_dashboard  # noqa: E402
from tests.helpers.dashboard_pages import Requests, in_a_thread  # noqa: E402
from tests.helpers.stores import queue_config_dict  # noqa: E402

pytest_plugins = ["tests.helpers.browser"]  # the browser and watched fixtures

T = TypeVar("T")
BASE = "http://127.0.0.1:8080"
STORES = ["filesystem", "s3"]
HOSTILE = "<img src=x onerror=window.__pwned=1>"


class Clock:
    """The dashboard's wall clock, standing still but when moved on by hand."""

    def __init__(self) -> None:
        self.start = now_utc()
        self.offset = 0.0

    def __call__(self) -> datetime:
        return self.start + timedelta(seconds=self.offset)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@contextmanager
def client_for(
    config: dict[str, Any], dashboard: DashboardSettings, store: Store, clock: Clock
) -> Iterator[TestClient]:
    app = create_app(load_config(config), dashboard, store=store, clock=clock)
    with TestClient(app, base_url=BASE, follow_redirects=False) as client:
        yield client


def write_markers(config: dict[str, Any], name: str, missed: list[int]) -> str:
    """Tick markers of ``name``, one a second until a few seconds ago, recording ``missed``
    ticks each (as runners write them); the key of the one that records any."""
    recorded: list[str] = []

    async def write() -> None:
        store = open_store(load_config(config))
        try:
            newest = now_utc().replace(microsecond=0) - timedelta(seconds=5)
            for k, count in enumerate(missed):
                tick = newest - timedelta(seconds=len(missed) - 1 - k)
                key = layout.schedule_tick_key(name, tick)
                await store.put(key, marker_body(str(uuid.uuid4()), now_utc(), count), "create")
                if count:
                    recorded.append(key)
        finally:
            await store.close()

    in_a_thread(write)
    [key] = recorded
    return key


def write_definitions(config: dict[str, Any], definitions: dict[str, bytes]) -> None:
    """Definitions as another program could write them, under ``_schedules/``."""

    async def write() -> None:
        store = open_store(load_config(config))
        try:
            for name, data in definitions.items():
                await store.put(f"{layout.SCHEDULES}{name}{layout.MESSAGE_SUFFIX}", data)
        finally:
            await store.close()

    in_a_thread(write)


def rows_of(client: TestClient) -> dict[str, dict[str, Any]]:
    answer = client.get("/api/schedules")
    assert answer.status_code == 200, answer.text
    return {row["schedule"]: row for row in answer.json()["schedules"]}


def test_the_schedules_page_lists_each_with_its_stats_at_a_bounded_cost(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("reports")
        pq.create_schedule("nightly", "reports", cron="0 2 * * *", timezone="Europe/Berlin")
        pq.pause_schedule("nightly")
        pq.create_schedule("heartbeat", "reports", every=60, priority=9, expires_in=30)
        pq.create_schedule("fast", "reports", every=1)
        recorded = write_markers(config, "fast", [0, 3, 0])
        write_definitions(config, {"broken": b"not a definition"})
        schedules = {s.name: s for s in pq.list_schedules()}
        api = {name: pq.schedule_stats(name) for name in schedules}
    assert (api["fast"].fired, api["fast"].missed) == (3, 3)

    requests = Requests(open_store(load_config(config)))
    clock = Clock()
    dashboard = DashboardSettings(refresh=2, full_refresh=3600)
    with client_for(config, dashboard, requests, clock) as client:
        rows = rows_of(client)
        assert list(rows) == ["broken", "fast", "heartbeat", "nightly"]  # by name
        assert "cannot be read" in rows["broken"]["error"]
        for name, stats in api.items():
            row = rows[name]
            last = stats.last_fire_time
            assert row["last_fire_time"] == (last.isoformat() if last else None)
            assert (row["fired"], row["missed"], row["paused"]) == (
                stats.fired,
                stats.missed,
                stats.paused,
            )
            # Next as of the dashboard's clock (standing still at its start).
            rule = schedules[name].rule()
            upcoming = None if stats.paused else rule.next(max(clock(), last or clock()))
            assert row["next_fire_time"] == (upcoming.isoformat() if upcoming else None)
            assert row["topic"] == "reports" and row["error"] is None
        assert (rows["nightly"]["cron"], rows["nightly"]["timezone"]) == (
            "0 2 * * *",
            "Europe/Berlin",
        )
        assert rows["heartbeat"]["every"] == 60.0
        ticks = {name: (row["priority"], row["expires_in"]) for name, row in rows.items()}
        assert ticks == {
            "broken": (None, None),
            "fast": (0, None),
            "heartbeat": (9, 30.0),
            "nightly": (0, None),
        }

        page = client.get("/schedules").text
        assert re.findall(r'<tr data-schedule="([^"]+)"', page) == list(rows)
        nightly = re.search(r'<tr data-schedule="nightly".*?</tr>', page, re.DOTALL)
        assert nightly and "paused" in nightly.group()
        assert "cron 0 2 * * * (Europe/Berlin)" in nightly.group()
        fast = re.search(r'<tr data-schedule="fast".*?</tr>', page, re.DOTALL)
        assert fast and "every 1 s" in fast.group() and "active" in fast.group()
        assert re.search(r'data-col="fired">3<', fast.group())
        assert re.search(r'data-col="missed">3<', fast.group())
        assert re.search(r'data-col="priority">0<', fast.group())
        assert re.search(r'data-col="expires_in">-<', fast.group())  # never expires
        heartbeat = re.search(r'<tr data-schedule="heartbeat".*?</tr>', page, re.DOTALL)
        assert heartbeat and re.search(r'data-col="priority">9<', heartbeat.group())
        # As the page shows durations, with the exact seconds as its tooltip.
        assert re.search(r'data-col="expires_in" title="30 s[^"]*">30.0s<', heartbeat.group())
        assert 'href="/schedules"' in client.get("/").text  # in the navigation

        # A read once they are a refresh interval old: one LIST of the definitions, a GET
        # of each, and what schedule_stats reads: a LIST of each one's markers (one page
        # here) and a GET of the marker that records missed ticks.
        requests.sent.clear()
        clock.advance(dashboard.refresh)
        rows_of(client)
        readable = ["fast", "heartbeat", "nightly"]
        expected = [("list", layout.SCHEDULES)]
        expected += [("get", layout.schedule_key(name)) for name in [*readable, "broken"]]
        expected += [("list", layout.schedule_ticks_prefix(name)) for name in readable]
        expected += [("get", recorded)]
        assert requests.reads() == sorted(expected)
        monitor: Monitor = client.app.state.monitor  # type: ignore[attr-defined]
        assert monitor.look_cost[SCHEDULES] == len(expected)
        state = client.get("/api/state?page=/schedules").json()
        looks = len(expected) * 60 / dashboard.refresh
        assert state["open_per_minute"] == round(state["idle_per_minute"] + looks, 1)

        # And not again within the refresh interval.
        requests.sent.clear()
        assert "heartbeat" in client.get("/schedules").text
        rows_of(client)
        assert requests.reads() == []


def test_no_schedules_says_so(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    store = open_store(load_config(config))
    with client_for(config, DashboardSettings(refresh=0.1), store, Clock()) as client:
        assert "No schedules in this store" in client.get("/schedules").text
        empty = {"schedules": [], "unread": 0, "error": None}
        assert client.get("/api/schedules").json() == empty


# -- in a browser --------------------------------------------------------------------------


@pytest.fixture(params=STORES)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    return queue_config_dict(str(request.param), request, tmp_path)


def wait_for_fired(page: Any, name: str, done: Callable[[int], bool], timeout: float = 30) -> int:
    """Until the page's own script showed a fired count of ``name`` that ``done`` takes."""
    cell = page.locator(f'#schedules tr[data-schedule="{name}"] td[data-col="fired"]')
    deadline = time.monotonic() + timeout
    while True:
        shown = int(cell.inner_text())
        if done(shown):
            return shown
        assert time.monotonic() < deadline, f"{name} shows {shown} fired"
        page.wait_for_timeout(100)


def test_the_schedules_page_follows_the_ticks(config: dict[str, Any], watched: Watched) -> None:
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("reports")
        pq.create_schedule("fast", "reports", every=1, priority=7, expires_in=5400)
        pq.create_schedule("nightly", "reports", cron="0 2 * * *", timezone="Europe/Berlin")
        pq.pause_schedule("nightly")
        # What another program could store: a topic name that is markup.
        hostile = Schedule(name="hostile", topic=HOSTILE, cron=None, every=3600.0)
        write_definitions(config, {"hostile": encode_schedule(hostile)})
        stop = threading.Event()
        runner = threading.Thread(target=pq.run_schedules, kwargs={"stop": stop}, daemon=True)
        with served_dashboard(config, DashboardSettings(refresh=0.3, full_refresh=30)) as served:
            page = watched.page
            page.goto(served.url + "/schedules")
            names = page.locator("#schedules tbody tr").evaluate_all(
                "rows => rows.map(r => r.dataset.schedule)"
            )
            assert names == ["fast", "hostile", "nightly"]
            nightly = page.locator('#schedules tr[data-schedule="nightly"]')
            fast = page.locator('#schedules tr[data-schedule="fast"]')
            assert nightly.locator('td[data-col="status"]').inner_text() == "paused"
            assert nightly.locator('td[data-col="next_fire"]').inner_text() == "-"
            spec = nightly.locator('td[data-col="spec"]').inner_text()
            assert spec == "cron 0 2 * * * (Europe/Berlin)"
            ticks = [
                [row.locator(f'td[data-col="{col}"]').inner_text() for row in (nightly, fast)]
                for col in ("priority", "expires_in")
            ]
            assert ticks == [["0", "7"], ["-", "90.0m"]]  # 5,400 s shown as the page's ages
            assert HOSTILE in page.locator("#schedules").inner_text()  # as text
            assert page.evaluate("window.__pwned") is None
            assert page.locator("main img").count() == 0
            assert wait_for_fired(page, "fast", lambda n: n == 0) == 0

            # A runner elsewhere fires ticks: the page follows without a reload.
            page.evaluate("window.__sameDocument = 1")
            runner.start()
            try:
                wait_for_fired(page, "fast", lambda n: n >= 2)
            finally:
                stop.set()
                runner.join(timeout=30)
            fired = pq.schedule_stats("fast").fired
            wait_for_fired(page, "fast", lambda n: n == fired)
            last = page.locator('#schedules tr[data-schedule="fast"] td[data-col="last_fire"]')
            assert "ago" in last.inner_text()
            assert page.evaluate("window.__sameDocument") == 1
            screenshot(page, f"schedules-{config['backend']}")
    said = "\n".join(watched.console + watched.errors + watched.dialogs)
    assert "pwned" not in said and not watched.errors, said
