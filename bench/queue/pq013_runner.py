"""Drives pawn-queue 0.1.3 (PyPI) for bench/queue/compare.py, through its public API only.

Runs under the 0.1.3 virtualenv, from the repository root, never importing this checkout's
package (src/ is not on sys.path; ``bench.queue.support.run_child`` starts it)::

    .venv-pq013/bin/python -m bench.queue.pq013_runner '{"action": "publish", ...}'

The argument is a JSON spec (see ``ACTIONS``); the last line printed is the JSON result.
Requests are counted by the caller's SeaweedFS metrics, per bucket (``common.scrape``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pawn_queue  # 0.1.3, from this interpreter's venv
from bench import common
from pawn_queue import PawnQueue

TOPIC = "bench"


def _check_version() -> None:
    version = importlib.metadata.version("pawn-queue")
    if version != "0.1.3":
        raise SystemExit(f"pq013_runner needs pawn-queue 0.1.3, found {version}")
    if not Path(pawn_queue.__file__ or "").resolve().is_relative_to(Path(sys.prefix).resolve()):
        raise SystemExit(f"pawn_queue imported from {pawn_queue.__file__}, not {sys.prefix}")


def _config(spec: dict[str, Any], bucket: str, interval: float = 1.0) -> dict[str, Any]:
    return {
        "s3": {**spec["s3"], "bucket_name": bucket},
        "polling": {"interval_seconds": interval},
        "concurrency": {"strategy": "conditional_write"},
    }


@contextlib.asynccontextmanager
async def _queues(configs: list[dict[str, Any]]) -> AsyncIterator[list[Any]]:
    async with contextlib.AsyncExitStack() as stack:
        queues = []
        for config in configs:
            queues.append(await stack.enter_async_context(await PawnQueue.from_config(config)))
        yield queues


def _counter(spec: dict[str, Any], bucket: str) -> Callable[[], dict[str, int]]:
    return lambda: common.scrape(spec["metrics_url"], bucket)


async def publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Serial and concurrent publish rates, one fresh topic per run."""
    out: dict[str, list[float]] = {"serial": [], "concurrent": []}
    async with _queues([_config(spec, spec["bucket"])]) as (pq,):
        producer = await pq.register_producer("bench-producer")
        for run in range(spec["runs"]):
            for mode, count, in_flight in (
                ("serial", spec["serial"], 1),
                ("concurrent", spec["concurrent"], spec["in_flight"]),
            ):
                topic = f"{mode}-{run}"
                await pq.create_topic(topic)
                seconds = await common.publish_many(
                    common.numbered(producer, topic), count, in_flight
                )
                out[mode].append(count / seconds)
    return out


