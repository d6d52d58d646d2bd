"""A local directory is created by the first write, never by opening it or reading it: a
mistyped path is refused by name instead of becoming a new empty queue."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from pawn_queue import PawnQueue, TopicNotFoundError
from pawn_queue.cli import app
from pawn_queue.exceptions import BucketNotFound, NotFound, RootNotFound
from pawn_queue.store.filesystem import FilesystemStore
from tests.helpers.support import mode_of, poll_count
from tests.servers.seaweedfs import SeaweedFS

# -- the store ------------------------------------------------------------------------------


async def test_reads_of_a_missing_root_name_it_and_nothing_creates_it(tmp_path: Path) -> None:
    root = tmp_path / "typo" / "deep" / "queue"
    store = FilesystemStore(root)
    try:
        reads: list[Callable[[], Awaitable[object]]] = [
            lambda: store.get("t/.topic"),
            lambda: store.head("t/.topic"),
            lambda: store.list(),
            lambda: store.list("t/messages/"),
            lambda: store.list("", limit=1),
        ]
        for read in reads:
            with pytest.raises(RootNotFound, match=f"store root {root} does not exist"):
                await read()
        # Nothing there to delete, as with any missing key.
        await store.delete("t/.topic")
        await store.delete_many(["a", "b/c"])
        # A missing key in a store that does not exist yet: callers that read before their
        # first write (a registration) see a missing key, as in an empty store.
        with pytest.raises(NotFound):
            await store.get("_registry/names/producers/p.json")
    finally:
        await store.close()
    assert not (tmp_path / "typo").exists()


async def test_the_first_write_creates_the_root_and_its_parents(tmp_path: Path) -> None:
    root = tmp_path / "new" / "deep" / "queue"
    store = FilesystemStore(root)
    try:
        await store.put("t/.topic", b"{}", "create")
        assert root.is_dir() and mode_of(root) == 0o700
        assert (await store.get("t/.topic")).data == b"{}"
        assert [m.key for m in await store.list()] == ["t/.topic"]
    finally:
        await store.close()


async def test_an_existing_root_is_only_read_by_reads(tmp_path: Path) -> None:
    """Listing a prefix nobody wrote under is normal (a topic without messages): empty, not
    an error. Reads of an existing root write nothing there, not even ``.pawnqueue/``."""
    root = tmp_path / "queue"
    root.mkdir()
    store = FilesystemStore(root)
    try:
        assert await store.list() == []
        assert await store.list("t/messages/") == []
        assert await store.list("t/messages/", start_after="t/messages/a", limit=5) == []
        with pytest.raises(NotFound) as info:
            await store.get("t/.topic")
        assert not isinstance(info.value, BucketNotFound)
        assert list(root.iterdir()) == []
        await store.delete("t/.topic")  # a delete may prepare the store: the root exists
    finally:
        await store.close()


async def test_a_root_that_is_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"not a directory")
    store = FilesystemStore(tmp_path / "file")
    try:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.get("k"),
            lambda: store.list(),
            lambda: store.put("k", b"x"),
        ]
        for call in calls:
            with pytest.raises(BucketNotFound, match="is not a directory") as info:
                await call()
            assert not isinstance(info.value, NotFound)
    finally:
        await store.close()
    assert (tmp_path / "file").read_bytes() == b"not a directory"


def _first_write(root: str, n: int, barrier: multiprocessing.synchronize.Barrier) -> None:
    async def main() -> None:
        store = FilesystemStore(root)
        try:
            await store.put(f"t/messages/{n}.json", b"x", "create")
        finally:
            await store.close()

    barrier.wait(30)
    asyncio.run(main())


def test_processes_creating_the_root_at_once_all_succeed(tmp_path: Path) -> None:
    root = str(tmp_path / "a" / "b" / "queue")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(6)
    workers = [context.Process(target=_first_write, args=(root, n, barrier)) for n in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0] * 6
    assert sorted(os.listdir(f"{root}/t/messages")) == [f"{n}.json" for n in range(6)]


# -- the queue ------------------------------------------------------------------------------


async def test_setup_writes_nothing_and_reads_refuse_a_missing_directory(tmp_path: Path) -> None:
    root = tmp_path / "typo" / "queue"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        assert pq.strategy == "conditional_write"  # known for a local directory: no probe
        with pytest.raises(RootNotFound, match=str(root)):
            await pq.list_topics()
        with pytest.raises(RootNotFound, match=str(root)):
            await pq.registry.list("consumers")
        # As before: an unknown topic, whether or not the directory exists yet.
        with pytest.raises(TopicNotFoundError):
            await pq.register_consumer("c", topics=["orders"])
        with pytest.raises(TopicNotFoundError):
            await pq.topic_stats("orders")
        with pytest.raises(TopicNotFoundError):
            await pq.dead_letters("orders")
    assert not (tmp_path / "typo").exists()


async def test_the_first_write_creates_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "fresh" / "queue"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        producer = await pq.register_producer("p")  # registration is a write
        assert root.is_dir()
        await pq.create_topic("orders")
        await producer.publish("orders", {"n": 1})
        assert await pq.list_topics() == ["orders"]
        consumer = await pq.register_consumer("c", topics=["orders"])
        [message] = await poll_count(consumer, 1)
        await message.ack()
    assert not (root / "_probe").exists()


async def test_a_consumer_registers_on_a_fresh_directory(tmp_path: Path) -> None:
    """A consumer may start before any producer: registering creates the directory."""
    root = tmp_path / "fresh"
    async with PawnQueue.from_url(f"file://{root}") as pq:
        await pq.register_producer("first")
        assert [e.name for e in await pq.registry.list("producers")] == ["first"]


# -- the command line -----------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    clean = {name: None for name in os.environ if name.startswith("PAWNQUEUE_")}
    return CliRunner().invoke(app, list(args), env={**clean, **(env or {})})


# Fixed, not random: every test worker must collect the same test ids.
MISSING_ID = "0b7e5a52-2d1c-4c39-9a62-6d2f2d0e5a11"
READ_ONLY = [
    ["topics", "list"],
    ["--json", "topics", "list"],
    ["topics", "stats"],
    ["topics", "stats", "orders"],
    ["topics", "show", "orders"],
    ["peek", "orders"],
    ["consume", "orders", "--wait", "0"],
    ["dlq", "list", "orders"],
    ["dlq", "show", "orders", MISSING_ID],
    ["consumers"],
    ["producers"],
]


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_read_only_commands_refuse_a_missing_directory(tmp_path: Path, command: list[str]) -> None:
    root = tmp_path / "nonexistent" / "deep" / "dir"
    result = cli("--url", f"file://{root}", *command)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr == f"error: store root {root} does not exist\n"
    assert result.stdout == ""
    assert not (tmp_path / "nonexistent").exists()


def test_read_only_commands_refuse_a_file_as_the_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = cli("--url", f"file://{tmp_path / 'file'}", "consume", "orders", "--wait", "0")
    assert result.exit_code == 1
    assert result.stderr == f"error: store root {tmp_path / 'file'} is not a directory\n"
    assert (tmp_path / "file").read_text() == "x"


def test_a_write_command_creates_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "new" / "queue"
    url = f"file://{root}"
    assert cli("--url", url, "topics", "create", "orders").exit_code == 0
    assert root.is_dir()
    listed = cli("--url", url, "topics", "list")
    assert listed.exit_code == 0 and listed.stdout.split() == ["orders"]
    assert cli("--url", url, "consume", "orders", "--wait", "0").exit_code == 0
    assert not (root / "_probe").exists()


def test_a_missing_bucket_is_named(seaweedfs: SeaweedFS) -> None:
    bucket = f"nobucket-{uuid.uuid4().hex[:12]}"
    env = {"PAWNQUEUE_S3_ACCESS_KEY": "test-access-key", "PAWNQUEUE_S3_SECRET_KEY": "secret-x9"}
    for command in (["topics", "list"], ["consume", "orders", "--wait", "0"]):
        result = cli("--url", f"s3://{bucket}?endpoint_url={seaweedfs.endpoint}", *command, env=env)
        assert result.exit_code == 1, (result.stdout, result.stderr)
        [line] = result.stderr.splitlines()
        assert line.startswith("error: ") and bucket in line
        assert "secret-x9" not in result.stderr
