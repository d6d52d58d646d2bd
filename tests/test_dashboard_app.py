"""The dashboard's app without a browser (Starlette's TestClient, or its monitor on the
test's event loop): counts against the API, pages and fragments, the token, the host check,
CSRF and confirmation of actions, secrets, refresh cost, Prometheus flow, store failures."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient
from typer.testing import CliRunner

from pawn_queue import PawnQueue
from pawn_queue.cli import app as cli_app
from pawn_queue.config import load_config
from pawn_queue.dashboard import DashboardSettings, check_bind, create_app, is_loopback, listen
from pawn_queue.dashboard.meter import RequestMeter
from pawn_queue.dashboard.prometheus import parse_counters
from pawn_queue.dashboard.snapshots import Monitor
from pawn_queue.exceptions import ArgumentError, StoreUnavailableError
from pawn_queue.store import open_store
from pawn_queue.store.base import Store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from pawn_queue.sync import PawnQueue as SyncPawnQueue
from tests.conftest import queue_config_dict

T = TypeVar("T")
TOKEN = "dash-ToKeN-4b7c9e1f-do-not-print"
SECRET = "pq-SeCrEt-9d2e4f6a-do-not-print"
ACCESS = "pq-AcCeSs-31c5b7"
BASE = "http://127.0.0.1:8080"


@pytest.fixture
def fs_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "queue").mkdir()  # the dashboard only reads: the directory must exist
    return queue_config_dict("filesystem", request, tmp_path)


def settings(**overrides: Any) -> DashboardSettings:
    values: dict[str, Any] = {"refresh": 0.1, "full_refresh": 30.0, **overrides}
    return DashboardSettings(**values)


@contextmanager
def client_for(
    config: dict[str, Any], dashboard: DashboardSettings, store: Store | None = None
) -> Iterator[TestClient]:
    app = create_app(load_config(config), dashboard, store=store)
    with TestClient(app, base_url=BASE, follow_redirects=False) as client:
        yield client


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def dead_letter(pq: SyncPawnQueue, topic: str, count: int) -> list[str]:
    pq.create_topic(topic)
    producer = pq.register_producer("checkout")
    ids = [producer.publish(topic, {"n": n}) for n in range(count)]
    consumer = pq.register_consumer("billing", [topic])
    done = 0
    while done < count:
        for message in consumer.poll(wait=2):
            message.nack()
            done += 1
    return ids


# -- counts -----------------------------------------------------------------------------------


def test_counts_are_those_of_topic_stats(queue_config: dict[str, Any]) -> None:
    with SyncPawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders")
        producer = pq.register_producer("checkout")
        for n in range(4):
            producer.publish("orders", {"n": n})
        producer.publish("orders", {"later": True}, delay=600)
        producer.publish_batch("orders", [{"b": 1}, {"b": 2}])
        for group in ("a", "a", "b"):
            producer.publish("orders", {"group": group}, group=group)
        consumer = pq.register_consumer("billing", ["orders"])
        polled = consumer.poll()
        polled[0].nack()
        polled[1].extend(60)
        stats = pq.topic_stats("orders")
        with client_for(queue_config, settings()) as client:
            [row] = client.get("/api/topics").json()
        shown = row["stats"]
        assert (shown["pending"], shown["in_flight"], shown["delayed"], shown["dead_letter"]) == (
            stats.pending,
            stats.in_flight,
            stats.delayed,
            stats.dead_letter,
        )
        assert stats.dead_letter == 1 and stats.delayed == 1 and stats.in_flight >= 1
        assert row["settings"]["dedup_window_seconds"] == 300


def test_every_page_renders_whole_and_as_a_fragment(fs_config: dict[str, Any]) -> None:
    with SyncPawnQueue.from_config(fs_config) as pq:
        [letter] = dead_letter(pq, "orders", 1)
        pq.register_producer("checkout").publish("orders", {"x": 1}, group="g")
    pages = [
        "/",
        "/?sort=pending&desc=1",
        "/?sort=oldest_age",
        "/topics/orders",
        "/topics/orders/dead-letters",
        f"/topics/orders/dead-letters/{letter}",
        "/registry",
    ]
    with client_for(fs_config, settings()) as client:
        for path in pages:
            whole = client.get(path)
            assert whole.status_code == 200, (path, whole.text)
            assert whole.text.startswith("<!doctype html>")
            fragment = client.get(path, headers={"X-Fragment": "1"})
            assert fragment.status_code == 200, (path, fragment.text)
            assert "<html" not in fragment.text and "<h1>" in fragment.text
        missing = client.get("/topics/nope")
        assert missing.status_code == 404 and "does not exist" in missing.text
        gone = client.get("/topics/orders/dead-letters/not-an-id")
        assert gone.status_code == 404
        state = client.get("/api/state").json()
        assert state["cost"]["total"] > 0 and state["version"] > 0
        assert client.get("/static/dashboard.js").status_code == 200


# -- actions ----------------------------------------------------------------------------------


def test_actions_are_refused_while_off(fs_config: dict[str, Any]) -> None:
    with SyncPawnQueue.from_config(fs_config) as pq:
        dead_letter(pq, "orders", 2)
        with client_for(fs_config, settings()) as client:
            csrf = csrf_of(client.get("/topics/orders/dead-letters").text)
            for action in ("redrive", "purge"):
                refused = client.post(
                    f"/topics/orders/dead-letters/{action}",
                    data={"csrf": csrf, "all": "1", "confirmed": "yes"},
                )
                assert refused.status_code == 403
                assert "--allow-actions" in refused.text
        assert len(pq.dead_letters("orders")) == 2


def test_actions_need_the_csrf_token_and_a_confirmation_and_are_logged(
    fs_config: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with SyncPawnQueue.from_config(fs_config) as pq:
        ids = dead_letter(pq, "orders", 3)
        with client_for(fs_config, settings(allow_actions=True)) as client:
            url = "/topics/orders/dead-letters/redrive"
            csrf = csrf_of(client.get("/topics/orders/dead-letters").text)
            for form in ({"id": ids[0]}, {"id": ids[0], "csrf": "0" * 64}):
                refused = client.post(url, data={**form, "confirmed": "yes"})
                assert refused.status_code == 403 and "CSRF" in refused.text
            # Another browser (no cookie of ours) cannot use this page's token.
            other = TestClient(client.app, base_url=BASE)
            stolen = other.post(url, data={"id": ids[0], "csrf": csrf, "confirmed": "yes"})
            assert stolen.status_code == 403
            asked = client.post(url, data={"id": ids[0], "csrf": csrf})
            assert asked.status_code == 200 and 'id="confirm"' in asked.text
            assert len(pq.dead_letters("orders")) == 3  # not yet
            bad = client.post(url, data={"id": "x'><script>", "csrf": csrf, "confirmed": "yes"})
            assert bad.status_code == 400 and "<script>" not in bad.text
            with caplog.at_level(logging.INFO, logger="pawn_queue.dashboard"):
                done = client.post(url, data={"id": ids[0], "csrf": csrf, "confirmed": "yes"})
                assert done.status_code == 303
                assert done.headers["location"] == (
                    "/topics/orders/dead-letters?done=redrove&count=1"
                )
                purge = "/topics/orders/dead-letters/purge"
                assert client.post(purge, data={"csrf": csrf}).status_code == 200
                purged = client.post(purge, data={"csrf": csrf, "confirmed": "yes"})
                assert purged.status_code == 303
            page = client.get(purged.headers["location"]).text
            assert "purged 2 dead letters" in page
        assert [m.id for m in pq.peek("orders")] == [ids[0]]
        assert pq.dead_letters("orders") == []
    logged = [r.getMessage() for r in caplog.records if "dashboard action" in r.getMessage()]
    assert any("action=redrive topic=orders dead_letters=1" in line for line in logged)
    assert any("action=purge topic=orders dead_letters=2" in line for line in logged)


# -- token, host, bind --------------------------------------------------------------------


def test_a_token_is_asked_of_every_request(fs_config: dict[str, Any]) -> None:
    with SyncPawnQueue.from_config(fs_config) as pq:
        dead_letter(pq, "orders", 1)
    with client_for(fs_config, settings(token=TOKEN, allow_actions=True)) as client:
        responses = []
        for path in (
            "/",
            "/api/state",
            "/topics/orders",
            "/static/dashboard.js",
            f"/?token={'x' * 20}",
        ):
            response = client.get(path)
            responses.append(response)
            assert response.status_code == 401, path
        action = client.post("/topics/orders/dead-letters/purge", data={"confirmed": "yes"})
        assert action.status_code == 401
        login = client.get(f"/topics/orders?token={TOKEN}&sort=name")
        assert login.status_code == 303
        assert login.headers["location"] == "/topics/orders?sort=name"  # the token is dropped
        responses.append(login)
        page = client.get("/topics/orders")  # the session cookie now
        assert page.status_code == 200
        responses.append(page)
        other = TestClient(client.app, base_url="http://dash.example.org")
        bearer = other.get("/api/state", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200  # with a token, any host name
        responses.append(bearer)
    for response in responses:
        assert TOKEN not in response.text
        assert TOKEN not in str(response.headers)


def test_without_a_token_only_loopback_host_names_are_answered(fs_config: dict[str, Any]) -> None:
    with client_for(fs_config, settings()) as client:
        assert client.get("/", headers={"Host": "localhost:8080"}).status_code == 200
        assert client.get("/", headers={"Host": "[::1]:8080"}).status_code == 200
        rebound = client.get("/api/state", headers={"Host": "attacker.example:8080"})
        assert rebound.status_code == 421


def test_security_headers_on_every_answer(fs_config: dict[str, Any]) -> None:
    with client_for(fs_config, settings()) as client:
        for path in ("/", "/api/state", "/static/dashboard.css", "/topics/missing"):
            headers = client.get(path).headers
            assert "script-src 'self'" in headers["content-security-policy"], path
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"


def test_listening_beyond_loopback_needs_a_token() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.10", "dashboard.example.org"):
        assert not is_loopback(host)
        with pytest.raises(ArgumentError, match="--token"):
            check_bind(host, None)
        check_bind(host, TOKEN)
    with pytest.raises(ArgumentError, match="without a token"):
        listen("0.0.0.0", 0, None)
    with pytest.raises(ArgumentError, match="16 characters"):
        DashboardSettings(token="short")


def test_cli_refuses_a_public_address_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PAWNQUEUE_DASHBOARD_TOKEN", raising=False)
    url = f"file://{tmp_path}"
    result = CliRunner().invoke(cli_app, ["--url", url, "dashboard", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert "refusing to listen on 0.0.0.0 without a token" in line
    short = CliRunner().invoke(cli_app, ["--url", url, "dashboard", "--token", "hunter2"])
    assert short.exit_code == 2
    assert "16 characters" in short.stderr and "hunter2" not in short.stderr
    help_text = " ".join(CliRunner().invoke(cli_app, ["dashboard", "--help"]).stdout.split())
    assert "pip install 'pawn-queue[dashboard]'" in help_text
    assert "PAWNQUEUE_DASHBOARD_TOKEN" in help_text


def test_cli_serves_until_interrupted(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import urllib.request

    (tmp_path / "queue").mkdir()
    url = f"file://{tmp_path / 'queue'}"
    process = subprocess.Popen(
        [sys.executable, "-m", "pawn_queue", "--url", url, "dashboard", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        match = re.search(r"dashboard on (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        with urllib.request.urlopen(match.group(1), timeout=10) as response:
            assert response.status == 200
            assert b"No topics in this store yet" in response.read()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) in (0, 130)
    finally:
        process.kill()
        process.wait()


# -- secrets ----------------------------------------------------------------------------------


def test_no_secret_in_any_page_or_response(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    config = queue_config_dict("s3", request, tmp_path)
    s3 = config["s3"]
    assert isinstance(s3, dict)
    s3.update(aws_access_key_id=ACCESS, aws_secret_access_key=SECRET)
    with SyncPawnQueue.from_config(config) as pq:
        [letter] = dead_letter(pq, "orders", 1)
    paths = [
        f"/?token={TOKEN}",
        "/",
        "/topics/orders",
        "/topics/orders/dead-letters",
        f"/topics/orders/dead-letters/{letter}",
        "/registry",
        "/api/state",
        "/api/topics",
        "/topics/missing",
        "/static/dashboard.js",
    ]
    with client_for(config, settings(token=TOKEN, allow_actions=True)) as client:
        answers = [client.get(path) for path in paths]
        csrf = csrf_of(answers[1].text)
        answers.append(client.post("/topics/orders/dead-letters/purge", data={"csrf": csrf}))
        assert all(a.status_code in (200, 303, 404) for a in answers), [
            a.status_code for a in answers
        ]
    for answer in answers:
        for secret in (SECRET, ACCESS, TOKEN):
            assert secret not in answer.text
            assert secret not in str(answer.headers)


# -- refreshing, cost -------------------------------------------------------------------------


async def started(config: dict[str, Any], dashboard: DashboardSettings, store: Store) -> Monitor:
    app = create_app(load_config(config), dashboard, store=store)
    monitor: Monitor = app.state.monitor
    await monitor.start()
    return monitor


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_idle_costs_one_head_per_refresh_and_a_publish_is_seen(
    queue_config: dict[str, Any],
) -> None:
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        store = open_store(load_config(queue_config))
        monitor = await started(queue_config, settings(refresh=0.1, full_refresh=60), store)
        try:
            meter = monitor.meter
            await asyncio.sleep(0.5)  # the first look at the signals (a HEAD and a LIST)
            before = meter.counts.copy()
            await asyncio.sleep(1.0)
            idle = meter.counts - before
            assert set(idle) == {"HEAD"}, idle  # nothing but the change signals' HEAD
            assert 5 <= idle["HEAD"] <= 12
            version = monitor.topics["orders"].version
            await producer.publish("orders", {"n": 1})
            await eventually(lambda: monitor.topics["orders"].version > version)
            stats = monitor.topics["orders"].stats
            assert stats is not None and stats.pending == 1
            assert monitor.topics["orders"].history[-1].published == 1
        finally:
            await monitor.stop()


async def test_flow_between_reads_counts_what_came_and_went(fs_config: dict[str, Any]) -> None:
    async with await PawnQueue.from_config(fs_config) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        for n in range(3):
            await producer.publish("orders", {"n": n})
        monitor = await started(fs_config, settings(full_refresh=60), open_store(pq.config))
        try:
            consumer = await pq.register_consumer("billing", ["orders"])
            messages = await consumer.poll()
            await messages[0].ack()
            await messages[1].ack()
            await messages[2].nack()
            await producer.publish("orders", {"n": 3})
            await pq.runtime.background.done()
            await monitor.refresh_topics(["orders"])
            point = monitor.topics["orders"].history[-1]
            assert (point.published, point.settled, point.dead_lettered) == (1, 3, 1)
            assert (point.pending, point.dead_letter) == (1, 1)
        finally:
            await monitor.stop()


async def test_a_store_failure_shows_and_passes(fs_config: dict[str, Any]) -> None:
    class Flaky(StoreWrapper):
        failing: Exception | None = None

        async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
            if self.failing is not None:
                raise self.failing
            return await run()

    async with await PawnQueue.from_config(fs_config) as pq:
        await pq.create_topic("orders")
    flaky = Flaky(open_store(load_config(fs_config)))
    monitor = await started(fs_config, settings(full_refresh=60), flaky)
    try:
        # The store's errors, and any other, show on the page; refreshing goes on.
        for failure in (StoreUnavailableError("connection refused (test)"), RuntimeError("boom")):
            flaky.failing = failure
            monitor.refresh_soon()
            await eventually(lambda: monitor.error is not None)
            assert str(failure) in str(monitor.error)
            assert monitor.topics["orders"].stats is not None  # the last counts stay
            flaky.failing = None
            monitor.refresh_soon()
            await eventually(lambda: monitor.error is None)
    finally:
        await monitor.stop()


async def test_the_meter_counts_concurrent_requests_once() -> None:
    meter = RequestMeter(MemoryStore())
    await meter.put("a/b", b"x")
    await asyncio.gather(
        *(meter.list("a/") for _ in range(20)), *(meter.head("a/b") for _ in range(20))
    )
    cost = meter.cost()
    assert cost.total == 41 and cost.last_minute == 41
    assert cost.by_operation == {"HEAD": 20, "LIST": 20, "PUT": 1}


# -- Prometheus -------------------------------------------------------------------------------


def test_parse_counters_reads_the_message_counters_by_topic() -> None:
    text = "\n".join(
        [
            "# HELP pawnqueue_messages_published_total messages published",
            "# TYPE pawnqueue_messages_published_total counter",
            'pawnqueue_messages_published_total{topic="orders"} 7.0',
            'pawnqueue_messages_published_total{topic="we\\"ird"} 2.0',
            'pawnqueue_messages_acked_total{topic="orders"} 5.0',
            'pawnqueue_messages_published_created{topic="orders"} 1.7e9',
            'pawnqueue_store_requests_total{operation="get",outcome="ok"} 99.0',
            'pawnqueue_messages_acked_total{topic="orders"} not-a-number',
        ]
    )
    assert parse_counters(text) == {
        ("pawnqueue_messages_published_total", "orders"): 7.0,
        ("pawnqueue_messages_published_total", 'we"ird'): 2.0,
        ("pawnqueue_messages_acked_total", "orders"): 5.0,
    }


async def test_flow_from_a_prometheus_exporter(fs_config: dict[str, Any]) -> None:
    from prometheus_client import CollectorRegistry

    from pawn_queue.metrics import QueueMetrics, start_exporter

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = QueueMetrics(CollectorRegistry())
    start_exporter(port, "127.0.0.1", metrics.registry)
    config = load_config(fs_config)
    async with PawnQueue(config, observers=[metrics.observer]) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("checkout")
        await producer.publish("orders", {"n": 0})
        dashboard = settings(full_refresh=60, metrics_urls=(f"http://127.0.0.1:{port}/metrics",))
        monitor = await started(fs_config, dashboard, open_store(config))
        try:
            await asyncio.sleep(0.3)  # the first scrape: the counters' starting point
            for n in range(3):
                await producer.publish("orders", {"n": n})
            consumer = await pq.register_consumer("billing", ["orders"])
            for message in await consumer.poll():
                await message.ack()
            flow = monitor.topics["orders"].flow
            await eventually(lambda: sum(p.acked for p in flow) == 4)
            assert sum(p.published for p in flow) == 3
            assert monitor.scraper.error is None
        finally:
            await monitor.stop()
