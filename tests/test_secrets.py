"""Credentials never show: not in log records of any logger at any level, not in reprs, not in
errors, their ``__cause__``/``__context__`` chains or tracebacks, not in the command line's
output. Against a SeaweedFS whose identities check them, so wrong ones really fail."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pawn_queue import ConfigError, PawnQueue, PawnQueueConfig, PawnQueueError
from pawn_queue import sync as blocking
from pawn_queue.config import S3Config
from pawn_queue.exceptions import AccessDenied, BucketNotFound, PublishError, StoreUnavailable
from pawn_queue.store.s3 import S3Store
from tests.servers.seaweedfs import SeaweedFS

ACCESS = "AKIAPQSECRETLEAK1234"
SECRET = "pq-secret-DO-NOT-LEAK-9f8e7d6c5b4a"
TOKEN = "pq-token-DO-NOT-LEAK-0a1b2c3d"
WRONG = "pq-wrong-DO-NOT-LEAK-77aa0e"
# Fragments too: a truncated or partly masked secret is still a leak.
MARKERS = (ACCESS, SECRET, TOKEN, WRONG, "DO-NOT-LEAK", "SECRETLEAK")
BUCKET = "secrets-bucket"


def leaked(text: str) -> list[str]:
    return [marker for marker in MARKERS if marker in text]


def check_error(error: BaseException) -> None:
    """Our error, and nothing along its chain or in its traceback shows a secret."""
    assert isinstance(error, PawnQueueError), type(error)
    seen: BaseException | None = error
    while seen is not None:  # suppressed contexts too: tools walk them
        assert not leaked(str(seen)) and not leaked(repr(seen)), (type(seen), str(seen))
        assert "Signature=" not in str(seen) and "Credential=" not in str(seen)
        seen = seen.__cause__ or seen.__context__
    assert not leaked("".join(traceback.format_exception(error)))


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    data_dir = tmp_path_factory.mktemp("seaweedfs-secrets")
    identity = {"accessKey": ACCESS, "secretKey": SECRET}
    actions = ["Admin", "Read", "Write", "List", "Tagging"]
    config = {"identities": [{"name": "admin", "credentials": [identity], "actions": actions}]}
    (data_dir / "s3.json").write_text(json.dumps(config))
    server = SeaweedFS.start(data_dir / "data", s3_config=data_dir / "s3.json")
    try:
        server.create_bucket(BUCKET, ACCESS, SECRET)
        yield server
    finally:
        server.stop()


def s3_section(endpoint: str, secret: str = SECRET, **extra: Any) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "bucket_name": BUCKET,
        "prefix": f"p{os.urandom(4).hex()}",
        "aws_access_key_id": ACCESS,
        "aws_secret_access_key": secret,
        "max_retries": 0,
        "connect_timeout_seconds": 2,
        "request_timeout_seconds": 5,
        **extra,
    }


def config(endpoint: str, secret: str = SECRET, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "s3",
        "s3": s3_section(endpoint, secret, **extra),
        "polling": {
            "interval_seconds": 0.05,
            "visibility_timeout_seconds": 5.0,
            "lease_refresh_interval_seconds": 1.0,
        },
        "registry": {"heartbeat_interval_seconds": 0.05},
    }


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SetOnMessage(logging.Handler):
    """Sets ``event`` when a record's message starts with ``prefix``."""

    def __init__(self, prefix: str, event: asyncio.Event) -> None:
        super().__init__(logging.DEBUG)
        self.prefix, self.event = prefix, event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """Every record of every logger, DEBUG and up: caplog, and a handler of our own on the
    root with every logger set to propagate (the command line turns that off)."""
    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    saved = [(lg, lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
        lg.propagate = True
    handler = Keep(logging.DEBUG)
    logging.root.addHandler(handler)
    caplog.set_level(logging.DEBUG)
    try:
        yield kept
    finally:
        logging.root.removeHandler(handler)
        for lg, level, propagate in saved:
            lg.setLevel(level)
            lg.propagate = propagate
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    everything = "\n".join(formatter.format(r) for r in kept) + caplog.text
    assert not leaked(everything)
    # The S3 client logs through Rust (nothing reaches Python logging): only ours and asyncio.
    assert {r.name.split(".")[0] for r in kept} <= {"pawn_queue", "asyncio"}


async def test_a_queue_life_with_failures_logs_no_secret(
    auth_server: SeaweedFS,
    records: list[logging.LogRecord],
    capfd: pytest.CaptureFixture[str],
) -> None:
    good = config(auth_server.endpoint)
    async with await PawnQueue.from_config(good) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", topics=["t"])
        await producer.publish("t", {"n": 1}, attributes={"a": "b"})
        await producer.publish_batch("t", [2, 3])
        for message in await consumer.poll(wait=10):
            await (message.nack() if message.payload == 2 else message.ack())
        assert await pq.redrive("t") == 1
        await pq.topic_stats("t")
        await pq.registry.heartbeat()
        # The same queue, now signing with a wrong secret (its client swapped under it): real
        # 403s in the middle of work.
        wrong = S3Store(
            S3Config(**s3_section(auth_server.endpoint, WRONG, aws_session_token=TOKEN))
        )
        pq.store.inner._store = wrong._store  # type: ignore[attr-defined]
        with pytest.raises(PublishError) as info:
            await producer.publish("t", {"n": 4})
        assert isinstance(info.value.__cause__, AccessDenied)
        check_error(info.value)
        failed = asyncio.Event()

        async def handler(message: object) -> None:
            raise AssertionError("nothing can be delivered")

        watcher = SetOnMessage("poll failed", failed)
        logging.root.addHandler(watcher)
        listener = asyncio.create_task(consumer.listen(handler))
        try:
            async with asyncio.timeout(30):
                await failed.wait()  # the listen loop logged a real store error and goes on
            assert not listener.done()
            await pq.registry.heartbeat()  # logs "heartbeat failed" with the store error
        finally:
            logging.root.removeHandler(watcher)
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
    assert any("AccessDenied" in r.getMessage() or "403" in r.getMessage() for r in records)
    assert any(r.levelno == logging.DEBUG and r.name.startswith("pawn_queue") for r in records)
    out, err = capfd.readouterr()  # anything written straight to the file descriptors
    assert not leaked(out + err)


async def test_reprs_show_no_secret(auth_server: SeaweedFS) -> None:
    good = config(auth_server.endpoint, aws_session_token=TOKEN)
    objects: list[object] = []
    pq = await PawnQueue.from_config(config(auth_server.endpoint))
    async with pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", topics=["t"])
        await producer.publish("t", {"n": 1})
        [message] = await consumer.poll(wait=10)
        await message.nack()
        objects += [pq, pq.store, vars(pq.store), pq.store.inner._store, vars(pq)]  # type: ignore[attr-defined]
        objects += [producer, consumer, message, await pq.dead_letters("t")]
        objects += [await pq.registry.list("producers"), await pq.topic_stats("t")]
    loaded = PawnQueueConfig.from_dict(good)
    objects += [loaded, loaded.s3, loaded.model_dump(), vars(loaded.s3)]
    objects += [S3Store(loaded.s3), vars(S3Store(loaded.s3))]  # type: ignore[arg-type]
    with blocking.PawnQueue.from_config(config(auth_server.endpoint)) as queue:
        queue.create_topic("u")
        blocking_producer = queue.register_producer("bp")
        blocking_producer.publish("u", {"n": 1})
        blocking_consumer = queue.register_consumer("bc", topics=["u"])
        [blocking_message] = blocking_consumer.poll(wait=10)
        blocking_message.ack()
        objects += [queue, blocking_producer, blocking_consumer, blocking_message, vars(queue)]
    for obj in objects:
        assert not leaked(repr(obj)) and not leaked(str(obj)), type(obj)
    assert not leaked(loaded.model_dump_json())
    assert loaded.s3 is not None and loaded.s3.aws_session_token == SecretStr(TOKEN)


async def test_store_errors_and_chains_show_no_secret(auth_server: SeaweedFS) -> None:
    failures: list[tuple[dict[str, Any], type[PawnQueueError]]] = [
        (config(auth_server.endpoint, WRONG), AccessDenied),
        (config(auth_server.endpoint, WRONG, aws_session_token=TOKEN), AccessDenied),
        (config(auth_server.endpoint, aws_session_token=TOKEN), AccessDenied),
        (config(f"http://127.0.0.1:{closed_port()}", aws_session_token=TOKEN), StoreUnavailable),
    ]
    missing = config(auth_server.endpoint)
    missing["s3"]["bucket_name"] = "no-such-bucket-here"
    failures.append((missing, BucketNotFound))
    for data, expected in failures:
        pq = await PawnQueue.from_config(data)
        with pytest.raises(expected) as info:
            await pq.setup()
        check_error(info.value)
    # An endpoint URL with credentials in it: refused by the config, unshown, in every form.
    url = f"http://{ACCESS}:{SECRET}@127.0.0.1:{closed_port()}"
    attempts = [
        lambda: PawnQueueConfig.from_dict(config(url)),
        lambda: S3Config(**s3_section(url)),
        lambda: PawnQueueConfig.from_env(
            {"PAWNQUEUE_S3_ENDPOINT_URL": url, "PAWNQUEUE_S3_BUCKET_NAME": BUCKET}
        ),
        lambda: PawnQueueConfig.from_url(f"s3://{BUCKET}?endpoint_url={url}"),
        lambda: PawnQueueConfig.from_dict(
            {"s3": {**s3_section(url), "aws_secret_access_key": [SECRET]}}
        ),
    ]
    for attempt in attempts:
        with pytest.raises(ConfigError) as refused:
            attempt()
        check_error(refused.value)
    # Built past validation, the store still never prints the URL's user part.
    unchecked = S3Config.model_construct(
        **{**S3Config(**s3_section(auth_server.endpoint)).__dict__, "endpoint_url": url}
    )
    store = S3Store(unchecked)
    assert not leaked(repr(store))
    with pytest.raises(StoreUnavailable) as info:
        await store.get("k")
    check_error(info.value)


def test_environment_credentials_through_the_api_and_the_command_line(
    auth_server: SeaweedFS, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    url = f"s3://{BUCKET}/cli?endpoint_url={auth_server.endpoint}&max_retries=0"
    good = {**env, "PAWNQUEUE_URL": url, "PAWNQUEUE_S3_ACCESS_KEY": ACCESS}
    good["PAWNQUEUE_S3_SECRET_KEY"] = SECRET
    loaded = PawnQueueConfig.from_url(url, environ=good)
    assert loaded.s3 is not None and loaded.s3.aws_secret_access_key == SecretStr(SECRET)
    assert not leaked(repr(loaded))
    with blocking.PawnQueue(loaded) as queue:
        queue.create_topic("t")
    bad = {**good, "PAWNQUEUE_S3_SECRET_KEY": WRONG, "PAWNQUEUE_S3_SESSION_TOKEN": TOKEN}
    runs = [
        (good, ["doctor"], 0),
        (good, ["publish", "t", '{"n": 1}'], 0),
        (good, ["consume", "t", "--count", "1"], 0),
        (bad, ["doctor"], 1),
        (bad, ["topics", "list"], 1),
        (bad, ["publish", "t", '{"n": 1}'], 1),
    ]
    for environ, args, code in runs:
        argv = [sys.executable, "-m", "pawn_queue", "--debug", "--log-level", "debug", *args]
        done = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=120)
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert not leaked(done.stdout + done.stderr), (args, done.stdout, done.stderr)
        if code and args != ["doctor"]:
            assert "Traceback" in done.stderr and "AccessDenied" in done.stderr, done.stderr
