"""Failed settlements, stopping a listener, and the two kinds of handlers, on every store."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any

import pytest

from pawn_queue import LeaseLostError, Message, PawnQueue
from pawn_queue.config import load_config
from pawn_queue.exceptions import StoreUnavailable
from pawn_queue.store import open_store
from pawn_queue.sync import Message as BlockingMessage
from pawn_queue.sync import PawnQueue as SyncPawnQueue
from tests.helpers.faults import FaultyStore
from tests.helpers.storage import dead_letter_ids, message_keys
from tests.helpers.support import poll_count

LONG_LEASE = {"visibility_timeout_seconds": 30.0, "lease_refresh_interval_seconds": 0.2}


def store_failing(config: Any, operation: str, marker: str) -> FaultyStore:
    """The configured store, with every ``operation`` on a key containing ``marker`` failing."""

    async def fail(op: str, key: str) -> None:
        if op == operation and marker in key:
            raise StoreUnavailable(f"injected: {op} {key}")

    return FaultyStore(open_store(config), hooks=[fail])


@pytest.mark.parametrize(
    ("operation", "marker", "settle"),
    [
        ("put", "/dead-letter/", "nack"),
        ("delete", "/messages/", "ack"),
    ],
)
async def test_a_failed_settlement_lets_the_message_come_back(
    queue_config: dict[str, Any], operation: str, marker: str, settle: str
) -> None:
    """After a failed ack or nack the consumer keeps running but no longer refreshes that
    lease: another consumer gets the message after the visibility timeout, not never."""
    config = load_config(queue_config)
    async with (
        PawnQueue(config, store=store_failing(config, operation, marker)) as failing_side,
        PawnQueue(config) as other_side,
    ):
        await other_side.create_topic("t", claims="message")
        producer = await other_side.register_producer("p")
        first = await producer.publish("t", {"n": 1})
        kept = await producer.publish("t", {"n": 2})
        stuck = await failing_side.register_consumer("stuck", ["t"])
        messages = {m.id: m for m in await stuck.poll()}
        assert set(messages) == {first, kept}
        with pytest.raises(StoreUnavailable):
            await getattr(messages[first], settle)()
        assert not messages[first].settled
        # The consumer goes on refreshing what it still holds...
        rescuer = await other_side.register_consumer("rescuer", ["t"])
        [again] = await rescuer.poll(wait=15)
        # ...but not the message it could not settle: it comes back, counted once more.
        assert again.id == first and again.receive_count == 2
        await again.ack()
        assert messages[kept].lease_held and await rescuer.poll() == []


async def test_listen_lets_a_message_come_back_when_its_dead_letter_write_fails(
    queue_config: dict[str, Any],
) -> None:
    config = load_config(queue_config)
    async with (
        PawnQueue(config, store=store_failing(config, "put", "/dead-letter/")) as failing_side,
        PawnQueue(config) as other_side,
    ):
        await other_side.create_topic("t")
        mid = await (await other_side.register_producer("p")).publish("t", "poison")
        tried = asyncio.Event()

        async def handler(message: Message) -> None:
            tried.set()
            raise RuntimeError("cannot handle")

        listening = await failing_side.register_consumer("stuck", ["t"])
        task = asyncio.create_task(listening.listen(handler))
        try:
            await asyncio.wait_for(tried.wait(), 10)
            # Stopped, or it would compete for the message once its lease expired (a failed
            # settle lets the message come back to its own process too).
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            rescuer = await other_side.register_consumer("rescuer", ["t"])
            [again] = await rescuer.poll(wait=15)
            assert again.id == mid
            await again.ack()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_stopping_lets_running_handlers_finish_and_releases_the_rest_uncounted(
    queue_config: dict[str, Any],
) -> None:
    """Cancel while two handlers run: the one that finishes within the grace period acks
    (no LeaseLostError); the one that does not is released at once, its receive count
    unchanged, so another consumer gets it long before the 30 s visibility timeout."""
    queue_config["polling"].update(LONG_LEASE)
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        quick = await producer.publish("t", "quick")
        slow = await producer.publish("t", "slow")
        # The slow one was received once before: a stop must not count a second receive.
        consumer = await pq.register_consumer("c", ["t"])
        [first, second] = await poll_count(consumer, 2)
        assert second.id == slow
        await second.nack(requeue=True)
        await first.nack(requeue=True)
        started = {quick: asyncio.Event(), slow: asyncio.Event()}
        finish_quick = asyncio.Event()
        outcomes: dict[str, object] = {}

        async def handler(message: Message) -> None:
            started[message.id].set()
            if message.id == quick:
                await finish_quick.wait()
                try:
                    await message.ack()
                    outcomes[quick] = "acked"
                except LeaseLostError as exc:
                    outcomes[quick] = exc
            else:
                try:
                    await asyncio.Event().wait()  # never finishes by itself
                except asyncio.CancelledError:
                    outcomes[slow] = "cancelled"
                    raise

        task = asyncio.create_task(consumer.listen(handler, grace=2.0))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), 10)
        task.cancel()
        await asyncio.sleep(0)  # the stop has begun: the quick handler finishes in the grace
        finish_quick.set()
        await asyncio.gather(task, return_exceptions=True)
        assert outcomes == {quick: "acked", slow: "cancelled"}
        other = await pq.register_consumer("other", ["t"])
        [again] = await other.poll(wait=10)
        assert again.id == slow and again.receive_count == 2  # 2 before the stop, 2 after
        await again.ack()
        assert await other.poll() == []


async def test_a_plain_function_handler_runs_in_a_thread_and_settles_from_there(
    pq: PawnQueue,
) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    ids = {await producer.publish("t", n) for n in range(3)}
    consumer = await pq.register_consumer("c", ["t"])
    loop_thread = threading.current_thread()
    seen: dict[str, threading.Thread] = {}
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def handler(message: BlockingMessage) -> None:
        seen[message.id] = threading.current_thread()
        message.ack()  # blocks this worker thread until the loop has acked
        if len(seen) == len(ids):
            loop.call_soon_threadsafe(done.set)

    task = asyncio.create_task(consumer.listen(handler))
    try:
        await asyncio.wait_for(done.wait(), 15)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert set(seen) == ids and loop_thread not in seen.values()
    assert await message_keys(pq.store, "t") == []
    assert await dead_letter_ids(pq.store, "t") == []


def test_a_coroutine_handler_runs_on_the_loop_of_the_blocking_api(
    queue_config: dict[str, Any],
) -> None:
    with SyncPawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        mid = pq.register_producer("p").publish("t", "x")
        consumer = pq.register_consumer("c", ["t"])
        stop = threading.Event()
        acked: list[str] = []

        async def handler(message: Message) -> None:
            await message.ack()
            acked.append(message.id)
            stop.set()

        consumer.listen(handler, stop=stop)
        assert acked == [mid]
        assert pq.register_consumer("other", ["t"]).poll() == []
        assert pq.dead_letters("t") == []


@pytest.mark.parametrize("batch", [None, 3])
def test_a_blocking_handler_that_sets_stop_gets_its_grace(batch: int | None) -> None:
    """A handler that sets its listener's ``stop``: the thread waiting on ``stop`` and the
    handler's own thread both ask the listener to stop. That is one stop: asked twice, the
    second cut the grace short, and what the handler's return would settle (a batch's acks,
    a raising handler's dead letter) was released instead, about 1 run in 40. Returning only
    once the listener is stopping makes that race certain here."""
    with SyncPawnQueue.from_url("memory://") as pq:
        pq.create_topic("t")
        mid = pq.register_producer("p").publish("t", "x")
        consumer = pq.register_consumer("c", ["t"])
        stop = threading.Event()

        def stopping() -> bool:  # the listener took the first ask to stop
            return bool(consumer._inner._stopping)

        def handler(_: Any) -> None:
            stop.set()
            deadline = time.monotonic() + 30
            while not stopping() and time.monotonic() < deadline:
                time.sleep(0.01)
            if batch is None:
                raise RuntimeError("dead-lettered, not released")

        consumer.listen(handler, stop=stop, batch=batch)
        assert stopping() is False  # the listener is over
        assert consumer.poll() == []
        expected = [mid] if batch is None else []
        assert [d.id for d in pq.dead_letters("t")] == expected


_LISTENER = """
import json, sys, threading, time
from pawn_queue.sync import PawnQueue

