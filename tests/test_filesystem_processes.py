"""The blocking API on a local directory from several processes, each with several threads:
every message acked exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pawn_queue import PawnQueue
from pawn_queue.sync import PawnQueue as BlockingQueue
from tests.test_filesystem_store import _report, run_processes


def _sync_consumer_worker(root: str, worker: int, threads: int, barrier: Any, results: Any) -> None:
    """``threads`` threads, each with its own blocking queue, ack messages of topic "work"
    until it holds none; report the ids acked."""

    def run() -> list[str]:
        acked: list[str] = []
        failures: list[BaseException] = []

        def consume(thread: int) -> None:
            try:
                with BlockingQueue.from_url(f"file://{root}") as pq:
                    consumer = pq.register_consumer(f"w{worker}-{thread}", topics=["work"])
                    deadline = time.monotonic() + 90
                    while time.monotonic() < deadline:
                        messages = consumer.poll(wait=0.2)
                        for message in messages:
                            message.ack()
                            acked.append(message.id)  # list.append is atomic
                        stats = pq.topic_stats("work")
                        if not messages and stats.pending == stats.in_flight == 0:
                            return
                    raise TimeoutError("topic not drained within 90 s")
            except BaseException as exc:
                failures.append(exc)

        barrier.wait()
        pool = [threading.Thread(target=consume, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if failures:
            raise failures[0]
        return acked

    _report(results, worker, run)


async def test_processes_and_threads_consume_one_topic_with_the_blocking_api(
    tmp_path: Path,
) -> None:
    root = tmp_path / "queue"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        await pq.create_topic("work")
        producer = await pq.register_producer("p")
        published = set(
            await asyncio.gather(*(producer.publish("work", {"n": n}) for n in range(240)))
        )
    per_process = await asyncio.to_thread(
        run_processes, _sync_consumer_worker, [(str(root), 2)] * 3
    )
    counts = Counter(i for acked in per_process for i in acked)
    assert set(counts) == published
    assert max(counts.values()) == 1, "a message was delivered twice while its lease held"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        assert await pq.store.list("work/messages/") == []
        assert await pq.store.list("work/leases/") == []
