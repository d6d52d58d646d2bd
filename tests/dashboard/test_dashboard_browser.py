"""The dashboard in a real browser (Debian's Chromium through Playwright), on a local
directory and on SeaweedFS: what the pages show against what the API reports, live updates,
the dead-letter actions, hostile data, and what the dashboard itself costs while idle.

The data is written and checked through the blocking API (Playwright's own API blocks too,
and may not run inside an event loop). Every page visited is saved under
test-artifacts/dashboard/; with UPDATE_DASHBOARD_SCREENSHOT=1 the overview is also written
to docs/dashboard.png, the README's picture.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue as AsyncPawnQueue
from pawn_queue.config import load_config
from pawn_queue.dashboard import DashboardSettings
from pawn_queue.store import open_store
from pawn_queue.store.counting import CountingStore
from pawn_queue.sync import PawnQueue
from tests.helpers.stores import queue_config_dict

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.register_assert_rewrite("tests.helpers.browser")  # imported here, and as a plugin

from tests.helpers.browser import (  # noqa: E402 - after the rewrite is registered
    README_SCREENSHOT,
    UPDATE_SCREENSHOT_VAR,
    Watched,
    screenshot,
    served_dashboard,
)

pytest_plugins = ["tests.helpers.browser"]  # the browser and watched fixtures

STORES = ["filesystem", "s3"]
PWNED = "window.__pwned = 1; console.log('pwned')"
HOSTILE_PAYLOAD = {
    "note": f"<script>{PWNED}</script>",
    "html": f'"><img src=x onerror="{PWNED}">',
}
HOSTILE_ATTRIBUTE = '"\'><svg onload="window.__pwned=1">'
HOSTILE_GROUP = '<b onmouseover="window.__pwned=1">group</b>'
HOSTILE_ERROR = "</pre><script>window.__pwned=1</script>"
HOSTILE_TOPIC = "<img src=x onerror=window.__pwned=1>"
HOSTILE_CONSUMER = "<script>window.__pwned=1</script>"


@pytest.fixture(params=STORES)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    return queue_config_dict(str(request.param), request, tmp_path)


def fast(**overrides: Any) -> DashboardSettings:
    values: dict[str, Any] = {"refresh": 0.3, "full_refresh": 30.0, **overrides}
    return DashboardSettings(**values)


def shown_counts(page: Any, topic: str) -> dict[str, int]:
    row = page.locator(f'#topics tr[data-topic="{topic}"]')
    return {
        column: int(row.locator(f'td[data-col="{column}"]').inner_text())
        for column in ("pending", "in_flight", "delayed", "dead_letter")
    }


def api_counts(pq: PawnQueue, topic: str) -> dict[str, int]:
    stats = pq.topic_stats(topic)
    return {
        "pending": stats.pending,
        "in_flight": stats.in_flight,
        "delayed": stats.delayed,
        "dead_letter": stats.dead_letter,
    }


def wait_for_text(page: Any, selector: str, text: str, timeout: float = 15.0) -> None:
    """Until the element shows ``text``, updated by the page's own script (no reload)."""
    deadline = time.monotonic() + timeout
    locator = page.locator(selector)
    while time.monotonic() < deadline:
        if locator.count() and locator.first.inner_text().strip() == text:
            return
        page.wait_for_timeout(100)
    shown = locator.first.inner_text() if locator.count() else None
    raise AssertionError(f"{selector} never showed {text!r} (shows {shown!r})")