config = json.loads(sys.argv[1])
lock = threading.Lock()

def say(event):
    with lock:  # handlers run in several threads: one whole line each
        sys.stdout.write(json.dumps(event) + "\\n")
        sys.stdout.flush()

with PawnQueue.from_config(config) as pq:
    consumer = pq.register_consumer("worker", ["t"])

    def handler(message):
        say({"started": message.payload})
        if message.payload == "quick":
            time.sleep(1.0)  # SIGTERM arrives meanwhile; the grace lets it finish
            message.ack()
            say({"acked": message.payload})
        else:
            time.sleep(900)  # stuck: released after the grace, and the process exits anyway

    consumer.listen(handler, grace=2.0)
"""


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_sigterm_stops_a_blocking_listener_gracefully(queue_config: dict[str, Any]) -> None:
    """As users run it: a worker process, SIGTERM while two handlers run. The finished one is
    acked exactly once, the stuck one released once the grace is over (receive count
    unchanged), and the process exits 143 then, not when the stuck handler returns."""
    queue_config["polling"].update(LONG_LEASE)
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        await producer.publish("t", "quick")
        slow = await producer.publish("t", "slow")
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _LISTENER,
            json.dumps(queue_config),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert worker.stdout is not None
            started = set()
            while len(started) < 2:
                line = await asyncio.wait_for(worker.stdout.readline(), 30)
                started.add(json.loads(line)["started"])
            worker.send_signal(signal.SIGTERM)
            rest, _ = await asyncio.wait_for(worker.communicate(), 30)
        finally:
            if worker.returncode is None:  # the test failed first: never leave it running
                worker.kill()
                await worker.wait()
        events = [json.loads(line) for line in rest.decode().splitlines()]
        assert {"acked": "quick"} in events
        assert worker.returncode == 128 + signal.SIGTERM
        other = await pq.register_consumer("other", ["t"])
        [again] = await other.poll(wait=10)
        assert again.id == slow and again.receive_count == 1
        await again.ack()
        assert await other.poll() == []
        assert await message_keys(pq.store, "t") == []
