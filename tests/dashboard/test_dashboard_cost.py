"""The footer's figure of what the dashboard costs: at start it reads everything once, a burst
that is not its rate. Until a minute has passed the footer says how many requests it sent so
far and in how long; then, how many it sent in the last minute."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient

from pawn_queue.config import load_config
from pawn_queue.dashboard import DashboardSettings, create_app
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.store.memory import MemoryStore
from tests.helpers.stores import queue_config_dict


class Clock:
    """The meter's monotonic clock, moved on by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def metered(clock: Clock) -> RequestMeter:
    store = MemoryStore()
    await store.put("a/b", b"x")  # not through the meter: not counted
    return RequestMeter(store, clock=clock)


async def send(meter: RequestMeter, count: int) -> None:
    for _ in range(count):
        await meter.head("a/b")


async def test_the_start_up_burst_is_not_scaled_to_a_minute() -> None:
    """131 requests in the first 10 s (everything read once), then one a second: the footer
    said 786 requests/min at 10 s (131 scaled to a minute)."""
    clock = Clock()
    meter = await metered(clock)
    await send(meter, 131)
    clock.now += 10
    cost = meter.cost()
    assert cost.per_minute is None  # no rate yet
    assert (cost.last_minute, cost.window_seconds) == (131, 10)
    assert cost.summary == "131 requests in the first 10 s"

    clock.now += 1.5  # the first steady request, 11.5 s after start: within the first 12 s
    await send(meter, 1)
    assert meter.cost().summary == "132 requests in the first 12 s"
    for _ in range(99):  # one a second, until 110.5 s after start
        clock.now += 1
        await send(meter, 1)
    clock.now += 0.25
    cost = meter.cost()
    assert cost.per_minute == cost.last_minute == 60  # those of 51.5 s to 110.5 s
    assert cost.window_seconds == 60
    assert cost.summary == "60 requests in the last minute"
    assert cost.total == 131 + 100


async def test_the_first_minute_counts_the_burst_as_sent_in_it() -> None:
    clock = Clock()
    meter = await metered(clock)
    await send(meter, 100)
    clock.now += 30
    await send(meter, 1)
    clock.now += 30
    cost = meter.cost()
    assert cost.per_minute == 101 and cost.summary == "101 requests in the last minute"
    clock.now += 1
    cost = meter.cost()
    assert cost.per_minute == 1 and cost.summary == "1 request in the last minute"


def test_the_footer_right_after_start_says_what_was_sent_so_far(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    (tmp_path / "queue").mkdir()
    config: dict[str, Any] = queue_config_dict("filesystem", request, tmp_path)
    app = create_app(load_config(config), DashboardSettings(refresh=0.1, full_refresh=30.0))
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        page = client.get("/").text
        state = client.get("/api/state").json()
    footer = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page[page.index("<footer>") :]))
    shown = re.search(r"Dashboard cost: (\d+) requests? in the first \d+ s \( ?(\d+) since", footer)
    assert shown is not None, footer
    assert "requests/min" not in footer.split("While nothing changes")[0]
    assert int(shown[1]) == int(shown[2]) > 0  # all it sent, since it started
    assert re.fullmatch(r"\d+ requests? in the first \d+ s", state["cost"]["summary"])
    assert state["cost"]["per_minute"] is None
