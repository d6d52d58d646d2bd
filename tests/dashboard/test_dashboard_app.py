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
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.testclient import TestClient
from typer.testing import CliRunner

from pawn_queue import PawnQueue
from pawn_queue._protocol.envelope import now_utc
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
from tests.helpers.dashboard_pages import csrf_of, dead_letter
from tests.helpers.stores import queue_config_dict

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


class Clock:
    """The dashboard's wall clock, moved on by hand: "a refresh interval later", exactly."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> datetime:
        return now_utc() + timedelta(seconds=self.offset)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class Gets(StoreWrapper):
    """Remembers the key of every GET."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.keys: list[str] = []

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "get":
            self.keys.append(call.key)
        return await run()


@contextmanager
def client_for(
    config: dict[str, Any],
    dashboard: DashboardSettings,
    store: Store | None = None,
    clock: Clock | None = None,
) -> Iterator[TestClient]:
    extra = {} if clock is None else {"clock": clock}
    app = create_app(load_config(config), dashboard, store=store, **extra)
    with TestClient(app, base_url=BASE, follow_redirects=False) as client:
        yield client


def counts_of(client: TestClient, topic: str) -> dict[str, Any]:
    rows = {row["topic"]: row for row in client.get("/api/topics").json()}
    stats = rows[topic]["stats"]
    assert isinstance(stats, dict)
    return stats


# -- counts -----------------------------------------------------------------------------------


def test_counts_are_messages_with_the_objects_of_topic_stats_beside(
    queue_config: dict[str, Any],
) -> None:
    with SyncPawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders")
        producer = pq.register_producer("checkout")
        producer.publish_batch("orders", [{"b": n} for n in range(100)])
        for n in range(4):
            producer.publish("orders", {"n": n})
        producer.publish("orders", {"later": True}, delay=600)
        for group in ("a", "a", "b"):
            producer.publish("orders", {"group": group}, group=group)
        batch = pq.peek("orders", limit=1)[0].key
        consumer = pq.register_consumer("billing", ["orders"])
        polled = consumer.poll()  # the batch's first members: the batch is in flight
        assert all("b" in m.payload for m in polled)
        for message in polled[:3]:
            message.ack()  # the batch's lease lists them settled
        polled[3].nack()  # a dead letter
        stats = pq.topic_stats("orders")
        gets = Gets(open_store(load_config(queue_config)))
        clock = Clock()
        dashboard = settings(full_refresh=3600)
        with client_for(queue_config, dashboard, store=gets, clock=clock) as client:
            shown = counts_of(client, "orders")
            assert gets.keys.count(batch) == 1  # read once, for its members
            # Messages: the batch holds 100, of which 4 are settled; the consumer may also
            # hold single messages it claimed with the batch (one message each).
            in_flight = 96 + stats.in_flight - 1
            assert (shown["pending"], shown["in_flight"]) == (stats.pending, in_flight)
            assert shown["pending"] + shown["in_flight"] == 96 + 7
            assert (shown["delayed"], shown["dead_letter"]) == (1, 1)
            # Objects beside them: what topic_stats counts.
            objects = (shown["pending_objects"], shown["in_flight_objects"])
            assert objects == (stats.pending, stats.in_flight)
            assert (shown["delayed_objects"], stats.dead_letter) == (stats.delayed, 1)
            page = client.get("/topics/orders").text
            assert f'id="count-in-flight">{in_flight}<' in page
            assert f"{stats.in_flight} object" in page
            # Read again: the batch object is not (its members never change).
            reads = gets.keys.count(batch)  # the page's peek read it too
            clock.advance(dashboard.refresh)
            assert counts_of(client, "orders")["in_flight"] == in_flight
            assert gets.keys.count(batch) == reads
        consumer.release_all()


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
        "/schedules",
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


def test_counts_are_never_older_than_the_refresh_interval(queue_config: dict[str, Any]) -> None:
    """Acks send no change signal: what a page shows is read again once it is a refresh
    interval old, not at the next full refresh."""
    clock = Clock()
    dashboard = settings(refresh=1.0, full_refresh=3600)
    queue_config["polling"] = {**queue_config["polling"], "max_messages_per_poll": 5}
    with SyncPawnQueue.from_config(queue_config) as pq:
        pq.create_topic("orders", claims="message")
        producer = pq.register_producer("checkout")
        for n in range(31):
            producer.publish("orders", {"n": n})
        with client_for(queue_config, dashboard, clock=clock) as client:
            assert counts_of(client, "orders")["pending"] == 31
            consumer = pq.register_consumer("billing", ["orders"])
            for _ in range(3):
                for message in consumer.poll():
                    message.ack()
            head = pq.peek("orders", limit=1)[0].id
            clock.advance(dashboard.refresh)
            page = client.get("/topics/orders").text
            assert 'id="count-pending">16<' in page
            assert page.index(head) > page.index('id="head"')  # the same read as the head
            # The page's script asks /api/state every refresh interval: that reads too.
            version = client.get("/api/state").json()["version"]
            for message in consumer.poll():
                message.ack()
            clock.advance(dashboard.refresh)
            state = client.get("/api/state", params={"page": "/topics/orders"}).json()
            assert state["version"] > version
            assert counts_of(client, "orders")["pending"] == 11


def test_dead_letters_present_at_start_are_a_problem(fs_config: dict[str, Any]) -> None:
    with SyncPawnQueue.from_config(fs_config) as pq:
        dead_letter(pq, "orders", 2)
        pq.create_topic("quiet")
    with client_for(fs_config, settings(full_refresh=3600)) as client:
        rows = {row["topic"]: row for row in client.get("/api/topics").json()}
        assert rows["orders"]["problems"] == ["2 dead letters"]
        assert rows["quiet"]["problems"] == []
        page = client.get("/").text
        assert re.search(r'<tr data-topic="orders" class="problem">', page)
        assert re.search(r'<tr data-topic="quiet" class="">', page)


def test_a_new_topic_shows_at_the_next_refresh(fs_config: dict[str, Any]) -> None:
    clock = Clock()
    dashboard = settings(refresh=1.0, full_refresh=3600)
    with client_for(fs_config, dashboard, clock=clock) as client:
        assert client.get("/api/topics").json() == []
        with SyncPawnQueue.from_config(fs_config) as pq:
            pq.create_topic("fresh")
            pq.register_producer("checkout").publish("fresh", {"n": 1})
            pq.create_topic("other")
        # Its page answers at once: the dashboard looks for a topic it does not know.
        page = client.get("/topics/fresh")
        assert page.status_code == 200 and 'id="count-pending">1<' in page.text
        assert client.get("/topics/nope").status_code == 404
        clock.advance(dashboard.refresh)
        assert [row["topic"] for row in client.get("/api/topics").json()] == ["fresh", "other"]
        assert 'data-topic="other"' in client.get("/").text


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
    assert any(
        "action=redrive topic=orders subscription=- dead_letters=1" in line for line in logged
    )
    assert any("action=purge topic=orders subscription=- dead_letters=2" in line for line in logged)


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
            await asyncio.sleep(0.5)  # the first look at the signals (a HEAD, and a GET)
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
        await pq.create_topic("orders", claims="message")
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
