"""A topic's subscriptions on the dashboard: the topic page lists them with their filter and
the counts of their queues (pending, in flight, delayed, dead letters, lag), as the API
reports them; what a refresh of them costs; and, in a real browser (Debian's Chromium
through Playwright), the page following a subscription's messages without a reload.

The app test runs first: the browser fixture keeps Playwright's event loop running in this
thread once it is open (see tests/helpers/browser.py)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.register_assert_rewrite("tests.helpers.browser")  # imported here, and as a plugin

from starlette.testclient import TestClient  # noqa: E402 - after the skip

from pawn_queue import PawnQueue as AsyncPawnQueue  # noqa: E402
from pawn_queue._protocol import layout  # noqa: E402
from pawn_queue._protocol.envelope import now_utc  # noqa: E402
from pawn_queue.config import load_config  # noqa: E402
from pawn_queue.dashboard import DashboardSettings, create_app  # noqa: E402
from pawn_queue.store import open_store  # noqa: E402
from pawn_queue.store.base import Store  # noqa: E402
from pawn_queue.sync import PawnQueue  # noqa: E402
from tests.helpers.browser import Watched, screenshot, served_dashboard  # noqa: E402
from tests.helpers.dashboard_pages import Requests, csrf_of, dead_letter  # noqa: E402
from tests.helpers.stores import queue_config_dict  # noqa: E402

pytest_plugins = ["tests.helpers.browser"]  # the browser and watched fixtures
pytestmark = pytest.mark.usefixtures("quick_subscription_changes")  # all in this process

T = TypeVar("T")
BASE = "http://127.0.0.1:8080"
STORES = ["filesystem", "s3"]
HOSTILE = "<img src=x onerror=window.__pwned=1>"
COLUMNS = ("pending", "in_flight", "delayed", "dead_letter")


class Clock:
    """The dashboard's wall clock, standing still but when moved on by hand: "a refresh
    interval later", exactly, however long the test's own steps take."""

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


async def subscribe(config: dict[str, Any], topic: str, filters: dict[str, Any]) -> None:
    """The topic and its subscriptions, created at once (each waits for the producers)."""
    async with await AsyncPawnQueue.from_config(config) as pq:
        await pq.create_topic(topic)
        await asyncio.gather(
            *(pq.create_subscription(topic, name, filter=f) for name, f in filters.items())
        )


def stats_of(client: TestClient, topic: str) -> dict[str, dict[str, Any]]:
    answer = client.get(f"/api/topics/{topic}/subscriptions")
    assert answer.status_code == 200, answer.text
    return {row["subscription"]: row["stats"] for row in answer.json()["subscriptions"]}


# Counts the requests of each refresh, which a saturated machine's lapsed leases change.
@pytest.mark.alone
def test_the_topic_page_lists_its_subscriptions_with_their_counts(
    queue_config: dict[str, Any],
) -> None:
    # What is polled stays in flight for the whole test, however slow the store is today
    # (with the suite's 3 s, a slow S3 server let the leases lapse between two reads).
    queue_config = {
        **queue_config,
        "polling": {**queue_config["polling"], "visibility_timeout_seconds": 600.0},
    }
    asyncio.run(subscribe(queue_config, "orders", {"billing": None, "eu": {"region": "eu"}}))
    with PawnQueue.from_config(queue_config) as pq:
        producer = pq.register_producer("checkout")
        for n in range(6):
            producer.publish("orders", {"n": n}, attributes={"region": ["eu", "us"][n % 2]})
        producer.publish_batch("orders", [{"b": n} for n in range(50)], attributes={"region": "us"})
        producer.publish("orders", {"later": True}, delay=600, attributes={"region": "eu"})
        consumer = pq.register_consumer("billing", ["orders"], subscription="billing")
        polled = consumer.poll()  # billing: some in flight
        polled[0].nack()  # and a dead letter
        api = {name: pq.subscription_stats("orders", name) for name in ("billing", "eu")}
        assert api["eu"].pending == 3 and api["eu"].delayed == 1
        assert pq.topic_stats("orders").pending == 0  # the topic's own queue gets nothing

        requests = Requests(open_store(load_config(queue_config)))
        clock = Clock()
        # Reads happen when the test moves the clock on by a refresh interval (less than the
        # visibility timeout: what is in flight stays so), never by themselves meanwhile.
        dashboard = DashboardSettings(refresh=2, full_refresh=3600)
        with client_for(queue_config, dashboard, requests, clock) as client:
            shown = stats_of(client, "orders")
            # Messages (the batch object holds 50), with the objects of subscription_stats.
            assert shown["eu"]["pending"] == 3 and shown["eu"]["delayed"] == 1
            assert shown["eu"]["dead_letter"] == 0 and shown["eu"]["in_flight"] == 0
            billing = shown["billing"]
            assert billing["dead_letter"] == api["billing"].dead_letter == 1
            assert billing["pending"] + billing["in_flight"] == 6 + 50 - 1
            assert billing["in_flight_objects"] == api["billing"].in_flight
            assert billing["pending_objects"] == api["billing"].pending
            assert shown["eu"]["oldest_age_seconds"] is not None  # its lag
            page = client.get("/topics/orders").text
            rows = re.findall(r'<tr data-subscription="([^"]+)"', page)
            assert rows == ["billing", "eu"]
            assert "region=&#34;eu&#34;" in page and "every message" in page
            row = re.search(r'<tr data-subscription="eu".*?</tr>', page, re.DOTALL)
            assert row and re.search(r'data-col="pending"[^>]*>3<', row.group())

            # A refresh once they are a refresh interval old, nothing having changed: per
            # subscription three LISTs of its queue (messages, leases, dead letters; its
            # batch object was read once, the first time), and at most one GET of the
            # topic's subscription index (none while the queue's copy is under 2 s old).
            requests.sent.clear()
            clock.advance(dashboard.refresh)
            assert without_lag(stats_of(client, "orders")) == without_lag(shown)
            for name in ("billing", "eu"):
                queue = layout.subscription_queue("orders", name)
                assert requests.under(f"{queue}/") == ["list", "list", "list"], name
            index = requests.under(layout.subscription_index_key("orders"))
            assert index in ([], ["get"])
            topic_own = [(op, key) for op, key in requests.sent if layout.queue_of(key) == "orders"]
            assert sorted(op for op, _ in topic_own) == sorted(["list"] * 3 + index)
            reads = [key for _, key in requests.sent if not key.startswith(layout.NOTIFY)]
            assert len(reads) == 2 * 3 + 3 + len(index), requests.sent
            # And not again within the refresh interval: pages cost that once per interval.
            requests.sent.clear()
            assert "billing" in client.get("/topics/orders").text
            stats_of(client, "orders")
            assert requests.under("orders/subscriptions/") == []
            assert requests.under(layout.subscription_index_key("orders")) == []
        consumer.release_all()


