"""A local directory shared by processes, each with several threads: the store's create and
compare-and-swap decide one winner per key, and the blocking API acks every message once."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any

from pawn_queue import PawnQueue
from pawn_queue.exceptions import AlreadyExists, PreconditionFailed
from pawn_queue.store.base import IfMatch
from pawn_queue.store.filesystem import FilesystemStore
from pawn_queue.sync import PawnQueue as BlockingQueue
from tests.helpers.support import leftover_temp_files

PROCESSES = 8
RACE_KEYS = [f"race/{i}/k.json" for i in range(6)]


# Workers run in "spawn" children, so they must be importable module-level functions. Each
# reports (worker, result) or (worker, traceback) on the queue; a barrier lines them up.


def report(results: Any, worker: int, fn: Callable[[], object]) -> None:
    try:
        results.put((worker, fn(), None))
    except BaseException:
        results.put((worker, None, traceback.format_exc()))


def _race_worker(
    root: str, worker: int, etags: dict[str, str] | None, barrier: Any, results: Any
) -> None:
    """Put every race key once, create-only (``etags`` None) or if-match; say who won what."""

    async def main() -> dict[str, str]:
        store = FilesystemStore(root)
        try:
            await store.put(f"warm-up/{worker}", b"")  # prepare the root before the start
            await asyncio.to_thread(barrier.wait)

            async def one(key: str) -> tuple[str, str]:
                data = f"{worker}:{key}".encode()
                try:
                    if etags is None:
                        return key, await store.put(key, data, mode="create")
                    return key, await store.put(key, data, mode=IfMatch(etags[key]))
                except (AlreadyExists, PreconditionFailed) as exc:
                    return key, type(exc).__name__

            return dict(await asyncio.gather(*(one(key) for key in RACE_KEYS)))
        finally:
            await store.close()

    report(results, worker, lambda: asyncio.run(main()))


def _counter_worker(
    root: str, worker: int, threads: int, increments: int, barrier: Any, results: Any
) -> None:
    """From ``threads`` threads (one event loop each, one shared store), increment a counter
    with compare-and-swap and create one log key per increment."""

    def run() -> int:
        store = FilesystemStore(root)
        start = threading.Barrier(threads)
        retries: list[int] = []

        async def thread_main(thread: int) -> None:
            await asyncio.to_thread(start.wait)
            conflicts = 0
            for i in range(increments):
                while True:
                    current = await store.get("counter")
                    new = str(int(current.data) + 1).encode()
                    try:
                        await store.put("counter", new, mode=IfMatch(current.meta.etag))
                        break
                    except PreconditionFailed:
                        conflicts += 1
                await store.put(f"log/{worker}-{thread}-{i}", new, mode="create")
            retries.append(conflicts)

        barrier.wait()
        pool = [
            threading.Thread(target=asyncio.run, args=(thread_main(t),)) for t in range(threads)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        asyncio.run(store.close())
        assert len(retries) == threads, "a thread died"
        return sum(retries)

    report(results, worker, run)


def run_processes(target: Callable[..., None], args: Sequence[tuple[object, ...]]) -> list[Any]:
    """Start one spawned process per ``args`` entry (each gets worker, *args, barrier, queue
    appended as documented by the target) and return their results in worker order."""
    ctx: SpawnContext = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(*a[:1], worker, *a[1:], barrier, results))
        for worker, a in enumerate(args)
    ]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    errors = [tb for _, _, tb in reports if tb]
    assert not errors, errors[0]
    return [value for _, value, _ in sorted(reports, key=lambda r: r[0])]


def check_one_winner_per_key(root: Path, outcomes: list[dict[str, str]], loser: str) -> None:
    for key in RACE_KEYS:
        winners = [w for w, out in enumerate(outcomes) if out[key].startswith('"')]
        assert len(winners) == 1, (key, [out[key] for out in outcomes])
        assert all(out[key] == loser for w, out in enumerate(outcomes) if w != winners[0])
        assert (root / key).read_bytes() == f"{winners[0]}:{key}".encode()


async def test_create_race_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outcomes = await asyncio.to_thread(run_processes, _race_worker, [(str(root), None)] * PROCESSES)
    check_one_winner_per_key(root, outcomes, "AlreadyExistsError")
    assert leftover_temp_files(root) == []


async def test_compare_and_swap_race_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FilesystemStore(root)
    etags = {key: await store.put(key, b"start") for key in RACE_KEYS}
    await store.close()
    outcomes = await asyncio.to_thread(
        run_processes, _race_worker, [(str(root), etags)] * PROCESSES
    )
    check_one_winner_per_key(root, outcomes, "PreconditionFailedError")


async def test_threads_and_processes_share_one_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    procs, threads, increments = 3, 3, 8
    store = FilesystemStore(root)
    await store.put("counter", b"0")
    await asyncio.to_thread(
        run_processes, _counter_worker, [(str(root), threads, increments)] * procs
    )
    total = procs * threads * increments
    assert (await store.get("counter")).data == str(total).encode()
    log = await store.list("log/")
    assert len(log) == total
    # Every increment was seen exactly once: the logged values are 1..total.
    values = sorted([int((await store.get(m.key)).data) for m in log])
    assert values == list(range(1, total + 1))
    await store.close()


# -- the blocking API ---------------------------------------------------------------------
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

    report(results, worker, run)


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