def test_overview_shows_what_the_api_reports_and_follows_publishes(
    config: dict[str, Any], watched: Watched
) -> None:
    with PawnQueue.from_config(config) as pq:
        pq.create_topic("orders", max_receive_count=3, claims="message")
        pq.create_topic("jobs", claims="message")
        pq.create_topic("quiet", claims="message")
        producer = pq.register_producer("checkout")
        for n in range(2):
            producer.publish("orders", {"order": n, "item": "widget"})
        billing = pq.register_consumer("billing", ["orders"])
        first, second = billing.poll()
        first.nack()  # a dead letter
        second.extend(60)  # in flight while the page is looked at
        for n in range(2, 4):
            producer.publish("orders", {"order": n, "item": "widget"})
        producer.publish("jobs", {"job": "later"}, delay=600)
        producer.publish("jobs", {"job": "now"}, group="customer-42")
        expected = {topic: api_counts(pq, topic) for topic in ("orders", "jobs", "quiet")}
        assert expected["orders"] == {"pending": 2, "in_flight": 1, "delayed": 0, "dead_letter": 1}
        assert expected["jobs"]["delayed"] == 1

        with served_dashboard(config, fast()) as served:
            page = watched.page
            page.goto(served.url + "/")
            names = page.locator("#topics tbody td.name").all_inner_texts()
            assert sorted(names) == ["jobs", "orders", "quiet"]
            assert {topic: shown_counts(page, topic) for topic in expected} == expected
            screenshot(page, f"overview-{config['backend']}")

            # A publish from elsewhere shows without a reload, within the refresh interval.
            page.evaluate("window.__sameDocument = 1")
            producer.publish("orders", {"order": 4})
            producer.publish("orders", {"order": 5})
            wait_for_text(page, '#topics tr[data-topic="orders"] td[data-col="pending"]', "4")
            assert page.evaluate("window.__sameDocument") == 1
            assert shown_counts(page, "orders") == api_counts(pq, "orders")

            page.goto(served.url + "/topics/orders")
            assert page.locator("#count-pending").inner_text() == "4"
            assert page.locator("#count-in-flight").inner_text() == "1"
            assert "widget" in page.locator("#head").inner_text()
            assert page.locator("figure.chart svg").count() >= 1
            screenshot(page, f"topic-{config['backend']}")
            page.goto(served.url + "/topics/jobs")
            assert "customer-42" in page.locator("#groups").inner_text()
            page.goto(served.url + "/registry")
            consumers = page.locator("#consumers").inner_text()
            assert "billing" in consumers and "alive" in consumers
            assert "checkout" in page.locator("#producers").inner_text()
            screenshot(page, f"registry-{config['backend']}")

            # A topic with dead letters is highlighted, those it had at start too, and says
            # why; more when they grow.
            page.goto(served.url + "/?sort=dead_letter&desc=1")
            assert page.locator("#topics tr.problem").count() == 1
            row = page.locator('#topics tr[data-topic="orders"]')
            assert row.locator("td.problems").inner_text() == "1 dead letter"
            polled = billing.poll()
            polled[0].dead_letter("handler_error", error="ValueError: no such item")
            billing.release_all()
            wait_for_text(page, '#topics tr[data-topic="orders"] td[data-col="dead_letter"]', "2")
            row = page.locator('#topics tr[data-topic="orders"]')
            assert "problem" in (row.get_attribute("class") or "")
            problems = row.locator("td.problems").inner_text()
            assert "dead letters growing: +1 in 5 min, 2 in all" in problems
            screenshot(page, f"overview-problem-{config['backend']}")
            if os.environ.get(UPDATE_SCREENSHOT_VAR) == "1" and config["backend"] == "s3":
                page.set_viewport_size({"width": 1100, "height": 420})
                page.screenshot(path=str(README_SCREENSHOT))
    assert not watched.errors, watched.errors


def dead_letter_three(pq: PawnQueue, topic: str) -> list[str]:
    pq.create_topic(topic)
    producer = pq.register_producer("checkout")
    ids = [producer.publish(topic, {"order": n, "note": f"order number {n}"}) for n in range(3)]
    consumer = pq.register_consumer("billing", [topic])
    got = 0
    while got < 3:
        for message in consumer.poll(wait=2):
            message.dead_letter("handler_error", error=f"ValueError: bad order {message.id}")
            got += 1
    return ids


