"""App and subscribers, in one process, on every store: typed payloads, results, retries,
concurrency, hooks, and the testing helper (``pawn_queue.testing``)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic wants it on Python < 3.12

from pawn_queue import App, ArgumentError, Message, PawnQueueError, Retry
from pawn_queue.observe import Observer, Outcome
from pawn_queue.testing import TestClient

ROOT = Path(__file__).resolve().parent.parent


class Settlements(Observer):
    """Every settlement, in order, and a way to wait for the n-th."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Outcome, str | None, int]] = []
        self.changed = asyncio.Condition()
        self._loop = asyncio.get_running_loop()

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.seen.append((message.id, outcome, reason, message.receive_count))
        self._loop.create_task(self._notify())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(20), self.changed:
            await self.changed.wait_for(lambda: len(self.seen) >= count)


@asynccontextmanager
async def served(app: App) -> AsyncIterator[Settlements]:
    """The app started and consuming; stopped at the end."""
    settlements = Settlements()
    app.add_observer(settlements)
    app.create_topics = True
    await app.start()
    serving = asyncio.create_task(app.serve())
    try:
        yield settlements
    finally:
        app.stop_consuming()
        await serving
        await app.stop()


class OrderModel(BaseModel):
    order_id: int
    quantity: int = Field(gt=0)


@dataclasses.dataclass
class OrderData:
    order_id: int
    quantity: int


class OrderDict(TypedDict):
    order_id: int
    quantity: int


def as_dict(order: Any) -> dict[str, Any]:
    if isinstance(order, BaseModel):
        return order.model_dump()
    return dataclasses.asdict(order) if dataclasses.is_dataclass(order) else dict(order)


@pytest.mark.parametrize("kind", [OrderModel, OrderData, OrderDict], ids=lambda k: k.__name__)
@pytest.mark.parametrize("run_as", ["async", "sync"])
async def test_typed_payloads_are_validated_and_invalid_ones_dead_lettered_once(
    queue_config: dict[str, object], kind: type, run_as: str
) -> None:
    app = App(queue_config, name="typed")
    received: list[tuple[Any, str]] = []

    if run_as == "async":

        async def handle(order: Any) -> None:
            received.append((order, "loop"))

    else:

        def handle(order: Any) -> None:
            received.append((order, "thread"))

    # Annotations are strings here (PEP 563): a local class is given as the class itself.
    handle.__annotations__ = {"order": kind, "return": None}
    app.subscriber("orders", retry=Retry(base_delay=0))(handle)
    async with served(app) as settlements:
        good = await app.producer.publish("orders", {"order_id": 1, "quantity": 2})
        bad = await app.producer.publish("orders", {"order_id": "one"})
        await settlements.wait_for(2)
        [letter] = await app.queue.dead_letters("orders")
    assert {(s[0], s[1]) for s in settlements.seen} == {(good, "ack"), (bad, "dead_letter")}
    [(order, where)] = received
    assert isinstance(order, dict if kind is OrderDict else kind)
    assert as_dict(order) == {"order_id": 1, "quantity": 2}
    assert where == ("loop" if run_as == "async" else "thread")
    assert (letter.id, letter.reason, letter.receive_count) == (bad, "invalid_payload", 1)
    assert "order_id" in (letter.error or "") and "quantity" in (letter.error or "")


async def test_a_result_is_published_before_the_message_is_acked(
    queue_config: dict[str, object],
) -> None:
    app = App(queue_config, name="chain")

    @app.subscriber("orders", publish_to="shipments")
    async def ship(order: OrderModel, message: Message) -> OrderModel | None:
        assert not message.settled
        return None if order.order_id == 2 else OrderModel(order_id=order.order_id, quantity=9)

    async with served(app) as settlements:
        for order_id in (1, 2):
            await app.producer.publish("orders", {"order_id": order_id, "quantity": 1})
        await settlements.wait_for(2)
        shipped = [m.payload for m in await app.queue.peek("shipments")]
    assert shipped == [{"order_id": 1, "quantity": 9}]  # None publishes nothing
    assert [s[1] for s in settlements.seen] == ["ack", "ack"]


class Transient(Exception):
    pass


