"""Dead letters by reason on the dashboard (``expired`` among them), for a topic and for its
subscriptions, on the pages and in the JSON API; what reading the reasons costs (a GET of
each dead letter the first time it is listed, none after); the note for topics that delete
expired messages; each dead letter's priority in the listings; and, in a real browser
(Debian's Chromium through Playwright), the topic page following an expired message's dead
letter without a reload.

The consumers run on a clock ahead of the producers': messages are past their expiry for
them without the test waiting. The app test runs first: the browser fixture keeps
Playwright's event loop running in this thread once it is open (see tests/helpers/browser.py).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.register_assert_rewrite("tests.helpers.browser")  # imported here, and as a plugin

from starlette.testclient import TestClient  # noqa: E402 - after the skip

from pawn_queue import PawnQueue  # noqa: E402
from pawn_queue._protocol import layout  # noqa: E402
from pawn_queue.config import load_config  # noqa: E402
from pawn_queue.dashboard import DashboardSettings, create_app  # noqa: E402
from pawn_queue.store import open_store  # noqa: E402
from pawn_queue.store.base import Store  # noqa: E402
from tests.helpers.browser import Watched, screenshot, served_dashboard  # noqa: E402
from tests.helpers.dashboard_pages import Requests, in_a_thread  # noqa: E402
from tests.helpers.stores import queue_config_dict  # noqa: E402

pytest_plugins = ["tests.helpers.browser"]  # the browser and watched fixtures
pytestmark = pytest.mark.usefixtures("quick_subscription_changes")  # all in this process

BASE = "http://127.0.0.1:8080"
AHEAD = 60.0  # how far the consumers' clock runs ahead: past every expiry published here


class Clock:
    """The wall clock, ``offset`` seconds on (the dashboard's, moved on by hand)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset)


@contextmanager
def client_for(config: dict[str, Any], store: Store, clock: Clock) -> Iterator[TestClient]:
    # Reads happen when the test moves the clock on by a refresh interval, never meanwhile.
    dashboard = DashboardSettings(refresh=2, full_refresh=3600)
    app = create_app(load_config(config), dashboard, store=store, clock=clock)
    with TestClient(app, base_url=BASE, follow_redirects=False) as client:
        yield client


async def dead_letter_orders(config: dict[str, Any]) -> dict[str, list[str]]:
    """Topic ``orders`` (expired messages dead-lettered) with two expired dead letters of
    priority 7, a nacked one and one dead-lettered as ``poison`` (priority 3); topic
    ``events`` with one expired dead letter in its subscription ``billing``; topic ``plain``
    (expired messages deleted). Returns the ids by reason."""
    async with (
        await PawnQueue.from_config(config) as producing,
        PawnQueue(load_config(config), clock=Clock(AHEAD)) as consuming,
    ):
        for topic in ("orders", "events"):
            await producing.create_topic(topic, retention_action="dead_letter")
        await producing.create_topic("plain")
        # A subscription's expiry follows its own retention_action.
        await producing.create_subscription("events", "billing", retention_action="dead_letter")
        producer = await producing.register_producer("checkout")
        ids: dict[str, list[str]] = {"expired": [], "nack": [], "poison": []}
        for n in range(2):
            ids["expired"].append(
                await producer.publish("orders", {"n": n}, expires_in=1, priority=7)
            )
        ids["nack"].append(await producer.publish("orders", {"nack": True}))
        ids["poison"].append(await producer.publish("orders", {"poison": True}, priority=3))
        ids["events"] = [await producer.publish("events", {"e": 1}, expires_in=1)]
        consumer = await consuming.register_consumer("billing", topics=["orders"])
        while messages := await consumer.poll():
            for message in messages:
                if "poison" in message.payload:
                    await message.dead_letter("poison", "cannot be parsed")
                else:
                    await message.nack()
        subscriber = await consuming.register_consumer(
            "billing", topics=["events"], subscription="billing"
        )
        assert await subscriber.poll() == []  # its one message expired: dead-lettered
        assert len(await producing.dead_letters("orders")) == 4
        assert len(await producing.dead_letters("events", subscription="billing")) == 1
    return ids


async def nack_one(config: dict[str, Any], topic: str) -> str:
    async with await PawnQueue.from_config(config) as pq:
        message_id = await (await pq.register_producer("checkout")).publish(topic, {"late": 1})
        consumer = await pq.register_consumer("billing", topics=[topic])
        [message] = await consumer.poll(wait=2)
        await message.nack()
        return message_id


def reasons_of(stats: dict[str, Any]) -> tuple[dict[str, int], int]:
    return stats["dead_letter_reasons"], stats["dead_letter_reasons_unread"]


def topic_stats(client: TestClient, topic: str) -> dict[str, Any]:
    rows = {row["topic"]: row for row in client.get("/api/topics").json()}
    stats: dict[str, Any] = rows[topic]["stats"]
    return stats


def subscription_stats(client: TestClient, topic: str, name: str) -> dict[str, Any]:
    answer = client.get(f"/api/topics/{topic}/subscriptions").json()
    [stats] = [row["stats"] for row in answer["subscriptions"] if row["subscription"] == name]
    assert isinstance(stats, dict)
    return stats


def dead_letter_gets(requests: Requests) -> Counter[str]:
    """The GETs of dead letters sent, by key."""
    return Counter(
        key
        for operation, key in requests.sent
        if operation == "get" and f"/{layout.DEAD_LETTER}" in key
    )


def test_dead_letters_are_counted_by_reason_reading_each_once(
    queue_config: dict[str, Any],
) -> None:
    ids = asyncio.run(dead_letter_orders(queue_config))
    requests = Requests(open_store(load_config(queue_config)))
    clock = Clock()
    with client_for(queue_config, requests, clock) as client:
        orders = {"expired": 2, "nack": 1, "poison": 1}
        assert reasons_of(topic_stats(client, "orders")) == (orders, 0)
        assert reasons_of(topic_stats(client, "plain")) == ({}, 0)
        # Each dead letter read once, for its reason.
        letters = [i for reason in ("expired", "nack", "poison") for i in ids[reason]]
        keys = {layout.dead_letter_key("orders", i) for i in letters}
        assert dead_letter_gets(requests) == Counter(keys)

        page = client.get("/topics/orders").text
        shown = re.search(r'<p class="dead-reasons" id="dead-reasons">.*?</p>', page, re.DOTALL)
        assert shown, page
        counted = re.findall(r'data-reason="([^"]*)">[^<]*<span class="n">(\d+)<', shown.group())
        assert counted == [("expired", "2"), ("nack", "1"), ("poison", "1")]
        assert 'id="expired-deleted"' not in page  # its expired messages are dead letters
        overview = client.get("/").text
        assert 'title="expired 2, nack 1, poison 1"' in overview

        # A subscription's, on the topic page and in the API.
        billing = subscription_stats(client, "events", "billing")
        assert reasons_of(billing) == ({"expired": 1}, 0)
        events = client.get("/topics/events").text
        row = re.search(r'<tr data-subscription="billing".*?</tr>', events, re.DOTALL)
        assert row and re.search(r'data-reason="expired">expired <span class="n">1<', row.group())

        # Read again a refresh interval later, nothing changed: no dead letter is read again.
        requests.sent.clear()
        clock.offset += 2
        assert reasons_of(topic_stats(client, "orders")) == (orders, 0)
        assert reasons_of(subscription_stats(client, "events", "billing")) == ({"expired": 1}, 0)
        assert dead_letter_gets(requests) == Counter()

        # A new dead letter: that one only is read.
        late = asyncio.run(nack_one(queue_config, "orders"))
        clock.offset += 2
        assert reasons_of(topic_stats(client, "orders")) == ({**orders, "nack": 2}, 0)
        assert dead_letter_gets(requests) == Counter([layout.dead_letter_key("orders", late)])


def test_a_topic_that_deletes_expired_messages_says_only_the_metric_counts_them(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    asyncio.run(dead_letter_orders(config))
    with client_for(config, open_store(load_config(config)), Clock()) as client:
        page = client.get("/topics/plain").text
        note = re.search(r'<p class="hint" id="expired-deleted">(.*?)</p>', page, re.DOTALL)
        assert note and "pawnqueue_messages_expired_total" in note.group(1)
        assert 'id="dead-reasons"' not in page  # no dead letters
        assert 'id="expired-deleted"' not in client.get("/topics/orders").text


def test_dead_letter_listings_show_each_priority(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)
    ids = asyncio.run(dead_letter_orders(config))
    with client_for(config, open_store(load_config(config)), Clock()) as client:
        page = client.get("/topics/orders/dead-letters").text
        rows = re.findall(
            r'<tr data-id="([^"]+)">.*?data-col="priority">(\d)</td>', page, re.DOTALL
        )
        expected = {i: "7" for i in ids["expired"]} | {ids["poison"][0]: "3", ids["nack"][0]: "0"}
        assert dict(rows) == expected
        one = client.get(f"/topics/orders/dead-letters/{ids['poison'][0]}").text
        assert '<td id="priority">3</td>' in one


# -- in a browser --------------------------------------------------------------------------


def test_the_topic_page_shows_an_expired_dead_letter_without_a_reload(
    tmp_path: Path, request: pytest.FixtureRequest, watched: Watched
) -> None:
    (tmp_path / "queue").mkdir()
    config = queue_config_dict("filesystem", request, tmp_path)

    async def expire_one(published: bool) -> None:
        async with (
            await PawnQueue.from_config(config) as producing,
            PawnQueue(load_config(config), clock=Clock(AHEAD)) as consuming,
        ):
            if not published:
                await producing.create_topic("orders", retention_action="dead_letter")
                return
            await (await producing.register_producer("p")).publish("orders", 1, expires_in=1)
            consumer = await consuming.register_consumer("c", topics=["orders"])
            assert await consumer.poll() == []  # expired: dead-lettered

    in_a_thread(lambda: expire_one(published=False))
    with served_dashboard(config, DashboardSettings(refresh=0.3, full_refresh=30.0)) as served:
        page = watched.page
        page.goto(served.url + "/topics/orders")
        assert page.locator("#dead-reasons").count() == 0
        in_a_thread(lambda: expire_one(published=True))
        expired = page.locator('#dead-reasons [data-reason="expired"] .n')
        expired.wait_for()  # the page's script swaps the counts in
        assert expired.inner_text() == "1"
        assert page.locator("#count-dead-letter").inner_text() == "1"
        screenshot(page, "dead-reasons-filesystem")
    assert not watched.errors, watched.errors
