"""App subscribers that read subscriptions (``@app.subscriber(topic, subscription=...)``),
on every store: each subscription gets every message, filters hold, the app creates what is
missing and refuses a filter that differs, and TestClient drives such subscribers."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import (
    App,
    ArgumentError,
    Message,
    PawnQueue,
    PawnQueueError,
    SubscriptionConflictError,
    TopicNotFoundError,
)
from pawn_queue.testing import TestClient

pytestmark = pytest.mark.usefixtures("quick_subscription_changes")  # all in this process


class Received:
    """The message ids each subscription's handlers got, and a way to wait for a count."""

    def __init__(self) -> None:
        self.ids: dict[str | None, list[str]] = defaultdict(list)
        self.changed = asyncio.Condition()

    async def add(self, message: Message) -> None:
        async with self.changed:
            self.ids[message.subscription].append(message.id)
            self.changed.notify_all()

    async def wait_for(self, counts: dict[str | None, int]) -> None:
        def reached() -> bool:
            return all(len(self.ids[name]) >= count for name, count in counts.items())

        async with asyncio.timeout(30), self.changed:
            await self.changed.wait_for(reached)


@asynccontextmanager
async def served(app: App) -> AsyncIterator[None]:
    """The app started (topics created) and consuming; stopped at the end."""
    app.create_topics = True
    await app.start()
    serving = asyncio.create_task(app.serve())
    try:
        yield
    finally:
        app.stop_consuming()
        await serving
        await app.stop()


async def test_subscribers_of_different_subscriptions_each_get_every_message(
    queue_config: dict[str, object],
) -> None:
    app = App(queue_config, name="shop")
    received = Received()
    # One function for two subscriptions: the default names tell them apart.
    for subscription in ("billing", "audit"):

        @app.subscriber("orders", subscription=subscription, concurrency=4)
        async def record(order: dict[str, Any], message: Message) -> None:
            await message.ack()  # settled before it counts: the stats below see none in flight
            await received.add(message)

    @app.subscriber("orders", subscription="eu", filter={"region": ["eu", "uk"]})
    async def europe(order: dict[str, Any], message: Message) -> None:
        await message.ack()
        await received.add(message)

    assert [s.name for s in app.subscribers] == ["record.billing", "record.audit", "europe.eu"]
    async with served(app):
        regions = ["eu", "us", "eu", "apac", "us", "eu"] * 3
        ids = [
            await app.producer.publish("orders", {"n": n}, attributes={"region": region})
            for n, region in enumerate(regions)
        ]
        eu = [i for i, region in zip(ids, regions, strict=True) if region == "eu"]
        await received.wait_for({"billing": len(ids), "audit": len(ids), "eu": len(eu)})
        names = {entry.name for entry in await app.queue.registry.list("consumers")}
        stats = {
            name: await app.queue.subscription_stats("orders", name)
            for name in ("billing", "audit", "eu")
        }
        own = await app.queue.topic_stats("orders")
        stored = {s.name: s.filter for s in await app.queue.list_subscriptions("orders")}
    # Each subscription got each of its messages exactly once; none read the topic's own.
    assert Counter(received.ids["billing"]) == Counter(ids)
    assert Counter(received.ids["audit"]) == Counter(ids)
    assert sorted(received.ids["eu"]) == sorted(eu)
    assert None not in received.ids
    assert {"shop.record.billing", "shop.record.audit", "shop.europe.eu"} <= names
    assert all(s.pending + s.in_flight + s.delayed == 0 for s in stats.values()), stats
    assert own.pending == 0  # a topic with subscriptions keeps no copy of its own
    assert stored == {"audit": None, "billing": None, "eu": {"region": ["eu", "uk"]}}


async def test_an_existing_subscription_is_read_as_it_is_and_a_differing_filter_refused(
    queue_config: dict[str, object],
) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("orders")
        await pq.create_subscription("orders", "eu", filter={"region": "eu"})
        producer = await pq.register_producer("shop")
        first = await producer.publish("orders", {"n": 1}, attributes={"region": "eu"})
        await producer.publish("orders", {"n": 2}, attributes={"region": "us"})
    # No filter declared: the subscription keeps its own, and what it held is read.
    app = App(queue_config, name="reader")
    received = Received()

    @app.subscriber("orders", subscription="eu")
    async def read(order: dict[str, Any], message: Message) -> None:
        await received.add(message)

    async with served(app):
        await received.wait_for({"eu": 1})
        kept = await app.queue.subscription("orders", "eu")
    assert received.ids["eu"] == [first]
    assert kept.filter == {"region": "eu"}
    # Another filter declared: the app does not start, and says why.
    other = App(queue_config, name="other")

    @other.subscriber("orders", subscription="eu", filter={"region": "us"})
    async def wrong(order: dict[str, Any]) -> None: ...

    with pytest.raises(SubscriptionConflictError, match=r"filter is .*asked"):
        await other.start()
    with pytest.raises(PawnQueueError, match="not started"):
        _ = other.queue


async def test_a_subscription_of_a_missing_topic_is_a_clear_error() -> None:
    app = App("memory://", name="lost")

    @app.subscriber("orders", subscription="billing")
    async def bill(order: dict[str, Any]) -> None: ...

    with pytest.raises(TopicNotFoundError, match="topic 'orders' does not exist"):
        await app.start()


