"""Observers (pawn_queue.observe): the hooks the core calls, on every store."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pawn_queue import LeaseLostError, Message, PawnQueue, Retry
from pawn_queue.config import load_config
from pawn_queue.observe import Observer, Observers, Outcome, Publication
from pawn_queue.sync import PawnQueue as SyncPawnQueue


class Recorder(Observer):
    """Records every hook call as a tuple."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.settlement = asyncio.Event()  # set at each settlement

    def before_publish(self, publication: Publication) -> None:
        self.calls.append(("before_publish", publication.topic, publication.count))
        publication.attributes["seen-by"] = "recorder"

    def published(self, publication: Publication) -> None:
        self.calls.append(("published", publication.topic, tuple(publication.message_ids)))

    def publish_failed(self, publication: Publication, error: BaseException) -> None:
        self.calls.append(("publish_failed", publication.topic, type(error).__name__))

    def delivered(self, message: Message) -> None:
        self.calls.append(("delivered", message.id))

    def handler_started(self, message: Message) -> None:
        self.calls.append(("handler_started", message.id))

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        assert seconds >= 0
        self.calls.append(("handler_finished", message.id, repr(error) if error else None))

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.calls.append(("settled", message.id, outcome, reason))
        self.settlement.set()

    def lease_lost(self, message: Message) -> None:
        self.calls.append(("lease_lost", message.id))

    def named(self, hook: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == hook]


class Broken(Observer):
    """Raises in every hook."""

    def _fail(self, *args: object) -> None:
        raise RuntimeError("observer bug")

    before_publish = published = publish_failed = _fail
    delivered = handler_started = handler_finished = settled = lease_lost = _fail