def test_dead_letters_open_redrive_and_purge_from_the_page(
    config: dict[str, Any], watched: Watched
) -> None:
    with PawnQueue.from_config(config) as pq:
        ids = dead_letter_three(pq, "orders")
        with served_dashboard(config, fast(allow_actions=True)) as served:
            page = watched.page
            page.goto(served.url + "/topics/orders/dead-letters")
            rows = page.locator("#dead-letters tbody tr")
            assert sorted(rows.evaluate_all("rows => rows.map(r => r.dataset.id)")) == sorted(ids)
            assert "handler_error" in page.locator("#dead-letters").inner_text()
            screenshot(page, f"dead-letters-{config['backend']}")

            # Open one: its payload, error and receive count.
            target = ids[1]
            page.click(f'#dead-letters a:text("{target}")')
            payload = json.loads(page.locator("#payload").inner_text())
            assert payload == {"order": 1, "note": "order number 1"}
            assert f"bad order {target}" in page.locator("table.fields").inner_text()
            screenshot(page, f"dead-letter-{config['backend']}")

            # Redrive it: a confirmation first, then the message is back in the topic.
            page.click("#redrive-one")
            assert "Publish 1 dead letter" in page.locator("#confirm-question").inner_text()
            assert pq.dead_letter("orders", target) is not None  # nothing done yet
            screenshot(page, f"confirm-{config['backend']}")
            page.click("#confirm")
            assert "redrove 1 dead letters" in page.locator(".banner.notice").inner_text()
            assert pq.dead_letter("orders", target) is None
            assert [m.id for m in pq.peek("orders")] == [target]
            assert pq.topic_stats("orders").dead_letter == 2

            # Purge the rest.
            page.click("#purge")
            assert "Delete every dead letter" in page.locator("#confirm-question").inner_text()
            assert len(pq.dead_letters("orders")) == 2
            page.click("#confirm")
            assert "purged 2 dead letters" in page.locator(".banner.notice").inner_text()
            assert pq.dead_letters("orders") == []
            assert page.locator("#dead-letters").count() == 0
            assert [m.id for m in pq.peek("orders")] == [target]  # purge left the topic alone
    assert not watched.errors, watched.errors


def test_without_allow_actions_the_page_offers_none(
    config: dict[str, Any], watched: Watched
) -> None:
    with PawnQueue.from_config(config) as pq:
        ids = dead_letter_three(pq, "orders")
        with served_dashboard(config, fast()) as served:
            page = watched.page
            page.goto(served.url + "/topics/orders/dead-letters")
            assert page.locator("#actions-off").is_visible()
            assert page.locator("#purge, #redrive-all, #redrive-selected").count() == 0
            page.goto(f"{served.url}/topics/orders/dead-letters/{ids[0]}")
            assert page.locator("#redrive-one").count() == 0
            # A hand-made post is refused too, and changes nothing.
            status = page.evaluate(
                """url => fetch(url, {method: 'POST', body: 'all=1&confirmed=yes',
                   headers: {'Content-Type': 'application/x-www-form-urlencoded'}})
                   .then(r => r.status)""",
                f"{served.url}/topics/orders/dead-letters/purge",
            )
            assert status == 403
        assert len(pq.dead_letters("orders")) == 3


def write_hostile_data(config: dict[str, Any]) -> None:
    """Messages, attributes, a group, an error text, a consumer name and a topic marker,
    each made to run a script if a page inserted it as markup."""

    async def main() -> None:
        async with await AsyncPawnQueue.from_config(config) as pq:
            await pq.create_topic("hostile")
            producer = await pq.register_producer("checkout")
            await producer.publish(
                "hostile", HOSTILE_PAYLOAD, attributes={"note": HOSTILE_ATTRIBUTE}
            )
            await producer.publish("hostile", {"grouped": True}, group=HOSTILE_GROUP)
            await producer.publish("hostile", {"dead": HOSTILE_PAYLOAD})
            consumer = await pq.register_consumer("billing", ["hostile"])
            for message in await consumer.poll():
                if message.payload == {"dead": HOSTILE_PAYLOAD}:
                    await message.dead_letter("handler_error", error=HOSTILE_ERROR)
            await consumer.release_all()
            # What other programs could write: names the library itself would refuse.
            await pq.store.put(f"{HOSTILE_TOPIC}/.topic", b'{"topic": "x"}')
            entry = {
                "role": "consumers",
                "name": HOSTILE_CONSUMER,
                "entity_id": "0f6e3f3c-8a4e-4d86-9c47-5f1d3e0c2b1a",
                "registered_at": "2026-01-01T00:00:00+00:00",
                "last_seen": "2026-01-01T00:00:00+00:00",
            }
            key = "_registry/consumers/0f6e3f3c-8a4e-4d86-9c47-5f1d3e0c2b1a.json"
            await pq.store.put(key, json.dumps(entry).encode())

    # In a thread of its own: Playwright keeps an event loop running in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result()


def assert_inert(watched: Watched, literal: str) -> None:
    page = watched.page
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main script, main img, main svg[onload], main [onerror]").count() == 0
    assert page.locator("main [onmouseover], main b").count() == 0
    assert literal in page.locator("main").inner_text()