async def test_retry_on_requeues_only_the_given_errors(queue_config: dict[str, object]) -> None:
    app = App(queue_config, name="retrying")
    calls: dict[str, list[int]] = {}

    @app.subscriber("jobs", retry=Retry(max_receives=5, base_delay=0, retry_on=(Transient,)))
    async def work(job: dict[str, str], message: Message) -> None:
        calls.setdefault(job["kind"], []).append(message.receive_count)
        if job["kind"] == "transient" and message.receive_count < 3:
            raise Transient("try again")
        if job["kind"] == "broken":
            raise KeyError("never works")

    async with served(app) as settlements:
        transient = await app.producer.publish("jobs", {"kind": "transient"})
        broken = await app.producer.publish("jobs", {"kind": "broken"})
        await settlements.wait_for(4)  # 2 requeues, 1 ack, 1 dead letter
        [letter] = await app.queue.dead_letters("jobs")
    assert calls == {"transient": [1, 2, 3], "broken": [1]}
    outcomes = [(s[0], s[1]) for s in settlements.seen]
    assert outcomes.count((transient, "nack_requeue")) == 2
    assert (transient, "ack") in outcomes and (broken, "dead_letter") in outcomes
    assert (letter.id, letter.reason, letter.receive_count) == (broken, "handler_error", 1)
    assert "KeyError" in (letter.error or "")


async def test_the_topics_receive_limit_ends_retries_with_the_handlers_error(
    queue_config: dict[str, object],
) -> None:
    app = App(queue_config, name="limited")
    counts: list[int] = []

    @app.subscriber("jobs", retry=Retry(max_receives=10, base_delay=0))
    async def work(job: Any, message: Message) -> None:
        counts.append(message.receive_count)
        raise Transient("always")

    async with served(app) as settlements:
        await app.queue.update_topic("jobs", max_receive_count=2)
        await app.producer.publish("jobs", {})
        await settlements.wait_for(2)
        [letter] = await app.queue.dead_letters("jobs")
    assert counts == [1, 2]
    assert [s[1] for s in settlements.seen] == ["nack_requeue", "dead_letter"]
    assert (letter.reason, letter.receive_count) == ("handler_error", 2)


async def test_concurrency_bounds_the_handlers_running_at_once(
    queue_config: dict[str, object],
) -> None:
    app = App(queue_config, name="bounded")
    running, most, started = 0, 0, asyncio.Event()
    gate = asyncio.Event()

    @app.subscriber("jobs", concurrency=2)
    async def work(job: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running >= 2:
            started.set()
        await gate.wait()
        running -= 1

    async with served(app) as settlements:
        for n in range(6):
            await app.producer.publish("jobs", {"n": n})
        async with asyncio.timeout(20):
            await started.wait()
        gate.set()
        await settlements.wait_for(6)
    assert most == 2
    assert [s[1] for s in settlements.seen] == ["ack"] * 6


async def test_hooks_run_around_consuming(queue_config: dict[str, object]) -> None:
    app = App(queue_config, name="hooked")
    events: list[str] = []

    @app.on_startup
    async def opened() -> None:
        events.append("startup")
        await app.producer.publish("jobs", {"from": "startup"})

    @app.on_shutdown
    def closed() -> None:
        events.append("shutdown")

    @app.subscriber("jobs")
    async def work(job: dict[str, str]) -> None:
        events.append(job["from"])

    async with served(app) as settlements:
        await settlements.wait_for(1)
        assert events == ["startup", "startup"]
    assert events == ["startup", "startup", "shutdown"]
    with pytest.raises(PawnQueueError, match="not started"):
        _ = app.producer


def test_declaration_errors_are_clear() -> None:
    app = App("memory://")
    with pytest.raises(ArgumentError, match="would get nothing"):

        @app.subscriber("t")
        def two_payloads(a: int, b: int) -> None: ...

    @app.subscriber("t")
    def once(payload: Any) -> None: ...

    with pytest.raises(ArgumentError, match="already has a subscriber 'once'"):
        app.subscriber("t")(once)
    with pytest.raises(ArgumentError, match="concurrency"):
        app.subscriber("t", concurrency=0)
    with pytest.raises(PawnQueueError, match="topic name"):
        app.subscriber("bad/name")
    with pytest.raises(ArgumentError, match="retry_on"):
        Retry(retry_on=(ValueError, "x"))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="jitter"):
        Retry(jitter=2)


