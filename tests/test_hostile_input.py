"""Hostile names and payloads on every store: refused at the boundary with a clear error
that shows the value safely, and nothing written; valid unicode names work end to end."""

from __future__ import annotations

import asyncio
import math
import reprlib
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pawn_queue import ArgumentError, ConfigError, PawnQueue, PayloadError, PublishError
from pawn_queue.cli import app
from pawn_queue.store.base import Store

BAD_NAMES = [
    "",
    "x" * 10_000,
    "..",
    ".",
    "/",
    "a/b",
    "a/",
    "\\",
    "a\\b",
    "a\x00b",
    "a\nb",
    "abc\n",  # a trailing newline slipped past a "$"-anchored pattern
    "a\x7fb",
    "a\tb",
    "a b",
    "-x",
    "a..b",
    "a\uff0fb",  # fullwidth solidus
    "a\u2215b",  # division slash
    "\u2024\u2024",  # one-dot leaders, NFKC "..": a lookalike of the parent directory
    "x\u2024\u2024",
    "\uff4frders",  # fullwidth "o": NFKC gives "orders"
    "a\u202eb",  # right-to-left override
    "a\u200db",  # zero-width joiner
    "\u3164",  # Hangul filler: a letter that shows nothing
    "a\u0338",  # combining long solidus overlay
    "\u0301a",  # a combining mark with nothing to join
    "a\udc80",  # a lone surrogate: not UTF-8
    "\u6ce8" * 81,  # 81 characters, 243 bytes of UTF-8
    "_registry",
    "_notify",
    "_spark",
    "_probe",
    "_x",
    ".topic",
    ".x",
]
NOT_STRINGS: list[Any] = [None, 5, b"x", ["a"], {"a": 1}, 1.5]
UNICODE_TOPICS = ["заказы", "注文", "naïve", "हिन्दी"]


async def store_state(pq: PawnQueue, tmp_path: Path) -> tuple[object, ...]:
    """Everything a write could change: every key and etag, and on disk every path."""
    listing = sorted((m.key, m.etag) for m in await pq.store.list(""))
    return listing, await asyncio.to_thread(paths_under, tmp_path)


def paths_under(directory: Path) -> list[str]:
    return sorted(str(p) for p in directory.rglob("*") if ".pawnqueue" not in p.parts)


def check_message(error: BaseException, bad: object) -> None:
    """One short printable line that shows the bad value escaped (repr), never raw."""
    text = str(error)
    assert text.isprintable(), text
    assert len(text) < 400, len(text)
    if not isinstance(bad, str):
        assert reprlib.repr(bad) in text, text
    elif bad:
        assert repr(bad if len(bad) <= 40 else bad[:40] + "...") in text, text


async def test_bad_names_are_refused_and_write_nothing(pq: PawnQueue, tmp_path: Path) -> None:
    await pq.create_topic("good")
    producer = await pq.register_producer("p")
    await pq.register_consumer("c", topics=["good"])
    before = await store_state(pq, tmp_path)

    def operations(bad: Any) -> list[Callable[[], Awaitable[object]]]:
        return [
            lambda: pq.create_topic(bad),
            lambda: pq.delete_topic(bad),
            lambda: pq.topic_stats(bad),
            lambda: pq.dead_letters(bad),
            lambda: pq.purge_dead_letters(bad),
            lambda: pq.redrive(bad),
            lambda: pq.register_producer(bad),
            lambda: pq.register_consumer(bad, topics=["good"]),
            lambda: pq.register_consumer("c2", topics=[bad]),
            lambda: pq.register_consumer("c2", topics=["good", bad]),
            lambda: producer.publish(bad, {"a": 1}),
            lambda: producer.publish_batch(bad, [1, 2]),
            lambda: pq.concurrency_limit(bad, 1).__aenter__(),  # raises at the call
        ]

    for bad in [*BAD_NAMES, *NOT_STRINGS]:
        for operation in operations(bad):
            with pytest.raises(ConfigError) as info:
                await operation()
            check_message(info.value, bad)
    for topics in ("good", b"good", 5, None, [], {"good": 1}):
        with pytest.raises(ArgumentError):
            await pq.register_consumer("c3", topics=topics)  # type: ignore[arg-type]
    for ids in ("abc", b"abc", 5, [5], [None], [["a"]]):
        with pytest.raises(ArgumentError) as info:
            await pq.redrive("good", ids=ids)  # type: ignore[arg-type]
        check_message(info.value, ids)
    assert await store_state(pq, tmp_path) == before