def test_hostile_payloads_and_names_render_as_text(
    config: dict[str, Any], watched: Watched
) -> None:
    write_hostile_data(config)
    with PawnQueue.from_config(config) as pq:
        [letter] = pq.dead_letters("hostile")
    with served_dashboard(config, fast(allow_actions=True)) as served:
        page = watched.page
        page.goto(served.url + "/")
        assert_inert(watched, HOSTILE_TOPIC)
        assert "not a valid topic name" in page.locator("#topics").inner_text()
        page.goto(served.url + "/topics/hostile")
        assert_inert(watched, "<script>window.__pwned = 1")
        head = page.locator("#head").inner_text()
        assert HOSTILE_ATTRIBUTE in head and HOSTILE_GROUP in head
        screenshot(page, f"hostile-topic-{config['backend']}")
        page.goto(served.url + "/topics/hostile/dead-letters")
        assert_inert(watched, "</pre><script>")
        page.goto(f"{served.url}/topics/hostile/dead-letters/{letter.id}")
        assert_inert(watched, HOSTILE_ERROR)
        assert json.loads(page.locator("#payload").inner_text()) == {"dead": HOSTILE_PAYLOAD}
        page.goto(served.url + "/registry")
        assert_inert(watched, HOSTILE_CONSUMER)
        page.wait_for_timeout(700)  # a few of the page's own refreshes
        assert_inert(watched, HOSTILE_CONSUMER)
    said = "\n".join(watched.console + watched.errors + watched.dialogs)
    assert "pwned" not in said
    # Nothing was even tried: the content policy would have reported a blocked script.
    assert "Content Security Policy" not in said, said


def test_the_request_rate_with_a_page_open_stays_within_what_the_page_reports(
    config: dict[str, Any], watched: Watched
) -> None:
    """While nothing changes, an open overview costs its reads every refresh interval (the
    topic list and each topic's counts) besides the HEADs and full refreshes of a dashboard
    nobody looks at (tests/dashboard/test_dashboard_app.py measures that one)."""
    refresh, full_refresh = 0.5, 4.0
    with PawnQueue.from_config(config) as pq:
        for topic in ("orders", "jobs"):
            pq.create_topic(topic)
        producer = pq.register_producer("checkout")
        for n in range(5):
            producer.publish("orders", {"order": n})
    # The store's own count, outside the dashboard.
    counted = CountingStore(open_store(load_config(config)))
    settings = fast(refresh=refresh, full_refresh=full_refresh)
    with served_dashboard(config, settings, store=counted) as served:
        page = watched.page
        page.goto(served.url + "/")
        page.wait_for_timeout(1500)  # the first looks at the change signals are over
        start_counts = counted.counts.copy()
        started = time.monotonic()
        page.wait_for_timeout(8000)
        elapsed = time.monotonic() - started
        spent = counted.counts - start_counts
        state = page.evaluate("fetch('/api/state').then(r => r.json())")
        idle_per_minute = float(page.locator("#cost-idle").inner_text())
        open_per_minute = float(page.locator("#cost-open").inner_text())
        full_cost = int(page.locator("#cost-full").inner_text())
        total_shown = int(page.locator("#cost-total").inner_text())
        total_counted = counted.counts.total()
        screenshot(page, f"idle-{config['backend']}")
    measured = spent.total()
    # What the page reports as its rate, over this window; one full refresh, one look of the
    # page and two HEADs of slack for where the window falls.
    look = (open_per_minute - idle_per_minute) * refresh / 60
    allowed = open_per_minute * elapsed / 60 + full_cost + look + 2
    assert measured <= allowed, (dict(spent), open_per_minute, full_cost, elapsed)
    assert idle_per_minute == state["idle_per_minute"]
    # The page's reads: the topic list (a LIST and a HEAD per topic, a last LIST) and three
    # LISTs per topic, about once per refresh interval.
    assert 2 * 2 + 1 + 3 * 2 <= look <= 2 * (2 * 2 + 1 + 3 * 2)
    assert spent["LIST"] >= (elapsed / refresh / 2) * (3 * 2 + 2 + 1)
    # The page counts the same requests the store saw (since its script last asked: a look
    # of the page, and a request or two in flight).
    assert abs(total_shown - total_counted) <= look + 3
