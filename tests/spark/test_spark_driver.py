"""The driver side of a streaming read, without Spark: what it claims, writes, replays, acks,
and what an idle query costs."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pawn_queue import PawnQueue, PawnQueueConfig
from pawn_queue._protocol import layout
from pawn_queue.exceptions import ConfigError
from pawn_queue.spark.driver import StreamDriver
from pawn_queue.spark.manifests import Limit, Manifest
from pawn_queue.spark.options import SourceOptions
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.filesystem import FilesystemStore


def _options(root: Path, **extra: str) -> SourceOptions:
    return SourceOptions.parse({"url": f"file://{root}", "topic": "jobs", **extra})


async def _publish(
    root: Path, singles: int, batches: tuple[int, ...] = (), claims: str = "message"
) -> list[str]:
    async with PawnQueue.from_url(f"file://{root}") as pq:
        await pq.create_topic("jobs", claims=claims)
        producer = await pq.register_producer("p")
        ids = [await producer.publish("jobs", {"n": i}) for i in range(singles)]
        for size in batches:
            ids += await producer.publish_batch("jobs", [{"n": i} for i in range(size)])
        return ids


async def _keys(root: Path, prefix: str) -> list[str]:
    store = FilesystemStore(root)
    try:
        return [meta.key for meta in await store.list(prefix)]
    finally:
        await store.close()


async def test_replay_after_a_crash_and_ack(tmp_path: Path) -> None:
    await _publish(tmp_path, 5, (20,))
    first = await StreamDriver.open(_options(tmp_path), "q1")
    assert await first.latest(-1, Limit()) == 0
    planned = [ref.key for m in await first.plan(-1, 0) for ref in m.refs]
    assert len(planned) == 6 and len(await _keys(tmp_path, "jobs/leases/")) == 6
    await first.stop()  # the process dies: its leases stay live

    # A consumer cannot take what the query holds.
    async with PawnQueue.from_url(f"file://{tmp_path}") as pq:
        consumer = await pq.register_consumer("rival", topics=["jobs"])
        assert await consumer.poll() == []

    second = await StreamDriver.open(_options(tmp_path), "q1")
    replayed = [ref.key for m in await second.plan(-1, 0) for ref in m.refs]
    assert replayed == planned
    await second.ack_through(0)
    assert await _keys(tmp_path, "jobs/messages/") == []
    assert await _keys(tmp_path, "jobs/leases/") == []
    assert await _keys(tmp_path, "_spark/q1/") == []
    await second.stop()


async def test_priorities_first_and_a_band_past_every_due_time_is_skipped(
    tmp_path: Path,
) -> None:
    """A micro-batch claims priority 9 first; a priority band whose keys lie past every due
    time (a producer whose clock runs ahead) ends that band only, not the listing."""
    ahead = datetime.now(UTC) + timedelta(minutes=10)
    config = PawnQueueConfig.from_url(f"file://{tmp_path}")
    async with PawnQueue(config, clock=lambda: ahead) as early:
        await early.create_topic("jobs")
        await (await early.register_producer("ahead")).publish("jobs", "ahead", priority=5)
    async with PawnQueue.from_url(f"file://{tmp_path}") as pq:
        producer = await pq.register_producer("p")
        plain = await producer.publish("jobs", "plain")
        urgent = await producer.publish("jobs", "urgent", priority=9)
    driver = await StreamDriver.open(_options(tmp_path), "q1")
    try:
        assert await driver.latest(-1, Limit()) == 0
        planned = [ref.key for m in await driver.plan(-1, 0) for ref in m.refs]
        assert [key.rsplit("-", 1)[-1] for key in planned] == [
            urgent.rsplit("-", 1)[-1] + ".run",
            plain.rsplit("-", 1)[-1] + ".run",
        ]
    finally:
        await driver.stop()


async def test_a_micro_batch_takes_a_whole_run_under_one_claim(tmp_path: Path) -> None:
    """A topic with claims="second": the messages of one second share one lease, which the
    query claims once and takes the rest in under; the ack deletes each, then the lease."""
    ids = await _publish(tmp_path, 12, claims="second")
    store = CountingStore(FilesystemStore(tmp_path))
    driver = await StreamDriver.open(_options(tmp_path), "q5", store=store)
    try:
        assert await driver.latest(-1, Limit()) == 0
        (manifest,) = await driver.plan(-1, 0)
        planned = [layout.parse_pending_key(ref.key) for ref in manifest.refs]
        assert [p.object_id for p in planned if p] == ids
        runs = {key.rsplit("/", 1)[-1] for key in await _keys(tmp_path, "jobs/leases/")}
        assert runs and all(name.startswith("s") for name in runs)
        # Ten messages a run; twelve publishes span at most two seconds here.
        assert len(runs) <= 3
        await driver.ack_through(0)
        await driver.stop()
        assert await _keys(tmp_path, "jobs/messages/") == []
        assert await _keys(tmp_path, "jobs/leases/") == []
    finally:
        await store.close()


async def test_a_run_is_taken_back_whole_after_a_restart(tmp_path: Path) -> None:
    await _publish(tmp_path, 8, claims="second")
    first = await StreamDriver.open(_options(tmp_path), "q6")
    assert await first.latest(-1, Limit()) == 0
    planned = [ref.key for m in await first.plan(-1, 0) for ref in m.refs]
    await first.stop()  # the process dies: its run's leases stay live
    second = await StreamDriver.open(_options(tmp_path), "q6")
    replayed = [ref.key for m in await second.plan(-1, 0) for ref in m.refs]
    assert replayed == planned and len(planned) == 8
    await second.ack_through(0)  # every message of each run: none was left unadopted
    await second.stop()
    assert await _keys(tmp_path, "jobs/messages/") == []
    assert await _keys(tmp_path, "jobs/leases/") == []


async def test_unlogged_manifest_is_rebuilt(tmp_path: Path) -> None:
    await _publish(tmp_path, 4)
    first = await StreamDriver.open(_options(tmp_path), "q2")
    assert await first.latest(-1, Limit(max_rows=2)) == 0
    await first.stop()
    # Spark never logged offset 0: the next run starts from -1 again.
    second = await StreamDriver.open(_options(tmp_path), "q2")
    assert await second.latest(-1, Limit()) == 0
    (manifest,) = await second.plan(-1, 0)
    assert len(manifest.refs) == 4
    await second.stop()


async def test_limits_never_split_a_batch_object(tmp_path: Path) -> None:
    await _publish(tmp_path, 3, (10, 10))
    driver = await StreamDriver.open(_options(tmp_path), "q3")
    sizes = []
    start = -1
    while (end := await driver.latest(start, Limit(max_rows=12))) != start:
        (manifest,) = await driver.plan(start, end)
        sizes.append(len(manifest.refs))
        await driver.ack_through(end)
        start = end
    assert sizes == [3, 1, 1]  # 3 messages; a batch object of 10; the other one
    assert await _keys(tmp_path, "jobs/messages/") == []
    await driver.stop()


async def test_idle_query_costs_one_head_per_check(tmp_path: Path) -> None:
    """Spark asks for the latest offset every ~20 ms; an idle query answers from memory and
    only the change-signal watcher touches the store: a HEAD every notify check."""
    await _publish(tmp_path, 0)
    store = CountingStore(FilesystemStore(tmp_path))
    driver = await StreamDriver.open(_options(tmp_path), "q4", store=store)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # the first calls look (and the signals take a baseline)
        assert await driver.latest(-1, Limit()) == -1
        await asyncio.sleep(0.02)
    store.reset()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert await driver.latest(-1, Limit()) == -1
        await asyncio.sleep(0.02)  # Spark's cadence when idle
    counts = store.reset()
    assert set(counts) <= {"HEAD"} and counts["HEAD"] <= 16, counts  # at most one per 0.1 s

    # A publish is noticed by its change signal, long before the 60 s backfill poll.
    await _publish(tmp_path, 1)
    started = time.monotonic()
    while await driver.latest(-1, Limit()) == -1:
        assert time.monotonic() - started < 3
        await asyncio.sleep(0.02)
    await driver.stop()
    await store.close()


def test_manifest_round_trip() -> None:
    from pawn_queue.spark.reading import ObjectRef

    manifest = Manifest(3, (ObjectRef("t/messages/a.batch", 10, (1, 2), 2), ObjectRef("t/m/b", 5)))
    assert Manifest.decode(3, manifest.encode("q")) == manifest


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"topic": "jobs"}, "needs a store"),
        ({"url": "file:///x"}, "needs option 'topic'"),
        ({"url": "file:///x", "topic": "a", "topics": "b"}, "not both"),
        ({"url": "file:///x", "topic": "a,b"}, "takes one topic"),
        ({"url": "file:///x", "topics": "a,a"}, "names a topic twice"),
        ({"url": "file:///x", "topic": "_x"}, "reserved"),
        ({"url": "file:///x", "config": "c.yaml", "topic": "a"}, "not both"),
        ({"url": "memory://", "topic": "a"}, "memory store"),
        ({"url": "file:///x", "topic": "a", "maxMessagesPerTrigger": "0"}, ">= 1"),
        ({"url": "file:///x", "topic": "a", "maxmessagespertrigger": "x"}, "not an integer"),
        ({"url": "file:///x", "topic": "a", "failOnDataLoss": "maybe"}, "true or false"),
        ({"url": "file:///x", "topic": "a", "leaseTimeoutSeconds": "1"}, "at least 3 x"),
        ({"url": "file:///x", "topic": "a", "state": "gone"}, "'pending', 'dead_letter'"),
        ({"url": "file:///x", "topic": "a", "messagesPerObject": "1000000"}, "<= 100000"),
        ({"url": "file:///x", "topic": "a", "colour": "red"}, "unknown option 'colour'"),
    ],
)
def test_option_errors(
    options: dict[str, str], error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("PAWNQUEUE_")]:
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match=error):
        SourceOptions.parse(options).config()


def test_options_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PAWNQUEUE_URL", f"file://{tmp_path}")
    options = SourceOptions.parse({"TOPICS": "a,b", "FailOnDataLoss": "false", "path": "ignored"})
    assert options.topics == ("a", "b") and not options.fail_on_data_loss
    assert options.config() == PawnQueueConfig.from_url(f"file://{tmp_path}")


async def test_open_on_a_local_directory_sends_no_strategy_probe(tmp_path: Path) -> None:
    """A local directory enforces conditional writes: strategy auto needs no probe there
    (the library's setup() and the stream driver resolve it the same way)."""
    await _publish(tmp_path, 1)
    store = CountingStore(FilesystemStore(tmp_path))
    driver = await StreamDriver.open(_options(tmp_path), "q5", store=store)
    try:
        counts = store.reset()
        assert counts["PUT"] + counts["PUT create"] + counts["PUT if-match"] == 0, counts
        assert await _keys(tmp_path, "_probe/") == []
    finally:
        await driver.stop()
        await store.close()
