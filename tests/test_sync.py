"""The blocking API (pawn_queue.sync) on every store: plain functions, no event loop here."""

from __future__ import annotations

import _thread
import asyncio
import signal
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from pawn_queue import (
    ArgumentError,
    PawnQueueBuilder,
    PawnQueueError,
    PayloadError,
    Retry,
    TopicNotFoundError,
)
from pawn_queue import PawnQueue as AsyncPawnQueue
from pawn_queue.store.base import Store
from pawn_queue.sync import Message, PawnQueue
from tests.helpers.storage import dead_letter_ids, lease_keys, leases_of, message_keys

T = TypeVar("T")


def in_store(config: dict[str, Any], look: Callable[[Store], Awaitable[T]]) -> T:
    """What ``look`` reads in the queue's store, with the async API on a loop of this thread."""

    async def read() -> T:
        async with await AsyncPawnQueue.from_config(config) as pq:
            return await look(pq.store)

    return asyncio.run(read())


def leftovers(config: dict[str, Any], topic: str) -> list[str]:
    """The topic's messages and leases: none once every message is settled."""

    async def look(store: Store) -> list[str]:
        return await message_keys(store, topic) + await lease_keys(store, topic)

    return in_store(config, look)


def test_publish_poll_ack_nack(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders")
        assert pq.list_topics() == ["orders"]
        assert pq.strategy in ("conditional_write", "csprng_verify")
        producer = pq.register_producer("shop")
        consumer = pq.register_consumer("billing", topics=["orders"])
        first = producer.publish("orders", {"n": 1}, attributes={"source": "web"})
        second = producer.publish("orders", {"n": 2})
        messages = consumer.poll()
        assert [m.id for m in messages] == [first, second]
        one, two = messages
        assert (one.topic, one.producer_id, one.payload) == ("orders", producer.id, {"n": 1})
        assert one.attributes == {"source": "web"} and one.created_at.endswith("+00:00")
        one.ack()
        one.ack()  # idempotent
        two.nack()
        assert one.settled and two.settled
        assert consumer.poll() == []
        assert [e.name for e in pq.registry.list("consumers")] == ["billing"]
        assert pq.register_producer("shop").id == producer.id
        batch = producer.publish_batch("orders", ({"b": i} for i in range(3)))
        got = consumer.poll(wait=5)
        assert [m.id for m in got] == batch
        for message in got:
            message.ack()
    assert leftovers(queue_config, "orders") == []
    assert in_store(queue_config, lambda store: dead_letter_ids(store, "orders")) == [second]


def test_ack_all_acks_a_poll_of_batch_members_in_one_write(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        ids = pq.register_producer("p").publish_batch("t", list(range(30)))
        consumer = pq.register_consumer("c", topics=["t"])
        messages = consumer.poll()
        consumer.ack_all(messages)
        assert all(m.settled for m in messages)
        # Durable on return: the object's lease lists the 10 as settled.
        leases = in_store(queue_config, lambda store: leases_of(store, "t"))
        assert [lease.settled for lease in leases] == [tuple(range(10))]
        with pytest.raises(ArgumentError, match="ack_all takes messages, got str"):
            consumer.ack_all(["x"])
        while len(messages) < 30:
            more = consumer.poll(wait=5)
            consumer.ack_all(more)
            messages += more
        assert sorted(m.id for m in messages) == sorted(ids)
    assert leftovers(queue_config, "t") == []


def test_requeue_delay_extend_and_retry(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        consumer = pq.register_consumer("c", ["t"])
        producer.publish("t", "later", delay=3600)
        mid = producer.publish("t", "now")
        [message] = consumer.poll()
        assert (message.id, message.receive_count) == (mid, 1)
        message.extend(10)
        message.nack(requeue=True)
        [again] = consumer.poll(wait=5)
        assert (again.id, again.receive_count, again.settled) == (mid, 2, False)
        again.ack()
        assert consumer.poll() == []  # "later" is not due

        failures: list[int] = []
        stop = threading.Event()

        def flaky(message: Message) -> None:
            if message.receive_count < 3:
                failures.append(message.receive_count)
                raise RuntimeError("try again")
            message.ack()
            stop.set()

        retried = producer.publish("t", "flaky")
        consumer.listen(flaky, stop=stop, retry=Retry(max_receives=3, base_delay=0))
        assert failures == [1, 2]
    [left] = in_store(queue_config, lambda store: message_keys(store, "t"))  # the delayed one
    assert retried not in left and mid not in left
    assert in_store(queue_config, lambda store: dead_letter_ids(store, "t")) == []


def test_poll_wait_wakes_on_publish_from_another_thread(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        consumer = pq.register_consumer("c", ["t"])
        waiting = threading.Event()

        def publish() -> None:
            waiting.wait()
            producer.publish("t", "hello")

        thread = threading.Thread(target=publish)
        thread.start()
        waiting.set()
        [message] = consumer.poll(wait=30)
        thread.join()
        assert message.payload == "hello"
        message.ack()


def test_eight_threads_share_one_queue(queue_config: dict[str, Any]) -> None:
    threads, per_thread = 8, 50
    total = threads * per_thread
    published: list[str] = []
    delivered: list[str] = []
    producer_ids: set[str] = set()
    lock = threading.Lock()
    all_acked = threading.Event()
    errors: list[BaseException] = []

    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("work")

        def worker(i: int) -> None:
            try:
                producer = pq.register_producer(f"producer-{i % 2}")
                consumer = pq.register_consumer(f"worker-{i}", ["work"])
                ids = [producer.publish("work", {"i": i, "n": n}) for n in range(per_thread)]
                with lock:
                    published.extend(ids)
                    producer_ids.add(producer.id)
                while not all_acked.is_set():
                    for message in consumer.poll(wait=0.2):
                        message.ack()
                        with lock:
                            delivered.append(message.id)
                            if len(delivered) >= total:
                                all_acked.set()
            except BaseException as exc:
                errors.append(exc)
                all_acked.set()

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        assert errors == []
        assert len(producer_ids) == 2  # one id per name, whichever thread registered first
        assert pq.register_consumer("check", ["work"]).poll() == []

    counts = Counter(delivered)
    assert len(published) == total and set(counts) == set(published)
    assert max(counts.values()) == 1
    assert leftovers(queue_config, "work") == []


def test_listen_until_stop_event(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("jobs")
        producer = pq.register_producer("p")
        consumer = pq.register_consumer("c", ["jobs"])
        # First, so its dead-lettering is over before the last ack sets the stop event.
        failing = producer.publish("jobs", {"fail": True})
        ids = [producer.publish("jobs", {"n": n}) for n in range(25)]
        handled: list[str] = []
        handler_threads: set[str] = set()
        stop = threading.Event()
        lock = threading.Lock()

        def handler(message: Message) -> None:
            with lock:
                handler_threads.add(threading.current_thread().name)
            if message.payload == {"fail": True}:
                raise ValueError("boom")  # dead-lettered, as in the async API
            message.ack()
            with lock:
                handled.append(message.id)
                if len(handled) == len(ids):
                    stop.set()

        consumer.listen(handler, stop=stop)
        assert sorted(handled) == sorted(ids)
        assert threading.current_thread().name not in handler_threads
        assert not any(name.startswith("pawn-queue-loop") for name in handler_threads)
    assert leftovers(queue_config, "jobs") == []
    assert in_store(queue_config, lambda store: dead_letter_ids(store, "jobs")) == [failing]


def test_stop_releases_unsettled_messages_at_once(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("jobs")
        mid = pq.register_producer("p").publish("jobs", "unfinished")
        consumer = pq.register_consumer("c", ["jobs"])
        stop = threading.Event()
        refused: list[PawnQueueError] = []

        def handler(message: Message) -> None:
            try:
                pq.close()  # would wait for this very handler
            except PawnQueueError as exc:
                refused.append(exc)
            stop.set()  # and return without ack or nack

        consumer.listen(handler, stop=stop)
        assert "deadlock" in str(refused[0])
        # Released, not abandoned: another consumer gets it without waiting out the lease
        # (3 s; the release may land just after listen() returned).
        [message] = pq.register_consumer("other", ["jobs"]).poll(wait=1.5)
        assert message.id == mid
        message.ack()


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a program started from a terminal (a
    pytest-xdist worker, or a run started in the background, ignores it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_ends_listen(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("jobs")
        producer = pq.register_producer("p")
        producer.publish("jobs", "first")
        consumer = pq.register_consumer("c", ["jobs"])
        acked: list[Message] = []

        def handler(message: Message) -> None:
            message.ack()
            acked.append(message)
            _thread.interrupt_main()  # Ctrl-C

        with pytest.raises(KeyboardInterrupt):
            consumer.listen(handler)
        assert [m.payload for m in acked] == ["first"]
        # The queue and the consumer still work after the interrupted listen.
        mid = producer.publish("jobs", "second")
        [message] = consumer.poll(wait=5)
        assert message.id == mid
        message.ack()
    assert leftovers(queue_config, "jobs") == []


def test_ack_from_another_thread_and_not_from_the_loop(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("t")
        pq.register_producer("p").publish_batch("t", [1, 2])
        first, second = pq.register_consumer("c", ["t"]).poll()
        acker = threading.Thread(target=first.ack)
        acker.start()
        acker.join()
        assert first.settled

        async def ack_on_loop() -> None:
            second.ack()  # a blocking call on the loop thread must fail, not hang

        with pytest.raises(PawnQueueError, match="deadlock"):
            pq._runner.call(ack_on_loop())
        second.ack()
    assert leftovers(queue_config, "t") == []


def test_errors_keep_their_types(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("known")
        producer = pq.register_producer("p")
        with pytest.raises(TopicNotFoundError):
            producer.publish("missing", {"a": 1})
        with pytest.raises(TopicNotFoundError):
            pq.register_consumer("c", ["missing"])
        with pytest.raises(PayloadError):
            producer.publish("known", {"nan": float("nan")})
        with pytest.raises(PayloadError):
            producer.publish_batch("known", [1, object()])
        with pytest.raises(PawnQueueError, match="non-empty list"):
            pq.register_consumer("c", [])
    assert in_store(queue_config, lambda store: message_keys(store, "known")) == []


def test_not_set_up_and_use_after_close(queue_config: dict[str, Any]) -> None:
    pq = PawnQueue.from_config(queue_config)
    with pytest.raises(PawnQueueError, match="not set up"):
        pq.list_topics()
    pq.setup()
    pq.setup()  # idempotent
    pq.create_topic("t")
    producer = pq.register_producer("p")
    consumer = pq.register_consumer("c", ["t"])
    producer.publish("t", 1)
    [message] = consumer.poll()
    loop_thread = pq._runner._thread
    assert loop_thread is not None and loop_thread.is_alive()
    pq.close()
    assert not loop_thread.is_alive()
    pq.teardown()  # idempotent
    for use in (
        pq.list_topics,
        lambda: pq.create_topic("u"),
        lambda: pq.register_producer("q"),
        lambda: pq.registry,
        lambda: producer.publish("t", 2),
        consumer.poll,
        message.ack,
        pq.setup,
    ):
        with pytest.raises(PawnQueueError, match="closed"):
            use()
    with pytest.raises(PawnQueueError, match="closed"), pq:
        pass
    # The close released the lease: the message is there for the next consumer at once.
    with PawnQueue.from_config(queue_config) as again:
        [redelivered] = again.register_consumer("c2", ["t"]).poll()
        assert redelivered.id == message.id
        redelivered.ack()


def test_close_ends_a_listener_in_another_thread(queue_config: dict[str, Any]) -> None:
    pq = PawnQueue.from_config(queue_config)
    pq.setup()
    pq.create_topic("t")
    consumer = pq.register_consumer("c", ["t"])
    pq.register_producer("p").publish("t", "x")
    handled = threading.Event()
    outcome: list[BaseException] = []

    def listen() -> None:
        try:
            consumer.listen(lambda message: handled.set())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=listen)
    thread.start()
    handled.wait()
    pq.close()
    thread.join()
    [error] = outcome
    assert isinstance(error, PawnQueueError) and "closed" in str(error)


def test_from_url_and_builder() -> None:
    with PawnQueue.from_url("memory://") as pq:
        pq.create_topic("t")
        assert pq.list_topics() == ["t"]
        pq.delete_topic("t")
        assert pq.list_topics() == []
    with PawnQueue(PawnQueueBuilder().memory().build_config()) as pq:
        assert pq.list_topics() == []


def test_sync_features_forward_to_the_async_core(queue_config: dict[str, Any]) -> None:
    with PawnQueue.from_config(queue_config) as pq:
        pq.create_topic("f", max_receive_count=3, retention_action="dead_letter")
        producer = pq.register_producer("p")
        first = producer.publish("f", {"n": 1}, dedup_id="d1", group="g")
        assert producer.publish("f", {"n": 1}, dedup_id="d1", group="g") == first
        consumer = pq.register_consumer("c", topics=["f"])
        [message] = consumer.poll()
        assert message.group == "g"
        message.nack()
        assert pq.topic_stats("f").dead_letter == 1
        assert [d.id for d in pq.dead_letters("f")] == [first]
        assert pq.redrive("f") == 1
        [again] = consumer.poll()
        again.nack()
        assert pq.purge_dead_letters("f") == 1