async def test_a_callable_object_is_a_handler_too() -> None:
    app = App("memory://", name="objects")
    seen: list[OrderModel] = []

    class Handler:
        async def __call__(self, order: OrderModel, message: Message) -> None:
            seen.append(order)

    app.subscriber("orders", name="objects")(Handler())
    async with TestClient(app) as client:
        await client.publish("orders", {"order_id": 3, "quantity": 1})
        await client.drain()
    assert seen == [OrderModel(order_id=3, quantity=1)]


def test_retry_delays_grow_with_jitter_below_the_cap() -> None:
    retry = Retry(base_delay=1, factor=2, max_delay=5, jitter=0.5)
    for receive_count, full in ((1, 1), (2, 2), (3, 4), (4, 5), (9, 5)):
        delays = [retry.delay(receive_count) for _ in range(200)]
        assert all(full * 0.5 <= d <= full for d in delays)
        assert len(set(delays)) > 1
    assert Retry(base_delay=1, max_delay=5).delay(3) == 4  # no jitter: exact
    assert Retry(max_receives=None).retries(ValueError(), 100, None)
    assert not Retry(max_receives=None).retries(ValueError(), 3, 3)
    assert not Retry(retry_on=(KeyError,)).retries(ValueError(), 1, None)


def _example_app() -> App:
    spec = importlib.util.spec_from_file_location("service_example", ROOT / "examples/service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["service_example"] = module
    spec.loader.exec_module(module)
    app: App = module.app
    return app


async def test_the_testing_client_runs_the_example_apps_handlers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    app = _example_app()
    async with TestClient(app) as client:
        await client.publish("orders", {"order_id": 7, "sku": "pawn", "quantity": 25})
        await client.publish("orders", {"order_id": 8, "sku": "pawn", "quantity": -1})
        await client.drain()
        [letter] = await client.dead_letters("orders")
        assert await client.pending("shipments") == []  # consumed by the record handler
    assert "shipped order 7 in 3 parcel(s)" in capsys.readouterr().out
    assert (letter.payload["order_id"], letter.reason) == (8, "invalid_payload")
    assert os.listdir() == []  # the memory store, not the app's directory


async def test_the_testing_client_reports_a_handler_that_never_settles() -> None:
    app = App("memory://", name="stuck")

    @app.subscriber("jobs", retry=None)
    async def work(job: Any) -> None:
        await asyncio.Event().wait()

    async with TestClient(app) as client:
        await client.publish("jobs", {})
        with pytest.raises(TimeoutError) as caught:
            await client.drain(timeout=0.5)
        # It says what was left, not a bare TimeoutError.
        assert str(caught.value) == (
            "drain: not done after 0.5 s (jobs: 0 pending, 1 in flight, 0 delayed)"
        )


async def test_the_testing_client_runs_retries_without_their_backoff() -> None:
    """The README's retry policy (5 receives, backoff from 1 s): drain() waited for the
    backoff in real time and gave up after 10 s with a bare TimeoutError."""
    app = App("memory://", name="flaky")
    receives: list[int] = []

    @app.subscriber("jobs", retry=Retry(max_receives=5, base_delay=1))
    async def work(job: Any, message: Message) -> None:
        receives.append(message.receive_count)
        raise RuntimeError("still failing")

    async with TestClient(app) as client:
        await client.publish("jobs", {"n": 1})
        await client.drain(timeout=5)
        [letter] = await client.dead_letters("jobs")
    assert receives == [1, 2, 3, 4, 5]
    assert (letter.reason, letter.receive_count) == ("handler_error", 5)
    async with TestClient(app, retry_delays=True) as client:  # as in production
        await client.publish("jobs", {"n": 2})
        # A message of a run (a new topic's default) moves to a delayed object of its own.
        with pytest.raises(TimeoutError, match=r"jobs: 0 pending, 0 in flight, 1 delayed"):
            await client.drain(timeout=0.5)
        assert len(receives) == 6