async def test_unicode_names_work_end_to_end(pq: PawnQueue) -> None:
    for topic in UNICODE_TOPICS:
        await pq.create_topic(topic)
    assert await pq.list_topics() == sorted(UNICODE_TOPICS)
    producer = await pq.register_producer("производитель")
    consumer = await pq.register_consumer("消費者", topics=UNICODE_TOPICS)
    assert (await pq.register_producer("производитель")).id == producer.id
    names = [e.name for e in await pq.registry.list("consumers")]
    assert names == ["消費者"]
    sent = {}
    for topic in UNICODE_TOPICS:
        sent[await producer.publish(topic, {"topic": topic}, attributes={"ключ": topic})] = topic
    got: dict[str, str] = {}
    async with asyncio.timeout(30):
        while len(got) < len(sent):
            for message in await consumer.poll():
                assert message.payload == {"topic": message.topic}
                assert message.attributes == {"ключ": message.topic}
                got[message.id] = message.topic
                if message.topic == "注文":
                    await message.nack()
                else:
                    await message.ack()
    assert got == sent
    [letter] = await pq.dead_letters("注文")
    assert letter.topic == "注文" and letter.reason == "nack"
    assert (await pq.topic_stats("注文")).dead_letter == 1
    assert await pq.redrive("注文") == 1
    again = await consumer.poll(wait=30)
    assert [m.topic for m in again] == ["注文"]
    await again[0].ack()
    for topic in UNICODE_TOPICS:
        await pq.delete_topic(topic)
    assert await pq.list_topics() == []
    assert [m.key for m in await pq.store.list("") if not m.key.startswith("_")] == []


def nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_dicts(depth: int) -> object:
    value: object = {}
    for _ in range(depth):
        value = {"k": value}
    return value


BAD_PAYLOADS: list[Any] = [
    object(),
    {1, 2},
    frozenset(),
    datetime.now(UTC),
    {"when": datetime.now(UTC)},
    math.nan,
    math.inf,
    -math.inf,
    {"x": [1.0, math.nan]},
    nested(100_000),
    nested_dicts(100_000),
    {(1, 2): "tuple key"},
    Path("/etc/passwd"),
    1j,
]
BAD_ATTRIBUTES: list[Any] = [
    {"k": 1},
    {"k": None},
    {"k": b"v"},
    {1: "v"},
    {None: "v"},
    [("k", "v")],
    "k=v",
    {"k": ["v"]},
]


async def test_bad_payloads_are_refused_and_write_nothing(pq: PawnQueue, tmp_path: Path) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    before = await store_state(pq, tmp_path)
    for payload in BAD_PAYLOADS:
        with pytest.raises(PayloadError) as info:
            await producer.publish("t", payload)
        assert isinstance(info.value, PublishError) and isinstance(info.value, TypeError)
        assert "JSON" in str(info.value) and len(str(info.value)) < 400
        with pytest.raises(PayloadError):  # one bad member: the whole batch is refused
            await producer.publish_batch("t", [{"ok": 1}, payload, {"ok": 2}])
    deep = await _raised(producer.publish("t", nested(100_000)))
    assert "nested too deeply" in str(deep) and deep.__cause__ is None
    assert "RecursionError" not in "".join(traceback.format_exception(deep))
    for attributes in BAD_ATTRIBUTES:
        with pytest.raises(PayloadError):
            await producer.publish("t", {"ok": 1}, attributes=attributes)
        with pytest.raises(PayloadError):
            await producer.publish_batch("t", [{"ok": 1}], attributes=attributes)
    for options in ({"group": ""}, {"group": 5}, {"dedup_id": ""}, {"dedup_id": b"d"}):
        with pytest.raises(ArgumentError):
            await producer.publish("t", {"ok": 1}, **options)
    for delay in (-1, math.nan, "5", math.inf, 1e13):  # 1e13 s ends after the year 9999
        with pytest.raises(ArgumentError):
            await producer.publish("t", {"ok": 1}, delay=delay)
    assert await store_state(pq, tmp_path) == before