def without_lag(stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The counts but the lag (the age of the oldest pending message grows as time goes)."""
    return {
        name: {k: v for k, v in row.items() if k != "oldest_age_seconds"}
        for name, row in stats.items()
    }


def test_a_topic_without_subscriptions_says_so_and_an_unknown_one_is_404(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("plain")
    store = open_store(load_config(config))
    with client_for(config, DashboardSettings(refresh=0.1), store, Clock()) as client:
        assert "No subscriptions" in client.get("/topics/plain").text
        assert stats_of(client, "plain") == {}
        assert client.get("/api/topics/nope/subscriptions").status_code == 404


def test_a_subscription_s_dead_letters_are_listed_redriven_and_purged_apart(
    tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    asyncio.run(subscribe(config, "orders", {"billing": None, "shipping": None}))
    with PawnQueue.from_config(config) as pq:
        ids = dead_letter(pq, "orders", 3, subscription="billing")
        store = open_store(load_config(config))
        dashboard = DashboardSettings(refresh=0.1, allow_actions=True)
        with client_for(config, dashboard, store, Clock()) as client:
            topic_page = client.get("/topics/orders").text
            link = "/topics/orders/dead-letters?subscription=billing"
            assert f'href="{link}"' in topic_page
            page = client.get(link)
            assert page.status_code == 200
            assert sorted(re.findall(r'<tr data-id="([^"]+)"', page.text)) == sorted(ids)
            assert "/dead-letters/redrive?subscription=billing" in page.text
            # The topic's own dead letters and the other subscription's are apart.
            assert "No dead letters" in client.get("/topics/orders/dead-letters").text
            shipping = client.get("/topics/orders/dead-letters?subscription=shipping").text
            assert "No dead letters" in shipping
            one = client.get(f"/topics/orders/dead-letters/{ids[0]}?subscription=billing")
            assert one.status_code == 200 and '"n": 0' in one.text.replace("&#34;", '"')
            assert client.get(f"/topics/orders/dead-letters/{ids[0]}").status_code == 404
            assert client.get("/topics/orders/dead-letters?subscription=nope").status_code == 404
            bad = client.get("/topics/orders/dead-letters?subscription=a%2Fb")
            assert bad.status_code == 400

            csrf = csrf_of(page.text)
            redrive = "/topics/orders/dead-letters/redrive?subscription=billing"
            asked = client.post(redrive, data={"id": ids[0], "csrf": csrf})
            assert "of subscription <strong>billing</strong>" in asked.text
            assert "/dead-letters/redrive?subscription=billing" in asked.text
            with caplog.at_level(logging.INFO, logger="pawn_queue.dashboard"):
                done = client.post(redrive, data={"id": ids[0], "csrf": csrf, "confirmed": "yes"})
                assert done.status_code == 303
                assert done.headers["location"] == (
                    "/topics/orders/dead-letters?done=redrove&count=1&subscription=billing"
                )
                purge = "/topics/orders/dead-letters/purge?subscription=billing"
                purged = client.post(purge, data={"csrf": csrf, "confirmed": "yes"})
                assert purged.headers["location"].endswith("count=2&subscription=billing")
        assert pq.dead_letters("orders", subscription="billing") == []
        assert pq.subscription_stats("orders", "billing").pending == 1  # the one redriven
        assert pq.subscription_stats("orders", "shipping").pending == 3  # untouched
    logged = [r.getMessage() for r in caplog.records if "dashboard action" in r.getMessage()]
    assert any("redrive topic=orders subscription=billing dead_letters=1" in m for m in logged)
    assert any("purge topic=orders subscription=billing dead_letters=2" in m for m in logged)


# -- in a browser --------------------------------------------------------------------------


@pytest.fixture(params=STORES)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    return queue_config_dict(str(request.param), request, tmp_path)


def shown_row(page: Any, name: str) -> dict[str, int]:
    row = page.locator(f'#subscriptions tr[data-subscription="{name}"]')
    return {c: int(row.locator(f'td[data-col="{c}"]').inner_text()) for c in COLUMNS}


def api_row(pq: PawnQueue, name: str) -> dict[str, int]:
    stats = pq.subscription_stats("orders", name)
    return {c: getattr(stats, c) for c in COLUMNS}


def wait_for_row(page: Any, name: str, expected: dict[str, int], timeout: float = 15.0) -> None:
    """Until the page's own script showed ``expected`` in the subscription's row."""
    deadline = time.monotonic() + timeout
    while True:
        shown = shown_row(page, name)
        if shown == expected:
            return
        assert time.monotonic() < deadline, f"{name} shows {shown}, never {expected}"
        page.wait_for_timeout(100)


def test_the_topic_page_follows_its_subscriptions(config: dict[str, Any], watched: Watched) -> None:
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("orders")
        pq.create_subscription("orders", "shipping")
        pq.create_subscription("orders", "eu", filter={"region": "eu", "note": HOSTILE})
        producer = pq.register_producer("checkout")
        for n in range(3):
            producer.publish("orders", {"n": n}, attributes={"region": "eu", "note": HOSTILE})
        consumer = pq.register_consumer("shipper", ["orders"], subscription="shipping")
        [first, *_] = consumer.poll()
        first.extend(60)  # in flight while the page is looked at
        expected = {name: api_row(pq, name) for name in ("shipping", "eu")}
        assert expected["eu"] == {"pending": 3, "in_flight": 0, "delayed": 0, "dead_letter": 0}
        assert expected["shipping"]["in_flight"] >= 1

        with served_dashboard(config, DashboardSettings(refresh=0.3, full_refresh=30)) as served:
            page = watched.page
            page.goto(served.url + "/topics/orders")
            assert {name: shown_row(page, name) for name in expected} == expected
            assert HOSTILE in page.locator("#subscriptions").inner_text()  # as text
            assert page.evaluate("window.__pwned") is None
            lag = page.locator(
                '#subscriptions tr[data-subscription="eu"] td[data-col="oldest_age"]'
            )
            assert lag.inner_text().strip() not in ("", "-")
            screenshot(page, f"subscriptions-{config['backend']}")

            # Published and consumed elsewhere: the rows follow without a reload.
            page.evaluate("window.__sameDocument = 1")
            producer.publish("orders", {"n": 3}, attributes={"region": "eu", "note": HOSTILE})
            producer.publish("orders", {"n": 4}, attributes={"region": "us"})
            first.ack()
            expected = {name: api_row(pq, name) for name in ("shipping", "eu")}
            assert expected["eu"]["pending"] == 4
            for name, row in expected.items():
                wait_for_row(page, name, row)
            assert page.evaluate("window.__sameDocument") == 1
        consumer.release_all()
    said = "\n".join(watched.console + watched.errors + watched.dialogs)
    assert "pwned" not in said and not watched.errors, said


def test_a_subscription_s_dead_letter_is_opened_and_redriven_from_the_page(
    tmp_path: Path, request: pytest.FixtureRequest, watched: Watched
) -> None:
    config = queue_config_dict("filesystem", request, tmp_path)
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("orders")
        for name in ("billing", "shipping"):
            pq.create_subscription("orders", name)
        ids = dead_letter(pq, "orders", 2, subscription="billing")
        settings = DashboardSettings(refresh=0.3, full_refresh=30, allow_actions=True)
        with served_dashboard(config, settings) as served:
            page = watched.page
            page.goto(served.url + "/topics/orders")
            page.click(
                '#subscriptions tr[data-subscription="billing"] td[data-col="dead_letter"] a'
            )
            assert "subscription billing of" in page.locator("h1").inner_text()
            rows = page.locator("#dead-letters tbody tr")
            assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.id)")) == sorted(ids)
            page.click(f'#dead-letters a:text("{ids[1]}")')
            page.click("#redrive-one")
            question = page.locator("#confirm-question").inner_text()
            assert "Publish 1 dead letter of subscription billing of topic orders" in question
            page.click("#confirm")
            assert "redrove 1 dead letters" in page.locator(".banner.notice").inner_text()
            assert page.locator("#dead-letters tbody tr").count() == 1
        assert [d.id for d in pq.dead_letters("orders", subscription="billing")] == [ids[0]]
        assert pq.subscription_stats("orders", "billing").pending == 1
        assert pq.subscription_stats("orders", "shipping").dead_letter == 0
    assert not watched.errors, watched.errors
