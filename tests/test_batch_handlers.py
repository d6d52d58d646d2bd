"""Batch handlers: ``listen(handler, batch=N)``, ``@app.subscriber(batch=N)`` and the blocking
``listen(batch=N)``: lists in, acked together on return, failures one message at a time."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from pawn_queue import (
    App,
    ArgumentError,
    BatchFailureError,
    Message,
    PawnQueue,
    PawnQueueConfig,
    Retry,
)
from pawn_queue import sync as blocking
from pawn_queue.config import load_config
from pawn_queue.observe import Observer, Outcome
from pawn_queue.store import open_store
from pawn_queue.testing import TestClient
from tests.helpers.faults import FaultyStore
from tests.helpers.support import keys_under


class Seen(Observer):
    """Every settlement and handler hook; an event per settlement count awaited."""

    def __init__(self) -> None:
        self.settled_: list[tuple[str, Outcome, str | None]] = []
        self.started: list[str] = []
        self.finished: list[tuple[str, str | None]] = []
        self._waiters: list[tuple[int, asyncio.Event]] = []

    def handler_started(self, message: Message) -> None:
        self.started.append(message.id)

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        self.finished.append((message.id, None if error is None else repr(error)))

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.settled_.append((message.id, outcome, reason))
        for count, event in self._waiters:
            if len(self.settled_) >= count:
                event.set()

    async def wait_for(self, count: int) -> None:
        event = asyncio.Event()
        self._waiters.append((count, event))
        if len(self.settled_) >= count:
            event.set()
        await asyncio.wait_for(event.wait(), 30)

    def outcomes(self) -> Counter[tuple[str, Outcome]]:
        return Counter((mid, outcome) for mid, outcome, _ in self.settled_)


async def listening(consumer: Any, handler: Any, **options: Any) -> asyncio.Task[None]:
    return asyncio.create_task(consumer.listen(handler, **options))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() or task.exception() is None


@pytest.fixture
async def observed(queue_config: dict[str, Any]) -> Any:
    seen = Seen()
    async with PawnQueue(load_config(queue_config), observers=[seen]) as pq:
        await pq.create_topic("t")
        yield pq, seen


async def test_a_batch_handler_gets_lists_and_its_messages_are_acked_when_it_returns(
    observed: tuple[PawnQueue, Seen],
) -> None:
    pq, seen = observed
    producer = await pq.register_producer("p")
    ids = await producer.publish_batch("t", [{"n": n} for n in range(25)])
    ids += [await producer.publish("t", {"n": n}) for n in range(25, 30)]
    consumer = await pq.register_consumer("c", ["t"])
    batches: list[list[str]] = []

    async def handle(messages: list[Message]) -> None:
        assert all(isinstance(m, Message) for m in messages)
        batches.append([m.id for m in messages])

    task = await listening(consumer, handle, batch=10)
    await seen.wait_for(30)
    await stop(task)
    assert all(1 <= len(b) <= 10 for b in batches)
    assert [i for b in batches for i in b] == ids  # FIFO, each once
    assert seen.outcomes() == Counter({(i, "ack"): 1 for i in ids})
    # Per member, handler hooks as in per-message listen(), with the batch's outcome.
    assert sorted(seen.started) == sorted(ids)
    assert sorted(seen.finished) == sorted((i, None) for i in ids)
    assert await keys_under(pq, "t/messages/") == []


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"])
async def test_a_failure_in_the_middle_of_a_batch_fails_that_message_alone(
    observed: tuple[PawnQueue, Seen],
) -> None:
    """The acceptance test: the message that fails is retried, then dead-lettered, as the
    Retry says; the others of its batch are acked once, in the first round."""
    pq, seen = observed
    producer = await pq.register_producer("p")
    ids = await producer.publish_batch("t", [{"n": n} for n in range(10)])
    bad = ids[4]
    consumer = await pq.register_consumer("c", ["t"])
    calls: list[tuple[list[str], list[int]]] = []

    async def handle(messages: list[Message]) -> None:
        calls.append(([m.id for m in messages], [m.receive_count for m in messages]))
        failed = {m: ValueError(f"bad {m.payload}") for m in messages if m.id == bad}
        if failed:
            raise BatchFailureError(failed)

    retry = Retry(max_receives=3, base_delay=0)
    task = await listening(consumer, handle, batch=10, retry=retry)
    await seen.wait_for(12)  # 9 acks, 2 requeues, 1 dead letter
    await stop(task)
    assert calls[0] == (ids, [1] * 10)
    assert calls[1:] == [([bad], [2]), ([bad], [3])]
    outcomes = seen.outcomes()
    assert outcomes == Counter(
        {
            **{(i, "ack"): 1 for i in ids if i != bad},
            (bad, "nack_requeue"): 2,
            (bad, "dead_letter"): 1,
        }
    )
    dead = await pq.dead_letter("t", bad)
    assert dead is not None and dead.reason == "handler_error"
    assert dead.error is not None and "bad {'n': 4}" in dead.error
    assert dead.receive_count == 3
    assert await keys_under(pq, "t/messages/") == []


async def test_a_handler_that_raises_fails_every_unsettled_message_of_its_batch(
    observed: tuple[PawnQueue, Seen],
) -> None:
    pq, seen = observed
    producer = await pq.register_producer("p")
    ids = await producer.publish_batch("t", [{"n": n} for n in range(6)])
    consumer = await pq.register_consumer("c", ["t"])
    rounds: list[list[int]] = []

    async def handle(messages: list[Message]) -> None:
        rounds.append(sorted(m.payload["n"] for m in messages))
        if messages[0].receive_count == 1:
            await messages[0].ack()  # settled before the failure: stays acked
            raise RuntimeError("the whole batch failed")

    task = await listening(consumer, handle, batch=6, retry=Retry(base_delay=0))
    await seen.wait_for(1 + 5 + 5)
    await stop(task)
    assert rounds[0] == list(range(6))
    assert sorted(n for r in rounds[1:] for n in r) == list(range(1, 6))
    outcomes = seen.outcomes()
    assert outcomes[(ids[0], "ack")] == 1
    assert all(outcomes[(i, "nack_requeue")] == 1 and outcomes[(i, "ack")] == 1 for i in ids[1:])
    # Each failed message's handler_finished carries the error; the retry's carries none.
    assert seen.finished.count((ids[3], "RuntimeError('the whole batch failed')")) == 1


async def test_without_retry_a_failed_batch_is_dead_lettered(
    observed: tuple[PawnQueue, Seen],
) -> None:
    pq, seen = observed
    ids = await (await pq.register_producer("p")).publish_batch("t", ["a", "b", "c"])
    consumer = await pq.register_consumer("c", ["t"])

    async def handle(messages: list[Message]) -> None:
        raise RuntimeError("no")

    task = await listening(consumer, handle, batch=5)
    await seen.wait_for(3)
    await stop(task)
    assert seen.outcomes() == Counter({(i, "dead_letter"): 1 for i in ids})
    assert sorted(d.id for d in await pq.dead_letters("t")) == sorted(ids)


async def test_messages_settled_by_the_handler_stay_as_it_left_them(
    observed: tuple[PawnQueue, Seen],
) -> None:
    pq, seen = observed
    ids = await (await pq.register_producer("p")).publish_batch("t", list(range(5)))
    consumer = await pq.register_consumer("c", ["t"])
    counts: list[tuple[int, int]] = []

    async def handle(messages: list[Message]) -> None:
        counts.extend((m.payload, m.receive_count) for m in messages)
        for m in messages:
            if m.payload == 1:
                await m.nack()  # dead letter
            elif m.payload == 3 and m.receive_count == 1:
                await m.nack(requeue=True)  # back at once, as its own message

    task = await listening(consumer, handle, batch=5)
    await seen.wait_for(6)
    await stop(task)
    assert sorted(counts) == [(0, 1), (1, 1), (2, 1), (3, 1), (3, 2), (4, 1)]
    assert seen.outcomes() == Counter(
        {
            (ids[0], "ack"): 1,
            (ids[1], "dead_letter"): 1,
            (ids[2], "ack"): 1,
            (ids[3], "nack_requeue"): 1,
            (ids[4], "ack"): 1,
        }
    ) + Counter({(ids[3], "ack"): 1})
    [dead] = await pq.dead_letters("t")
    assert dead.id == ids[1] and dead.reason == "nack"


async def test_an_ack_racing_the_listeners_acks_settles_each_message_once(
    observed: tuple[PawnQueue, Seen],
) -> None:
    """The handler starts acks it does not wait for: they run while the listener acks the
    batch, and each message is still acked once (one settlement at a time per message)."""
    pq, seen = observed
    ids = await (await pq.register_producer("p")).publish_batch("t", list(range(6)))
    consumer = await pq.register_consumer("c", ["t"])
    racing: list[asyncio.Task[None]] = []

    async def handle(messages: list[Message]) -> None:
        racing.extend(asyncio.create_task(m.ack()) for m in messages[::2])

    task = await listening(consumer, handle, batch=6)
    await seen.wait_for(6)
    await asyncio.gather(*racing)
    await stop(task)
    assert seen.outcomes() == Counter({(i, "ack"): 1 for i in ids})
    assert await keys_under(pq, "t/messages/") == []


async def test_a_batch_failure_naming_something_else_fails_the_whole_batch(
    observed: tuple[PawnQueue, Seen],
) -> None:
    pq, seen = observed
    ids = await (await pq.register_producer("p")).publish_batch("t", ["a", "b"])
    consumer = await pq.register_consumer("c", ["t"])

    async def handle(messages: list[Message]) -> None:
        raise BatchFailureError({7: RuntimeError("position 7 of 2")})

    task = await listening(consumer, handle, batch=2)
    await seen.wait_for(2)
    await stop(task)
    assert seen.outcomes() == Counter({(i, "dead_letter"): 1 for i in ids})


@pytest.mark.parametrize("backend", ["memory", "filesystem"])
async def test_batch_wait_collects_from_further_polls(queue_config: dict[str, Any]) -> None:
    """Two messages are claimed by a first poll; the handler is not called until three more,
    published after that claim, filled the batch of five."""
    config = load_config(queue_config)
    claimed = asyncio.Event()
    leases: list[str] = []

    async def on_put(operation: str, key: str) -> None:
        if operation == "put" and "/leases/" in key:
            leases.append(key)
            if len(leases) >= 2:
                claimed.set()

    seen = Seen()
    store = FaultyStore(open_store(config), observers=[on_put])
    async with PawnQueue(config, store=store, observers=[seen]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        first = [await producer.publish("t", n) for n in range(2)]
        consumer = await pq.register_consumer("c", ["t"])
        batches: list[list[str]] = []

        async def handle(messages: list[Message]) -> None:
            batches.append([m.id for m in messages])

        task = await listening(consumer, handle, batch=5, batch_wait=60)
        await asyncio.wait_for(claimed.wait(), 30)
        assert batches == []
        later = [await producer.publish("t", n) for n in range(2, 5)]
        await seen.wait_for(5)
        await stop(task)
        assert batches == [first + later]


async def test_batch_wait_hands_over_what_it_has_when_the_time_is_up(
    observed: tuple[PawnQueue, Seen],
) -> None:
    pq, seen = observed
    ids = await (await pq.register_producer("p")).publish_batch("t", [1, 2])
    consumer = await pq.register_consumer("c", ["t"])
    batches: list[list[str]] = []

    async def handle(messages: list[Message]) -> None:
        batches.append([m.id for m in messages])

    task = await listening(consumer, handle, batch=100, batch_wait=0.2)
    await seen.wait_for(2)
    await stop(task)
    assert batches == [ids]


async def test_concurrency_counts_batches_in_flight(observed: tuple[PawnQueue, Seen]) -> None:
    pq, seen = observed
    await (await pq.register_producer("p")).publish_batch("t", list(range(12)))
    consumer = await pq.register_consumer("c", ["t"])
    running = 0
    most = 0
    both_running = asyncio.Event()

    async def handle(messages: list[Message]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 2:
            both_running.set()
        await asyncio.wait_for(both_running.wait(), 30)
        running -= 1

    task = await listening(consumer, handle, batch=3, concurrency=2)
    await seen.wait_for(12)
    await stop(task)
    assert most == 2


@pytest.mark.parametrize("backend", ["memory", "filesystem", "s3"])
async def test_every_lease_of_a_batch_is_kept_while_its_handler_runs(
    queue_config: dict[str, Any],
) -> None:
    """A handler that outlasts the visibility timeout keeps every message of its batch
    (batch object members and single messages): a rival consumer gets none meanwhile."""
    queue_config["polling"]["visibility_timeout_seconds"] = 1.0
    queue_config["polling"]["lease_refresh_interval_seconds"] = 0.2
    seen = Seen()
    async with PawnQueue(load_config(queue_config), observers=[seen]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        ids = await producer.publish_batch("t", list(range(4)))
        ids += [await producer.publish("t", n) for n in range(4, 6)]
        consumer = await pq.register_consumer("c", ["t"])
        rival = await pq.register_consumer("rival", ["t"])
        started, release = asyncio.Event(), asyncio.Event()
        calls: list[list[str]] = []

        async def handle(messages: list[Message]) -> None:
            calls.append([m.id for m in messages])
            started.set()
            await release.wait()

        # One batch of all six, however many polls claim them (the wait ends when it is full).
        task = await listening(consumer, handle, batch=6, batch_wait=60)
        await asyncio.wait_for(started.wait(), 30)
        assert await rival.poll(wait=2.5) == []  # 2.5 visibility timeouts
        release.set()
        await seen.wait_for(6)
        await stop(task)
        assert calls == [ids]
        assert seen.outcomes() == Counter({(i, "ack"): 1 for i in ids})
        assert await rival.poll() == []


async def test_a_plain_batch_handler_runs_in_a_thread_with_blocking_messages() -> None:
    seen = Seen()
    async with PawnQueue(PawnQueueConfig.from_url("memory://"), observers=[seen]) as pq:
        await pq.create_topic("t")
        ids = await (await pq.register_producer("p")).publish_batch("t", [1, 2, 3])
        consumer = await pq.register_consumer("c", ["t"])
        threads: set[int] = set()

        def handle(messages: list[blocking.Message]) -> None:
            threads.add(threading.get_ident())
            assert [type(m) for m in messages] == [blocking.Message] * 3
            messages[1].nack()

        task = await listening(consumer, handle, batch=3)
        await seen.wait_for(3)
        await stop(task)
    assert threading.get_ident() not in threads
    assert seen.outcomes() == Counter(
        {(ids[0], "ack"): 1, (ids[1], "dead_letter"): 1, (ids[2], "ack"): 1}
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"batch": 0}, "batch must be a positive integer"),
        ({"batch": True}, "batch must be a positive integer"),
        ({"batch": 2.0}, "batch must be a positive integer"),
        ({"batch_wait": 1.0}, "batch_wait=1.0 needs batch=N"),
        ({"batch": None, "batch_wait": 0}, "needs batch=N"),
        ({"batch": 5, "batch_wait": -1}, "batch_wait"),
        ({"batch": 5, "batch_wait": math.nan}, "batch_wait"),
        ({"batch": 5, "batch_wait": math.inf}, "batch_wait"),
        ({"batch": 5, "batch_wait": True}, "batch_wait"),
        ({"batch": 5, "batch_wait": "1"}, "batch_wait"),
    ],
)
async def test_bad_batch_options_are_argument_errors(options: dict[str, Any], error: str) -> None:
    async with PawnQueue.from_url("memory://") as pq:
        await pq.create_topic("t")
        consumer = await pq.register_consumer("c", ["t"])

        async def handle(messages: list[Message]) -> None: ...

        with pytest.raises(ArgumentError, match=error):
            await consumer.listen(handle, **options)
        app = App("memory://")
        with pytest.raises(ArgumentError, match=error):
            app.subscriber("t", **options)(handle)
    with blocking.PawnQueue.from_url("memory://") as sync_pq:
        sync_pq.create_topic("t")
        sync_consumer = sync_pq.register_consumer("c", ["t"])
        with pytest.raises(ArgumentError, match=error):
            sync_consumer.listen(lambda messages: None, **options)


def test_the_blocking_facade_listens_in_batches() -> None:
    with blocking.PawnQueue.from_url("memory://") as pq:
        pq.create_topic("t")
        ids = pq.register_producer("p").publish_batch("t", list(range(7)))
        consumer = pq.register_consumer("c", ["t"])
        stop_event = threading.Event()
        got: list[list[int]] = []

        def handle(messages: list[blocking.Message]) -> None:
            got.append([m.payload for m in messages])
            if sum(len(b) for b in got) == 7:
                stop_event.set()

        consumer.listen(handle, stop=stop_event, batch=3)
        assert [n for b in got for n in b] == list(range(7))
        assert all(len(b) <= 3 for b in got)
        assert consumer.poll() == []
        assert len(ids) == 7


# -- App and TestClient ----------------------------------------------------------------------


class Order(BaseModel):
    order_id: int


def batch_app() -> tuple[App, list[list[int]]]:
    app = App(name="shop")
    calls: list[list[int]] = []

    @app.subscriber("orders", batch=10, publish_to="shipments", retry=Retry(max_receives=2))
    async def ship(orders: list[Order], messages: list[Message]) -> list[dict[str, int]]:
        assert len(orders) == len(messages)
        calls.append([o.order_id for o in orders])
        failed = {i: ValueError("order 13") for i, o in enumerate(orders) if o.order_id == 13}
        if failed:
            raise BatchFailureError(failed)
        return [{"shipped": o.order_id} for o in orders]

    @app.subscriber("audit", batch=4)
    def audit(entries: list, messages: list[blocking.Message]) -> None:  # type: ignore[type-arg]
        assert [type(m) for m in messages] == [blocking.Message] * len(entries)
        if "reject" in entries:
            messages[entries.index("reject")].nack()

    return app, calls


async def test_an_apps_batch_subscriber_validates_each_payload_and_publishes_a_list() -> None:
    app, calls = batch_app()
    async with TestClient(app) as client:
        for order in ({"order_id": 1}, {"order_id": "x"}, {"order_id": 2}, {"order_id": 3}):
            await client.publish("orders", order)
        await client.drain()
        assert sorted(s["shipped"] for s in await client.pending("shipments")) == [1, 2, 3]
        [dead] = await client.dead_letters("orders")
        assert dead.reason == "invalid_payload" and dead.payload == {"order_id": "x"}
        assert sorted(n for c in calls for n in c) == [1, 2, 3]


async def test_an_apps_batch_failure_by_position_retries_that_message_alone() -> None:
    app, calls = batch_app()
    async with TestClient(app) as client:
        await client.app.producer.publish_batch(
            "orders", [{"order_id": n} for n in (11, 12, 13, 14)]
        )
        await client.drain()
        [dead] = await client.dead_letters("orders")
        assert dead.payload == {"order_id": 13} and dead.reason == "handler_error"
        assert dead.receive_count == 2
        assert calls[0] == [11, 12, 13, 14] and calls[1:] == [[13]]
        # The batch that failed published nothing: its handler returned no result.
        assert await client.pending("shipments") == []


async def test_a_plain_batch_subscriber_runs_with_blocking_messages() -> None:
    app, _ = batch_app()
    async with TestClient(app) as client:
        await client.app.producer.publish_batch("audit", ["ok", "reject", "fine"])
        await client.drain()
        [dead] = await client.dead_letters("audit")
        assert dead.payload == "reject" and dead.reason == "nack"


def test_batch_handler_signatures_are_checked() -> None:
    app = App(name="a")

    async def single(message: Message) -> None: ...

    async def not_a_list(order: Order) -> None: ...

    with pytest.raises(ArgumentError, match=r"list\[Message\]"):
        app.subscriber("t", batch=5)(single)
    with pytest.raises(ArgumentError, match=r"annotate it list\[...\], not Order"):
        app.subscriber("t", batch=5)(not_a_list)

    async def fine(orders: list[Order], messages: list[Message]) -> None: ...

    app.subscriber("t", batch=5)(fine)
    [sub] = app.subscribers
    assert sub.binding.describe() == (
        "orders=the list of payloads, each validated as Order, messages=the list of messages"
    )
