"""Metrics (pawn_queue.metrics) fed by the core's observer hooks, and what ``/metrics``
exports: the worker's, ``pawn-queue metrics``' and ``start_exporter``'s (on loopback by
default; a metric only once it has a sample)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pawn_queue import Message, PawnQueue
from pawn_queue.config import load_config
from pawn_queue.metrics import QueueMetrics, only_sampled, start_exporter
from pawn_queue.observe import Observer, Outcome
from pawn_queue.sync import PawnQueue as SyncPawnQueue
from tests.helpers.storage import write_unreadable_message
from tests.helpers.stores import queue_config_dict

ROOT = Path(__file__).resolve().parent.parent


class DeadLetterCount(Observer):
    """Sets ``reached`` once ``target`` messages were dead-lettered."""

    def __init__(self, target: int) -> None:
        self.count, self.target, self.reached = 0, target, asyncio.Event()

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.count += outcome == "dead_letter"
        if self.count >= self.target:
            self.reached.set()


async def test_the_observer_counts_what_the_queue_does(queue_config: dict[str, Any]) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    dead = DeadLetterCount(3)
    observers = [metrics.observer, dead]
    async with PawnQueue(load_config(queue_config), observers=observers) as pq:
        await pq.create_topic("t", max_receive_count=1)
        producer = await pq.register_producer("p")
        await producer.publish("t", "ack")
        await producer.publish("t", "requeue")
        await producer.publish_batch("t", ["nack", "ack"])
        consumer = await pq.register_consumer("c", topics=["t"])
        polled = await consumer.poll(wait=5)
        assert sorted(m.payload for m in polled) == ["ack", "ack", "nack", "requeue"]
        for message in polled:
            if message.payload == "ack":
                await message.ack()
            elif message.payload == "nack":
                await message.nack()
            else:
                await message.nack(requeue=True)
        await producer.publish("t", "fail")
        failed = asyncio.Event()

        async def handler(message: Message) -> None:
            if message.payload == "fail":
                failed.set()
                raise ValueError("boom")

        task = asyncio.create_task(consumer.listen(handler))
        await asyncio.wait_for(failed.wait(), 10)

        # "requeue" is dead-lettered for max_receive_count when claimed again, "fail" by
        # its handler.
        await asyncio.wait_for(dead.reached.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("pawnqueue_messages_published_total", topic="t") == 5
    assert value("pawnqueue_messages_acked_total", topic="t") == 2
    assert value("pawnqueue_messages_nacked_total", topic="t", requeue="false") == 1
    assert value("pawnqueue_messages_nacked_total", topic="t", requeue="true") == 1
    # nack, fail (handler_error) and requeue (max_receive_count).
    assert value("pawnqueue_messages_dead_lettered_total", topic="t") == 3
    assert value("pawnqueue_handler_seconds_count", topic="t", outcome="error") == 1
    assert value("pawnqueue_messages_delivered_total", topic="t") == 5


async def test_a_quarantined_corrupt_object_counts_as_dead_lettered(
    queue_config: dict[str, Any],
) -> None:
    """An unreadable object never becomes a message; its move to dead letter still counts."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    async with PawnQueue(load_config(queue_config), observers=[metrics.observer]) as pq:
        await pq.create_topic("t")
        await write_unreadable_message(pq.store, "t", b"\xff not json")
        consumer = await pq.register_consumer("c", topics=["t"])
        assert await consumer.poll() == []
        [letter] = await pq.dead_letters("t")
        assert letter.reason == "corrupt"
    dead = registry.get_sample_value("pawnqueue_messages_dead_lettered_total", {"topic": "t"})
    assert dead == 1