async def test_reading_a_topic_that_has_subscriptions_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("memory://", name="mixed", create_topics=True)

    @app.subscriber("orders", subscription="billing")
    async def bill(order: dict[str, Any]) -> None: ...

    @app.subscriber("orders")
    async def direct(order: dict[str, Any]) -> None: ...

    with caplog.at_level(logging.WARNING, logger="pawn_queue"):
        await app.start()
        await app.stop()
    [warning] = [r for r in caplog.records if "has subscriptions" in r.getMessage()]
    assert "subscription" in warning.getMessage() and "direct" in warning.getMessage()
    assert "billing" in warning.getMessage()


def test_subscription_declaration_errors_are_clear() -> None:
    app = App("memory://")
    with pytest.raises(ArgumentError, match="give subscription= too"):
        app.subscriber("orders", filter={"region": "eu"})
    with pytest.raises(PawnQueueError, match="subscription name"):
        app.subscriber("orders", subscription="bad/name")
    with pytest.raises(ArgumentError, match=r"filter\['region'\]"):
        app.subscriber("orders", subscription="eu", filter={"region": 5})

    @app.subscriber("orders", subscription="eu", filter={"region": ["eu", "uk"]})
    def first(order: Any) -> None: ...

    # The same filter written another way is the same filter.
    same = {"region": ["uk", "eu", "eu"]}
    app.subscriber("orders", subscription="eu", filter=same, name="same")(first)
    with pytest.raises(ArgumentError, match="a subscription has one filter"):
        app.subscriber("orders", subscription="eu", filter={"region": "us"}, name="other")
    # A subscriber without a filter reads whatever the subscription has.
    app.subscriber("orders", subscription="eu", name="any")(first)


def test_linger_declaration_errors_are_clear() -> None:
    app = App("memory://")
    with pytest.raises(ArgumentError, match="give subscription= too"):
        app.subscriber("orders", linger_seconds=0.1)
    for bad in (-0.1, 1.5, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ArgumentError, match="linger_seconds"):
            app.subscriber("orders", subscription="eu", linger_seconds=bad)  # type: ignore[arg-type]

    @app.subscriber("orders", subscription="eu", linger_seconds=0.1)
    def first(order: Any) -> None: ...

    app.subscriber("orders", subscription="eu", linger_seconds=0.1, name="same")(first)
    with pytest.raises(ArgumentError, match="a subscription has one linger_seconds"):
        app.subscriber("orders", subscription="eu", linger_seconds=0.2, name="other")
    app.subscriber("orders", subscription="eu", name="any")(first)  # reads what it has


async def test_a_declared_linger_is_given_to_a_new_subscription_and_checked_on_an_old_one(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path / 'queue'}"
    app = App(url, name="sparse", create_topics=True)

    @app.subscriber("orders", subscription="eu", filter={"region": "eu"}, linger_seconds=0.25)
    async def eu(order: dict[str, Any]) -> None: ...

    @app.subscriber("orders", subscription="all", linger_seconds=0.5)
    async def every(order: dict[str, Any]) -> None: ...

    await app.start()
    try:
        made = {s.name: s for s in await app.queue.list_subscriptions("orders")}
    finally:
        await app.stop()
    assert made["eu"].linger_seconds == 0.25 and made["eu"].filter == {"region": "eu"}
    assert made["all"].linger_seconds == 0.5
    # Another app on the same queue declaring another linger does not start, filter or not.
    cases: list[dict[str, Any]] = [{"filter": {"region": "eu"}}, {}]
    for declared in cases:
        other = App(url, name="other")

        @other.subscriber("orders", subscription="eu", linger_seconds=0.1, **declared)
        async def wrong(order: dict[str, Any]) -> None: ...

        with pytest.raises(SubscriptionConflictError, match=r"linger_seconds is 0\.25"):
            await other.start()
    # Declaring the same one, or none, it does.
    same = App(url, name="same")

    @same.subscriber("orders", subscription="eu", linger_seconds=0.25)
    async def right(order: dict[str, Any]) -> None: ...

    await same.start()
    await same.stop()


async def test_the_testing_client_drives_subscription_subscribers() -> None:
    app = App("memory://", name="tested")
    billed: list[int] = []

    @app.subscriber("orders", subscription="billing")
    async def bill(order: dict[str, int]) -> None:
        billed.append(order["n"])

    @app.subscriber("orders", subscription="audit", retry=None)
    async def audit(order: dict[str, int]) -> None:
        if order["n"] == 2:
            raise RuntimeError("cannot audit order 2")

    async with TestClient(app) as client:
        for n in range(3):
            await client.publish("orders", {"n": n})
        await client.drain()
        [letter] = await client.dead_letters("orders", subscription="audit")
        assert await client.dead_letters("orders", subscription="billing") == []
        assert await client.dead_letters("orders") == []
    assert sorted(billed) == [0, 1, 2]
    assert (letter.payload, letter.subscription, letter.reason) == (
        {"n": 2},
        "audit",
        "handler_error",
    )


async def test_the_testing_client_says_which_subscription_is_not_drained() -> None:
    app = App("memory://", name="stuck")

    @app.subscriber("orders", subscription="billing", retry=None)
    async def bill(order: Any) -> None:
        await asyncio.Event().wait()

    async with TestClient(app) as client:
        await client.publish("orders", {})
        with pytest.raises(TimeoutError) as caught:
            await client.drain(timeout=0.5)
    assert str(caught.value) == (
        "drain: not done after 0.5 s "
        "(orders (subscription billing): 0 pending, 1 in flight, 0 delayed)"
    )
