"""Schedules an App declares (``@app.schedule``): checked at declaration with the library's
errors, created at start, checked against an existing one (another definition stops the
start, a pause is left alone), their ticks handled by the decorated function, and the
runner served beside the subscribers (a crash of it is logged, it starts again, the
handlers go on). Worker processes running them: tests/cli/test_worker_schedules.py."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from pawn_queue import (
    App,
    ArgumentError,
    ConfigError,
    Message,
    PawnQueue,
    PawnQueueError,
    PayloadError,
    ScheduleExistsError,
    TopicNotFoundError,
)
from pawn_queue.testing import TestClient


def nightly(app: App, **changes: Any) -> None:
    """Declare the schedule ``nightly`` (``changes`` replace its options)."""
    options: dict[str, Any] = {
        "topic": "reports",
        "cron": "0 2 * * *",
        "payload": ("sales", 2),  # a tuple: the store keeps a list
        "attributes": {"team": "ops"},
        "timezone": "Europe/Berlin",
        "jitter_seconds": 5,
        **changes,
    }
    app.schedule("nightly", **options)


def report_app(queue_config: dict[str, Any], **changes: Any) -> App:
    app = App(queue_config, name="reports", create_topics=True)
    nightly(app, **changes)

    @app.subscriber("reports")
    async def report(payload: Any) -> None:
        pass

    return app


@asynccontextmanager
async def started(app: App) -> AsyncIterator[App]:
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def test_declared_schedules_are_created_at_start_and_checked_at_each_start(
    queue_config: dict[str, Any],
) -> None:
    async with started(report_app(queue_config)):
        pass
    async with await PawnQueue.from_config(queue_config) as pq:
        created = await pq.schedule("nightly")
        assert (created.topic, created.cron, created.every) == ("reports", "0 2 * * *", None)
        assert created.payload == ["sales", 2] and created.attributes == {"team": "ops"}
        assert (created.timezone, created.jitter_seconds, created.paused) == (
            "Europe/Berlin",
            5.0,
            False,
        )

        # Started again as declared: nothing written (the definition keeps its etag), and a
        # pause by an operator is the operator's.
        await pq.pause_schedule("nightly")
        etag = (await pq.store.head("_schedules/nightly.json")).etag
        async with started(report_app(queue_config)):
            pass
        assert (await pq.store.head("_schedules/nightly.json")).etag == etag
        assert (await pq.schedule("nightly")).paused

        # Declared otherwise: the app does not start, and the stored schedule is kept.
        changed = report_app(queue_config, cron="0 3 * * *", payload=None)
        with pytest.raises(ScheduleExistsError) as info:
            await changed.start()
        message = str(info.value)
        assert "schedule 'nightly' exists with another definition" in message
        assert "cron is '0 2 * * *', declared '0 3 * * *'" in message
        assert "payload is ['sales', 2], declared None" in message
        assert "timezone" not in message and "update_schedule" in message
        with pytest.raises(PawnQueueError, match="not started"):
            _ = changed.queue
        assert (await pq.schedule("nightly")).cron == "0 2 * * *"
        assert (await pq.store.head("_schedules/nightly.json")).etag == etag


async def test_a_schedule_s_topic_must_exist_unless_the_app_creates_topics(
    queue_config: dict[str, Any],
) -> None:
    app = report_app(queue_config)
    app.create_topics = False
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("orders")  # the store exists; its topic reports does not
        with pytest.raises(TopicNotFoundError, match="reports"):
            await app.start()
        assert await pq.list_schedules() == []


async def test_a_schedule_s_topic_with_too_short_a_dedup_window_stops_the_start(
    queue_config: dict[str, Any],
) -> None:
    """Refused as create_schedule refuses it: its runners could not tell a tick published
    from a lost one (60 s of catch-up + 5 s of jitter + 20 s needed, the topic keeps 0)."""
    app = report_app(queue_config)
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("reports", dedup_window_seconds=0)
        with pytest.raises(ArgumentError, match=r"dedup_window_seconds 0 .*under the 85"):
            await app.start()
        assert await pq.list_schedules() == []


async def test_two_apps_starting_at_once_create_one_schedule(
    queue_config: dict[str, Any],
) -> None:
    """What the processes of ``--processes N`` do: one creates it, the others find it."""
    apps = [report_app(queue_config) for _ in range(3)]
    async with await PawnQueue.from_config(queue_config) as pq:
        await pq.create_topic("reports")
        await asyncio.gather(*(app.start() for app in apps))
        try:
            assert [s.name for s in await pq.list_schedules()] == ["nightly"]
        finally:
            await asyncio.gather(*(app.stop() for app in apps))


def test_bad_arguments_raise_the_library_s_errors_at_declaration() -> None:
    app = App("memory://", name="checks")
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"cron": "61 * * * *"}, ArgumentError, "not a cron expression: Bad minute"),
        ({}, ArgumentError, "exactly one of cron"),
        ({"cron": "* * * * *", "every": 60}, ArgumentError, "exactly one of cron"),
        ({"every": 0.5}, ArgumentError, ">= 1"),
        ({"every": math.nan}, ArgumentError, "every: got nan"),
        ({"every": 60, "timezone": "Mars/Olympus"}, ArgumentError, "not a known time zone"),
        ({"every": 60, "jitter_seconds": -1}, ArgumentError, "jitter_seconds"),
        ({"every": 60, "catch_up_seconds": "60"}, ArgumentError, "catch_up_seconds"),
        ({"every": 60, "start": datetime(2026, 1, 1)}, ArgumentError, "timezone-aware"),
        (
            {
                "every": 60,
                "start": datetime(2026, 2, 1, tzinfo=UTC),
                "end": datetime(2026, 1, 1, tzinfo=UTC),
            },
            ArgumentError,
            "must be after start",
        ),
        ({"every": 60, "payload": b"raw"}, PayloadError, "bytes"),
        ({"every": 60, "payload": {"x": math.nan}}, PayloadError, "payload"),
        ({"every": 60, "attributes": {"schedule": "x"}}, PayloadError, "set by the schedule"),
        ({"every": 60, "attributes": {"n": 1}}, PayloadError, "must map str to str"),
        ({"every": 60, "topic": "a/b"}, ConfigError, "topic name"),
        ({"every": 60, "priority": 10}, ArgumentError, "priority: got 10"),
        ({"every": 60, "priority": True}, ArgumentError, "priority: got True"),
        ({"every": 60, "expires_in": 0}, ArgumentError, "expires_in: got 0"),
        ({"every": 60, "expires_in": math.nan}, ArgumentError, "expires_in: got nan"),
    ]
    for options, error, message in bad:
        with pytest.raises(error, match=message):
            app.schedule("s", **{"topic": "t", **options})
    for name in ("", "a/b", "_hidden", 7):
        with pytest.raises(ConfigError, match="schedule name"):
            app.schedule(name, topic="t", every=60)  # type: ignore[arg-type]
    assert app.schedules == ()  # nothing declared by a refused declaration

    app.schedule("s", topic="t", every=60)
    with pytest.raises(ArgumentError, match="already declares a schedule 's'"):
        app.schedule("s", topic="u", every=30)
    with pytest.raises(ArgumentError, match="decorates a function"):
        app.schedule("other", topic="t", every=60)(42)  # type: ignore[type-var]
    assert [s.name for s in app.schedules] == ["s", "other"]


async def test_the_decorated_function_handles_each_tick(queue_config: dict[str, Any]) -> None:
    app = App(queue_config, name="ticks", create_topics=True)
    received: asyncio.Queue[Message] = asyncio.Queue()

    @app.schedule("fast", topic="ticks", every=1, payload={"n": 1}, attributes={"a": "b"})
    async def tick(payload: dict[str, int], message: Message) -> None:
        await received.put(message)

    # Declared beneath @app.subscriber, a function keeps the subscriber it has.
    @app.schedule("slow", topic="other", every=3600)
    @app.subscriber("other", retry=None, concurrency=2)
    def other(payload: Any) -> None:
        pass

    assert [(s.name, s.topics, s.concurrency) for s in app.subscribers] == [
        ("tick", ("ticks",), 8),
        ("other", ("other",), 2),
    ]
    await app.start()
    serving = asyncio.create_task(app.serve())  # declared schedules: served by default
    try:
        async with asyncio.timeout(30):
            messages = [await received.get() for _ in range(2)]
    finally:
        app.stop_consuming()
        await serving
        await app.stop()
    ticks = [m.attributes["schedule_time"] for m in messages]
    assert len(set(ticks)) == 2
    assert all(m.attributes["schedule"] == "fast" and m.attributes["a"] == "b" for m in messages)
    assert all(m.payload == {"n": 1} and m.topic == "ticks" for m in messages)


async def test_the_test_client_creates_schedules_and_a_trigger_reaches_the_handler() -> None:
    app = App(name="shop")
    handled: list[Any] = []

    @app.schedule("nightly", topic="reports", cron="0 2 * * *", payload={"report": "sales"})
    def report(payload: Any) -> None:
        handled.append(payload)

    async with TestClient(app) as client:
        assert (await client.app.queue.schedule("nightly")).topic == "reports"
        await client.app.queue.trigger_schedule("nightly")
        await client.drain()
    assert handled == [{"report": "sales"}]


async def test_a_declared_priority_and_expiry_are_created_compared_and_published(
    queue_config: dict[str, Any],
) -> None:
    async with started(report_app(queue_config, priority=9, expires_in=600)) as app:
        stored = await app.queue.schedule("nightly")
        assert (stored.priority, stored.expires_in) == (9, 600.0)
    # Declared without them: another definition, named in the error.
    with pytest.raises(ScheduleExistsError) as info:
        await report_app(queue_config).start()
    assert "priority is 9, declared 0" in str(info.value)
    assert "expires_in is 600.0, declared None" in str(info.value)

    app = App(name="shop")
    handled: list[Message] = []

    @app.schedule("urgent", topic="alerts", every=3600, priority=9, expires_in=60)
    def alert(message: Message) -> None:
        handled.append(message)

    async with TestClient(app) as client:
        await client.app.queue.trigger_schedule("urgent")
        await client.drain()
    [message] = handled
    assert message.priority == 9 and message.expires_at is not None


async def test_a_crashed_runner_is_logged_and_started_again_while_handlers_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[str] = []
    second_run = asyncio.Event()

    async def run_schedules(self: PawnQueue) -> None:
        runs.append("started")
        if len(runs) == 1:
            raise RuntimeError("runner bug")
        second_run.set()
        try:
            await asyncio.Event().wait()  # runs until cancelled, as the real one
        finally:
            runs.append("stopped")

    monkeypatch.setattr(PawnQueue, "run_schedules", run_schedules)
    app = App("memory://", name="crashy", create_topics=True)
    handled = asyncio.Event()

    @app.subscriber("jobs")
    async def job(payload: Any) -> None:
        handled.set()

    await app.start()
    with pytest.raises(ArgumentError, match="schedules: got 'yes'"):
        await app.serve(schedules="yes")  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="pawn_queue.app"):
        serving = asyncio.create_task(app.serve(schedules=True))
        try:
            async with asyncio.timeout(30):
                await second_run.wait()
                await app.producer.publish("jobs", {"n": 1})
                await handled.wait()
        finally:
            app.stop_consuming()
            await serving
            await app.stop()
    assert runs == ["started", "started", "stopped"]  # stopped with the handlers
    [failed] = [r for r in caplog.records if r.getMessage().startswith("schedule runner failed")]
    assert failed.levelno == logging.ERROR and failed.exc_info is not None
    assert "runner bug" in str(failed.exc_info[1])
    assert "starting it again in 1 s" in failed.getMessage()


async def test_an_app_of_schedules_alone_serves_its_runner(queue_config: dict[str, Any]) -> None:
    with pytest.raises(ArgumentError, match="has no subscriber and no schedule"):
        await App(queue_config, name="empty").start()
    app = App(queue_config, name="timer", create_topics=True)
    app.schedule("beat", topic="beats", every=1)  # declared, no function subscribed
    assert app.subscribers == ()
    await app.start()
    try:
        consumer = await app.queue.register_consumer("reader", ["beats"])
        with pytest.raises(ArgumentError, match="no subscriber, and schedules are off"):
            await app.serve(schedules=False)
        assert not app.consuming
        serving = asyncio.create_task(app.serve())
        try:
            async with asyncio.timeout(30):
                messages: list[Message] = []
                while not messages:
                    messages = await consumer.poll(wait=5)
            assert app.consuming  # the runner runs: a health check says ready
            assert messages[0].attributes["schedule"] == "beat"
        finally:
            app.stop_consuming()
            await serving  # cancelled: returns without an error
        assert not app.consuming
    finally:
        await app.stop()


async def test_an_app_of_schedules_alone_raises_where_schedules_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def run_schedules(self: PawnQueue) -> None:
        raise ConfigError("schedules need conditional writes")

    monkeypatch.setattr(PawnQueue, "run_schedules", run_schedules)
    app = App("memory://", name="timer", create_topics=True)
    app.schedule("beat", topic="beats", every=60)
    async with started(app):
        with pytest.raises(ConfigError, match="need conditional writes"):
            await app.serve()
