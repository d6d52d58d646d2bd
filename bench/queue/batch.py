"""Queue benchmark case 7 (``python -m bench.queue.compare --cases batch``): ``publish_batch``
objects of 100 drained by ``listen()``, on SeaweedFS and on the memory store.

Setups: 1 and 4 consumers polling with the default settings (polls of 10), and 1 consumer
with polls of 100 (one object a poll). Every consumer is its own PawnQueue and the producer
another, all in one process and event loop; the producer publishes 4 objects at a time; each
handler acks its message, and a member's ``ack()`` returns once it is durable (its lease
write, shared with the acks of its object made meanwhile, or the object's delete). Modes:

- backlog: all objects are published first, then the consumers ``listen()``: drain msgs/s
  (first ``listen()`` to last ack) and end to end (publish + drain);
- live: the consumers ``listen()`` from the start while the objects are published: end to
  end from the first publish to the last ack.

On S3 the requests are those SeaweedFS counted for the bucket from before the first publish
to after the PawnQueues closed (publish, claims, reads, acks, lease deletes, change signals),
per message and as USD per million at AWS list prices. The memory store runs the same code
(the PawnQueues share one named store). ``cpu_us_per_msg`` is this process's CPU time (all
its threads) from the first publish to the last ack, per message: on a shared host it tells
the client's cost apart from the time it waited for a core. ``targets`` compares the rows
with the goals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench import common
from bench.common import RequestClasses
from bench.queue.support import TOPIC, Bench, Skipped, queues
from pawn_queue import Consumer, Message, PawnQueueConfig

logger = logging.getLogger("bench.queue")

PUBLISH_IN_FLIGHT = 4
STORES = ("s3", "memory")
MODES = ("backlog", "live")
# Goals of batch objects of 100, end to end, durable member acks included.
GOAL_S3_PER_S = 20_000.0
GOAL_MEMORY_PER_S = 50_000.0
GOAL_USD_PER_MILLION = 0.12
GOAL_PUT_LIST_PER_MESSAGE = 0.024


class ListenDrain:
    """Consumers ``listen()``-ing with a handler that acks, until ``expected`` distinct
    messages are acked."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.ids: set[str] = set()
        self.acks = 0
        self.started = self.finished = 0.0
        self._done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _handle(self, message: Message) -> None:
        await message.ack()
        self.acks += 1
        self.ids.add(message.id)
        if len(self.ids) >= self.expected and not self._done.is_set():
            self.finished = time.perf_counter()
            self._done.set()

    def start(self, consumers: Sequence[Consumer]) -> None:
        self.started = time.perf_counter()
        self._tasks = [asyncio.create_task(c.listen(self._handle)) for c in consumers]

    async def wait(self, time_limit: float) -> bool:
        """True once all are acked; False after ``time_limit`` seconds or if a listener
        ended (its error is raised)."""
        waiter = asyncio.create_task(self._done.wait())
        try:
            finished, _ = await asyncio.wait(
                [waiter, *self._tasks], timeout=time_limit, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        for task in finished:
            error = None if task is waiter else task.exception()
            if error is not None:
                raise error
        if not self._done.is_set():
            self.finished = time.perf_counter()
        return self._done.is_set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _publisher(producer: Any, size: int) -> Callable[[int], Awaitable[object]]:
    def publish(i: int) -> Awaitable[object]:
        sent: Awaitable[object] = producer.publish_batch(
            TOPIC, [{"n": i * size + j} for j in range(size)]
        )
        return sent

    return publish


async def batch_run(
    b: Bench, store: str, consumers: int, poll: int, mode: str, messages: int
) -> dict[str, Any]:
    """One measurement on a fresh bucket or memory store."""
    size = b.sizes.batch_size
    objects = -(-messages // size)
    polling: dict[str, float] = {} if poll == _default_poll() else {"max_messages_per_poll": poll}
    bucket = ""
    if store == "s3":
        bucket = await b.bucket(f"batch-{mode}-{consumers}c-{poll}p")
        config = b.ours_s3(bucket, polling=polling)
    else:
        config = {"backend": "memory", "memory": {"name": f"bench-{uuid.uuid4().hex}"}}
        if polling:
            config["polling"] = polling
    drain = ListenDrain(objects * size)
    async with queues([config] * (1 + consumers)) as (pq_producer, *pq_consumers):
        await pq_producer.create_topic(TOPIC)
        producer = await pq_producer.register_producer("bench-producer")
        if not hasattr(producer, "publish_batch"):
            raise Skipped("Producer.publish_batch not available")
        listeners = [
            await pq.register_consumer(f"bench-consumer-{i}", topics=[TOPIC])
            for i, pq in enumerate(pq_consumers)
        ]
        before = await b.counted(bucket) if bucket else {}
        cpu = time.process_time()
        started = time.perf_counter()
        if mode == "live":
            drain.start(listeners)
        publish_seconds = await common.publish_many(
            _publisher(producer, size), objects, PUBLISH_IN_FLIGHT
        )
        if mode == "backlog":
            drain.start(listeners)
        try:
            complete = await drain.wait(b.sizes.drain_timeout)
            cpu = time.process_time() - cpu
        finally:
            await drain.stop()
    run: dict[str, Any] = {
        "expected": drain.expected,
        "unique": len(drain.ids),
        "duplicates": drain.acks - len(drain.ids),
        "timed_out": not complete,
        "publish_seconds": round(publish_seconds, 3),
        "end_to_end_msgs_per_s": round(len(drain.ids) / (drain.finished - started), 1),
        "cpu_us_per_msg": round(cpu / max(1, len(drain.ids)) * 1e6, 1),
    }
    if mode == "backlog":
        run["msgs_per_s"] = round(len(drain.ids) / (drain.finished - drain.started), 1)
    if bucket:
        await asyncio.sleep(1.5)  # the server's counters lag a little
        run["requests"] = common.delta(before, await b.counted(bucket))
    return run


def _default_poll() -> int:
    return PawnQueueConfig.from_dict({"backend": "memory"}).polling.max_messages_per_poll


def batch_row(
    store: str, mode: str, consumers: int, poll: int, size: int, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "store": store,
        "mode": mode,
        "consumers": consumers,
        "poll": poll,
        "batch_size": size,
        "messages": runs[0]["expected"],
        "end_to_end_msgs_per_s": round(common.median(r["end_to_end_msgs_per_s"] for r in runs), 1),
    }
    if mode == "backlog":
        row["msgs_per_s"] = round(common.median(r["msgs_per_s"] for r in runs), 1)
    row["cpu_us_per_msg"] = round(common.median(r["cpu_us_per_msg"] for r in runs), 1)
    if all("requests" in r for r in runs):
        per = common.median_classes(
            [RequestClasses.from_counts(r["requests"]).per(r["expected"]) for r in runs]
        )
        row["requests_per_msg"] = per.as_dict()
        row["usd_per_million_msgs"] = round(per.dollars_per_million(), 4)
    row["duplicates"] = sum(r["duplicates"] for r in runs)
    row["timed_out"] = sum(bool(r["timed_out"]) for r in runs)
    row["runs"] = runs
    return row


def _label(row: dict[str, Any]) -> str:
    return f"{row['mode']}, {row['consumers']} consumer(s), polls of {row['poll']}"


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each goal against every row it concerns: measured value and whether it is met."""

    def check(
        goal: str,
        store: str,
        value: Callable[[dict[str, Any]], float],
        met: Callable[[float], bool],
    ) -> dict[str, Any]:
        measured = {
            _label(r): {"measured": value(r), "met": met(value(r))}
            for r in rows
            if r["store"] == store
        }
        return {"goal": goal, "rows": measured}

    return {
        "s3 end to end msg/s": check(
            f">= {GOAL_S3_PER_S:,.0f}",
            "s3",
            lambda r: r["end_to_end_msgs_per_s"],
            lambda v: v >= GOAL_S3_PER_S,
        ),
        "memory end to end msg/s": check(
            f">= {GOAL_MEMORY_PER_S:,.0f}",
            "memory",
            lambda r: r["end_to_end_msgs_per_s"],
            lambda v: v >= GOAL_MEMORY_PER_S,
        ),
        "s3 USD per million messages": check(
            f"<= {GOAL_USD_PER_MILLION}",
            "s3",
            lambda r: r["usd_per_million_msgs"],
            lambda v: v <= GOAL_USD_PER_MILLION,
        ),
        "s3 PUT/LIST-class requests per message": check(
            f"< {GOAL_PUT_LIST_PER_MESSAGE}",
            "s3",
            lambda r: r["requests_per_msg"]["put_list"],
            lambda v: v < GOAL_PUT_LIST_PER_MESSAGE,
        ),
    }


async def case_batch(b: Bench) -> dict[str, Any]:
    s = b.sizes
    default = _default_poll()
    setups = ((1, default), (4, default), (1, s.batch_size))
    runs: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    for run in range(s.runs):
        # Alternate the order, so a slower spell of the shared host hits each setup alike.
        modes = MODES if run % 2 == 0 else MODES[::-1]
        for store in STORES:
            messages = s.batch_messages if store == "s3" else s.batch_messages_memory
            for consumers, poll in setups:
                for mode in modes:
                    result = await batch_run(b, store, consumers, poll, mode, messages)
                    runs.setdefault((store, mode, consumers, poll), []).append(result)
                    logger.info(
                        "  batch %s %s c=%s poll %s: %s msg/s end to end",
                        store,
                        mode,
                        consumers,
                        poll,
                        result["end_to_end_msgs_per_s"],
                    )
    rows = [
        batch_row(store, mode, consumers, poll, s.batch_size, samples)
        for (store, mode, consumers, poll), samples in runs.items()
    ]
    rows.sort(key=lambda r: (STORES.index(r["store"]), MODES.index(r["mode"])))
    return {"rows": rows, "targets": targets(rows)}