async def test_publish_poll_and_settle_are_observed(queue_config: dict[str, Any]) -> None:
    recorder = Recorder()
    async with PawnQueue(load_config(queue_config), observers=[recorder]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        plain = await producer.publish("t", 1, attributes={"k": "v"})
        grouped = await producer.publish("t", 2, group="g")
        dedup = await producer.publish("t", 3, dedup_id="d")
        assert await producer.publish("t", 3, dedup_id="d") == dedup  # a repeat: same id
        batch = await producer.publish_batch("t", [4, 5])
        delayed = await producer.publish("t", 6, delay=3600)
        assert recorder.named("published") == [
            ("published", "t", (plain,)),
            ("published", "t", (grouped,)),
            ("published", "t", (dedup,)),
            ("published", "t", (dedup,)),
            ("published", "t", tuple(batch)),
            ("published", "t", (delayed,)),
        ]
        assert [c[2] for c in recorder.named("before_publish")] == [1, 1, 1, 1, 2, 1]
        with pytest.raises(Exception, match=r"not JSON serializable|cannot be encoded"):
            await producer.publish("t", object())
        assert recorder.named("publish_failed") == [("publish_failed", "t", "PayloadError")]

        consumer = await pq.register_consumer("c", topics=["t"])
        messages = {m.id: m for m in await consumer.poll(wait=5)}
        assert set(messages) == {plain, grouped, dedup, *batch}
        assert {c[1] for c in recorder.named("delivered")} == set(messages)
        assert messages[plain].attributes == {"k": "v", "seen-by": "recorder"}
        await messages[plain].ack()
        await messages[grouped].nack(requeue=True)
        await messages[dedup].nack()
        await messages[batch[0]].dead_letter("mine", "why")
        await messages[plain].ack()  # settled already: not observed again
        assert recorder.named("settled") == [
            ("settled", plain, "ack", None),
            ("settled", grouped, "nack_requeue", None),
            ("settled", dedup, "dead_letter", "nack"),
            ("settled", batch[0], "dead_letter", "mine"),
        ]


async def test_listen_observes_handlers_and_their_settlement(queue_config: dict[str, Any]) -> None:
    recorder = Recorder()
    async with PawnQueue(load_config(queue_config), observers=[recorder]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        ok = await producer.publish("t", "ok")
        bad = await producer.publish("t", "bad")
        consumer = await pq.register_consumer("c", topics=["t"])
        done: list[str] = []
        both = asyncio.Event()

        async def handler(message: Message) -> None:
            done.append(message.id)
            if len(done) == 2:
                both.set()
            if message.payload == "bad":
                raise ValueError("boom")
            await message.ack()

        task = asyncio.create_task(consumer.listen(handler, retry=Retry(max_receives=1)))
        await asyncio.wait_for(both.wait(), 10)
        async with asyncio.timeout(10):
            while len(recorder.named("settled")) < 2:
                recorder.settlement.clear()
                await recorder.settlement.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def hooks(message_id: str) -> list[str]:
        return [c[0] for c in recorder.calls if len(c) > 1 and c[1] == message_id]

    # The handler acks ok itself; bad is dead-lettered once its handler raised.
    assert hooks(ok) == ["delivered", "handler_started", "settled", "handler_finished"]
    assert hooks(bad) == ["delivered", "handler_started", "handler_finished", "settled"]
    assert ("handler_finished", ok, None) in recorder.calls
    assert ("handler_finished", bad, "ValueError('boom')") in recorder.calls
    assert ("settled", bad, "dead_letter", "handler_error") in recorder.calls


async def test_a_failing_observer_breaks_nothing(
    queue_config: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    async with PawnQueue(load_config(queue_config), observers=[Broken(), recorder]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        with caplog.at_level(logging.ERROR, logger="pawn_queue.observe"):
            message_id = await producer.publish("t", 1, attributes={"k": "v"})
            consumer = await pq.register_consumer("c", topics=["t"])
            [message] = await consumer.poll(wait=5)
            await message.ack()
        assert message.id == message_id and message.settled
        assert await consumer.poll() == []
    # The observers after the broken one still ran.
    assert ("settled", message_id, "ack", None) in recorder.calls
    assert "observer bug" in caplog.text and "before_publish" in caplog.text


async def test_attributes_a_broken_observer_left_are_dropped() -> None:
    class Bad(Observer):
        def before_publish(self, publication: Publication) -> None:
            publication.attributes["n"] = 1  # type: ignore[assignment]

    observers = Observers([Bad()])
    publication = Publication("t", {"k": "v"}, 1)
    observers.before_publish(publication)
    assert publication.attributes == {"k": "v"}


async def test_without_observers_nothing_is_added(queue_config: dict[str, Any]) -> None:
    async with PawnQueue(load_config(queue_config)) as pq:
        assert not pq.runtime.observers
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", 1, attributes={"k": "v"})
        consumer = await pq.register_consumer("c", topics=["t"])
        [message] = await consumer.poll(wait=5)
        assert message.attributes == {"k": "v"}
        await message.ack()


async def test_a_lost_lease_is_observed() -> None:
    config = load_config(
        {
            "backend": "memory",
            "memory": {"name": "observers-lease-lost"},
            "polling": {"visibility_timeout_seconds": 10, "lease_refresh_interval_seconds": 5},
            "concurrency": {"clock_skew_margin_seconds": 1},
        }
    )
    start = datetime.now(UTC)
    elapsed = [0.0]

    def holder_clock() -> datetime:
        return start + timedelta(seconds=elapsed[0])

    def other_clock() -> datetime:
        return start + timedelta(seconds=elapsed[0] + 12)

    recorder = Recorder()
    async with (
        PawnQueue(config, clock=holder_clock, observers=[recorder]) as holder_queue,
        PawnQueue(config, clock=other_clock) as other_queue,
    ):
        await holder_queue.create_topic("t")
        holder = await holder_queue.register_consumer("holder", topics=["t"])
        holder.held_leases.paused = True
        other = await other_queue.register_consumer("other", topics=["t"])
        await (await holder_queue.register_producer("p")).publish("t", 1)
        [held] = await holder.poll(wait=5)
        [taken] = await other.poll(wait=5)
        assert taken.id == held.id
        elapsed[0] = 9.5  # the holder's lease is about to expire: settling checks it
        with pytest.raises(LeaseLostError):
            await held.ack()
        await taken.ack()
    assert recorder.named("lease_lost") == [("lease_lost", held.id)]
    assert recorder.named("settled") == []


def test_the_blocking_queue_takes_observers() -> None:
    recorder = Recorder()
    config = load_config({"backend": "memory", "memory": {"name": "observers-sync"}})
    with SyncPawnQueue(config, observers=[recorder]) as pq:
        pq.create_topic("t")
        message_id = pq.register_producer("p").publish("t", 1)
        [message] = pq.register_consumer("c", ["t"]).poll(wait=5)
        message.ack()
    assert recorder.named("published") == [("published", "t", (message_id,))]
    assert ("settled", message_id, "ack", None) in recorder.calls


def test_the_fan_out_calls_only_the_hooks_an_observer_implements() -> None:
    """Hooks an observer keeps from the base class are skipped (they do nothing); one it
    overrides, sets on the instance, or defines without subclassing is called."""
    calls: list[str] = []

    class OnlySettled(Observer):
        def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
            calls.append(f"settled:{outcome}")

        def __getattribute__(self, name: str) -> Any:
            if name in ("delivered", "handler_started"):
                calls.append(f"looked up {name}")
            return super().__getattribute__(name)

    class DuckTyped:
        def delivered(self, message: object) -> None:
            calls.append("duck delivered")

    patched = Observer()
    patched.delivered = lambda message: calls.append("patched delivered")  # type: ignore[method-assign]
    only = OnlySettled()
    observers = Observers([only, DuckTyped(), patched])  # type: ignore[list-item]
    for _ in range(3):
        observers.delivered("m")
    observers.settled("m", "ack")
    assert calls.count("duck delivered") == calls.count("patched delivered") == 3
    assert calls.count("settled:ack") == 1
    # The base class's no-op hook was looked up once, to learn it is a no-op: not per call.
    assert calls.count("looked up delivered") == 1
    assert "looked up handler_started" not in calls