async def drain(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per bucket: publish N, drain with C consumers (one PawnQueue each); count requests."""
    results = []
    for bucket in spec["buckets"]:
        config = _config(spec, bucket)
        async with _queues([config] * (1 + spec["consumers"])) as queues:
            await queues[0].create_topic(TOPIC)
            producer = await queues[0].register_producer("bench-producer")
            consumers = [
                await pq.register_consumer(f"bench-consumer-{i}", topics=[TOPIC])
                for i, pq in enumerate(queues[1:])
            ]
            count = _counter(spec, bucket)
            before = count()
            publish_seconds = await common.publish_many(
                common.numbered(producer, TOPIC), spec["messages"], spec["in_flight"]
            )
            result = await common.drain(consumers, spec["messages"], spec["timeout"])
            requests = common.delta(before, count())
        results.append(
            {"publish_seconds": publish_seconds, "requests": requests, **result.summary()}
        )
    return results


async def idle(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Idle listen() consumers (one per job, each in its own bucket), measured concurrently."""

    async def one(job: dict[str, Any]) -> dict[str, Any]:
        config = _config(spec, job["bucket"], spec["interval"])
        async with _queues([config]) as (pq,):
            topics = [f"topic-{i}" for i in range(job["topics"])]
            for topic in topics:
                await pq.create_topic(topic)
            consumer = await pq.register_consumer("idle-consumer", topics=topics)
            requests = await common.measure_idle(
                consumer, spec["seconds"], _counter(spec, job["bucket"]), spec["warmup"]
            )
        return {**job, "seconds": spec["seconds"], "requests": requests}

    return list(await asyncio.gather(*(one(job) for job in spec["jobs"])))


async def latency(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Publish-to-handler latency, producer and listening consumer on separate PawnQueues."""
    results = []
    for bucket in spec["buckets"]:
        config = _config(spec, bucket, spec["interval"])
        async with _queues([config, config]) as (pq_producer, pq_consumer):
            await pq_producer.create_topic(TOPIC)
            producer = await pq_producer.register_producer("bench-producer")
            consumer = await pq_consumer.register_consumer("bench-consumer", topics=[TOPIC])
            result = await common.measure_latency(
                common.sender(producer, TOPIC),
                consumer,
                period=spec["period"],
                duration=spec["duration"],
                drain_timeout=spec["drain_timeout"],
            )
        results.append(result.summary())
    return results


async def listen_drain(spec: dict[str, Any]) -> dict[str, Any]:
    """bench/cost/group_commit.py's workload: ``publishers`` tasks call ``publish()`` one message at
    a time on one producer while ``consumers`` consumers of the same PawnQueue ``listen()``
    and ack, all started together; stops when every message is acked or after ``timeout``
    seconds (then ``bounded``: the rate is what was acked by then)."""
    bucket, messages = spec["bucket"], spec["messages"]
    count = _counter(spec, bucket)
    async with _queues([_config(spec, bucket, spec["interval"])]) as (pq,):
        await pq.create_topic(TOPIC)
        producer = await pq.register_producer("bench-producer")
        consumers = [
            await pq.register_consumer(f"bench-consumer-{i}", topics=[TOPIC])
            for i in range(spec["consumers"])
        ]
        before = await asyncio.to_thread(count)
        ids: set[str] = set()
        acks = 0
        done = asyncio.Event()

        async def handle(message: Any) -> None:
            nonlocal acks
            await message.ack()
            acks += 1
            ids.add(message.id)
            if len(ids) >= messages:
                done.set()

        published = 0
        publish_seconds = float("nan")

        async def publish(share: int) -> None:
            nonlocal published
            for n in range(share):
                await producer.publish(TOPIC, {"n": n})
                published += 1

        async def publish_all() -> None:
            nonlocal publish_seconds
            publishers = spec["publishers"]
            shares = [
                messages // publishers + (i < messages % publishers) for i in range(publishers)
            ]
            await asyncio.gather(*(publish(share) for share in shares))
            publish_seconds = time.perf_counter() - started

        listeners = [asyncio.create_task(c.listen(handle)) for c in consumers]
        started = time.perf_counter()
        publishing = asyncio.create_task(publish_all())
        bounded = False
        try:
            await asyncio.wait_for(done.wait(), spec["timeout"])
        except TimeoutError:
            bounded = True
        elapsed = time.perf_counter() - started
        unique = len(ids)
        for task in (publishing, *listeners):
            task.cancel()
        await asyncio.gather(publishing, *listeners, return_exceptions=True)
    await asyncio.sleep(1.5)  # the server's counters lag a little
    return {
        "bounded": bounded,
        "published": published,
        "acked": unique,
        "duplicates": acks - unique,
        "seconds": elapsed,
        "publish_seconds": publish_seconds,
        "rate": unique / elapsed,
        "requests": common.delta(before, await asyncio.to_thread(count)),
    }


ACTIONS: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
    "publish": publish,
    "drain": drain,
    "listen_drain": listen_drain,
    "idle": idle,
    "latency": latency,
}


def main() -> None:
    _check_version()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    spec = json.loads(sys.argv[1])
    action = ACTIONS.get(spec.get("action", ""))
    if action is None:
        raise SystemExit(f"unknown action {spec.get('action')!r}; choose from {sorted(ACTIONS)}")
    result = asyncio.run(asyncio.wait_for(action(spec), spec.get("deadline", 600)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