async def _raised(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except PayloadError as exc:
        return exc
    raise AssertionError("no PayloadError")


# Payloads that must come back exactly as published (JSON values, and bytes).
ROUND_TRIP: list[Any] = [
    None,
    "",
    "text with \u202e and \x00 and \ud7ff",
    0,
    False,
    2**70,
    -1.5e308,
    [],
    {},
    {"заказ": ["注文", {"": None}]},
    nested(200),
    b"",
    b"\x00\xffPQB1\n{not a header",
    bytearray(b"\x01\x02"),
]


async def test_edge_payloads_round_trip(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["t"])
    ids = [await producer.publish("t", payload) for payload in ROUND_TRIP]
    received: dict[str, object] = {}
    async with asyncio.timeout(30):
        while len(received) < len(ids):
            for message in await consumer.poll():
                received[message.id] = message.payload
                await message.ack()
    # A consumer's own numbers are checked as well: a lease expiry must stay a time.
    await producer.publish("t", {"last": True})
    last = await consumer.poll(wait=30)
    for bad in (math.inf, math.nan, -1.0, 1e13):
        with pytest.raises(ArgumentError):
            await last[0].nack(requeue=True, delay=bad)
        with pytest.raises(ArgumentError):
            await last[0].extend(bad)
    await last[0].ack()
    for message_id, payload in zip(ids, ROUND_TRIP, strict=True):
        expected = bytes(payload) if isinstance(payload, bytearray) else payload
        assert received[message_id] == expected, payload
        assert type(received[message_id]) is type(expected)
    assert await pq.dead_letters("t") == []


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "a/b", "a\u202eb", "_registry", "\uff4frders", "a\x00b"])
def test_cli_refuses_bad_names_in_one_line(tmp_path: Path, bad: str) -> None:
    url = f"file://{tmp_path / 'queue'}"
    runner = CliRunner()
    assert runner.invoke(app, ["--url", url, "topics", "create", "good"]).exit_code == 0
    before = paths_under(tmp_path)  # lock files are left out: every command's probe takes one
    commands = [
        ["topics", "create", bad],
        ["topics", "stats", bad],
        ["publish", bad, "1"],
        ["consume", bad, "--count", "1"],
        ["peek", bad],
        ["dlq", "list", bad],
        ["dlq", "redrive", bad],
        ["dlq", "purge", "--yes", bad],
    ]
    for command in commands:
        result = runner.invoke(app, ["--url", url, *command])
        assert result.exit_code == 2, (command, result.stdout, result.stderr)  # refused
        assert result.stderr.startswith("error: topic name"), (command, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert bad not in result.stderr or bad.isprintable()
    for command in (["dlq", "show", "good", bad], ["dlq", "redrive", "good", "--id", bad]):
        result = runner.invoke(app, ["--url", url, *command])  # an id is compared, never a key
        assert result.exit_code == 1, result.stderr  # no dead letter has that id
        assert "Traceback" not in result.stderr
    assert paths_under(tmp_path) == before


async def test_store_keys_with_unicode_names(store: Store) -> None:
    """The keys unicode names make are stored, listed in order and read back on every store."""
    keys = sorted(f"{t}/messages/k.json" for t in UNICODE_TOPICS)
    for key in keys:
        await store.put(key, key.encode())
    assert [m.key for m in await store.list("")] == keys
    for key in keys:
        assert (await store.get(key)).data == key.encode()
        assert [m.key for m in await store.list(key.split("/")[0] + "/")] == [key]