# -- what /metrics exports ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[str, Metric]:
    """The pawnqueue_* families ``/metrics`` on ``port`` exports, by name."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("pawn")}


def scrape_until(port: int, check: Callable[[dict[str, Metric]], bool]) -> dict[str, Metric]:
    """The families once ``check`` holds: the exporter is another process, whose state only
    its answers show."""
    deadline = time.monotonic() + 60
    while True:
        try:
            families = scrape(port)
            if check(families):
                return families
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, "the exporter never showed it"
        time.sleep(0.2)


def value(families: dict[str, Metric], family: str, sample: str, **labels: str) -> float:
    found = families.get(family)
    for s in found.samples if found is not None else []:
        if s.name == sample and s.labels == labels:
            return float(s.value)
    return -1.0


def without_empty(families: dict[str, Metric]) -> dict[str, Metric]:
    return {name: family for name, family in families.items() if not family.samples}


def child(argv: list[str], **popen: Any) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "pawn_queue", *argv], cwd=ROOT, env=env, text=True, **popen
    )


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_exporter_listens_on_loopback_by_default() -> None:
    from prometheus_client import CollectorRegistry

    server, _ = start_exporter(0, registry=CollectorRegistry())
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_metric_is_exported_once_it_has_a_sample(queue_config: dict[str, Any]) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)

    def exported() -> str:
        return generate_latest(only_sampled(registry)).decode()

    assert "pawnqueue" not in exported()  # nothing observed: nothing to show

    async def main() -> None:
        async with PawnQueue(load_config(queue_config), observers=[metrics.observer]) as pq:
            await pq.create_topic("t")
            await (await pq.register_producer("p")).publish("t", 1)
            consumer = await pq.register_consumer("c", topics=["t"])
            [message] = await consumer.poll(wait=5)
            await message.ack()

    asyncio.run(main())
    text = exported()
    assert 'pawnqueue_messages_acked_total{topic="t"} 1.0' in text
    for unfed in ("lease_lost", "messages_nacked", "poll_seconds", "topic_"):
        assert f"pawnqueue_{unfed}" not in text
    # The registry itself still holds every family (for code that reads it).
    assert {f.name for f in registry.collect()} >= {"pawnqueue_poll_seconds"}


def test_the_worker_exports_only_metrics_with_samples(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(queue_config_dict("filesystem", request, tmp_path)))
    with SyncPawnQueue.from_config(str(config)) as pq:
        pq.create_topic("jobs")
        producer = pq.register_producer("test")
        for seq in range(3):
            producer.publish("jobs", {"seq": seq})
    port = free_port()
    argv = ["--config", str(config), "worker", "tests.workers.service_app:app"]
    worker = child([*argv, "--metrics-port", str(port)], stdout=subprocess.PIPE)
    try:
        assert worker.stdout is not None
        done = 0
        while done < 3:  # the app's handler prints "done ..." as it returns
            line = worker.stdout.readline()
            assert line, "the worker stopped"
            done += line.startswith("done ")
        families = scrape_until(
            port,
            lambda f: (
                value(f, "pawnqueue_messages_acked", "pawnqueue_messages_acked_total", topic="jobs")
                == 3
            ),
        )
    finally:
        stop(worker)
    assert without_empty(families) == {}
    names = set(families)
    assert names >= {
        "pawnqueue_messages_delivered",
        "pawnqueue_messages_acked",
        "pawnqueue_handler_seconds",
        "pawnqueue_store_requests",
        "pawnqueue_store_request_seconds",
    }
    # listen() has no poll to time, and the worker sets no topic gauge (`pawn-queue metrics`).
    assert not {n for n in names if n.startswith(("pawnqueue_poll", "pawnqueue_topic_"))}


def test_the_metrics_command_listens_on_loopback_and_exports_what_it_samples(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path / 'queue'}"
    with SyncPawnQueue.from_config(
        {"backend": "filesystem", "filesystem": {"path": str(tmp_path / "queue")}}
    ) as pq:
        pq.create_topic("orders")
        producer = pq.register_producer("checkout")
        for n in range(2):
            producer.publish("orders", {"n": n})
    port = free_port()
    argv = ["--url", url, "metrics", "orders", "--port", str(port), "--interval", "0.2"]
    exporter = child([*argv, "--duration", "60"], stderr=subprocess.PIPE)
    try:
        assert exporter.stderr is not None
        line = exporter.stderr.readline()
        assert f"serving metrics on http://127.0.0.1:{port}/metrics" in line, line
        families = scrape_until(
            port,
            lambda f: (
                value(f, "pawnqueue_topic_pending", "pawnqueue_topic_pending", topic="orders") == 2
            ),
        )
    finally:
        stop(exporter)
    assert without_empty(families) == {}
    assert {n.removesuffix("_created") for n in families} == {
        "pawnqueue_store_requests",
        "pawnqueue_store_request_seconds",
        "pawnqueue_topic_pending",
        "pawnqueue_topic_in_flight",
        "pawnqueue_topic_delayed",
        "pawnqueue_topic_dead_letters",
        "pawnqueue_topic_oldest_age_seconds",
    }
