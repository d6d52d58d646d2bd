"""What only the filesystem store promises: containment in its root, its reserved directory,
privacy, durability, collisions, and never following a link."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pawn_queue.exceptions import (
    AlreadyExists,
    BucketNotFound,
    ConfigError,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from pawn_queue.store.base import IfMatch
from pawn_queue.store.filesystem import FilesystemStore
from tests.helpers.support import leftover_temp_files, mode_of


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    store = FilesystemStore(tmp_path / "root")
    try:
        yield store
    finally:
        await store.close()


# -- containment ----------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "../x",
    "/etc/passwd",
    "a/../../x",
    "a/./b",
    "./a",
    "a//b",
    "a/",
    "..",
    ".",
    "a\\b",
    "..\\x",
    "a\x00b",
    "a\nb",
    "a\x7fb",
    "a\x85b",
    ".pawnqueue",
    ".pawnqueue/x",
    ".pawnqueue/locks/00.lock",
    "x" * 256,
    "a/" + "é" * 128,  # 256 bytes of UTF-8 in one segment
    "k/\udc80",  # a lone surrogate: not encodable
    "k/" * 600 + "x",  # over 1,024 bytes
]


def snapshot(directory: Path) -> set[Path]:
    return set(directory.rglob("*"))


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
async def test_invalid_keys_are_rejected(tmp_path: Path, key: str) -> None:
    store = FilesystemStore(tmp_path / "root")
    await store.put("ok", b"x")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError):
        await store.put(key, b"x")
    for mode in ("create", IfMatch('"x"')):
        with pytest.raises(ConfigError):
            await store.put(key, b"x", mode=mode)
    with pytest.raises(ConfigError):
        await store.get(key)
    with pytest.raises(ConfigError):
        await store.head(key)
    with pytest.raises(ConfigError):
        await store.delete(key)
    with pytest.raises(ConfigError):
        await store.delete_many(["ok", key])  # all-or-nothing: "ok" survives
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        await store.get(key)
    await store.close()
    assert snapshot(tmp_path) == before
    assert (tmp_path / "root" / "ok").read_bytes() == b"x"


@pytest.mark.parametrize(
    "key", ["...", "a/..b", "..a", ".hidden", "a b", ".pawnqueue2/x", "x" * 255, "a/" + "é" * 127]
)
async def test_unusual_but_valid_keys(fs: FilesystemStore, key: str) -> None:
    await fs.put(key, b"ok")
    assert (Path(fs.root) / key).read_bytes() == b"ok"
    assert [m.key for m in await fs.list()] == [key]


async def test_escaping_prefixes_list_nothing(fs: FilesystemStore) -> None:
    await fs.put("a/b.json", b"x")
    for prefix in ["../", "/", "/etc/", "a/../", "a/./", "a//", ".pawnqueue/", ".pawnqueue/tmp/"]:
        assert await fs.list(prefix) == [], prefix
    assert [m.key for m in await fs.list(".")] == []
    assert [m.key for m in await fs.list("a/..")] == []


# -- the reserved directory -----------------------------------------------------------------


async def test_internal_files_never_listed(fs: FilesystemStore) -> None:
    root = Path(fs.root)
    await fs.put("k.json", b"x")
    (root / ".pawnqueue" / "tmp" / "crashed-writer.tmp").write_bytes(b"half a message")
    (root / ".pawnqueue" / "stray").write_bytes(b"?")
    (root / "bad\\name").write_bytes(b"no key can name this")
    (root / "link.json").symlink_to(root / "k.json")
    (root / "empty" / "dirs").mkdir(parents=True)
    assert [m.key for m in await fs.list()] == ["k.json"]
    assert [m.key for m in await fs.list(".pawn")] == []
    assert [m.key for m in await fs.list(start_after="")] == ["k.json"]
    with pytest.raises(NotFound):
        await fs.get("link.json")
    with pytest.raises(NotFound):
        await fs.head("link.json")


async def test_stale_temp_files_are_swept_by_the_first_write(tmp_path: Path) -> None:
    root = tmp_path / "root"
    first = FilesystemStore(root)
    await first.put("k", b"x")
    await first.close()
    stale = root / ".pawnqueue" / "tmp" / "stale.tmp"
    fresh = root / ".pawnqueue" / "tmp" / "fresh.tmp"
    stale.write_bytes(b"old")
    fresh.write_bytes(b"maybe a live writer's")
    two_hours_ago = os.stat(stale).st_mtime - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    second = FilesystemStore(root)
    assert stale.exists(), "the constructor must not do I/O"
    assert [m.key for m in await second.list()] == ["k"]
    assert stale.exists(), "a read writes nothing"
    await second.put("k2", b"y")
    assert not stale.exists()
    assert fresh.exists()
    await second.close()


async def test_no_temp_files_left_after_failed_writes(fs: FilesystemStore) -> None:
    etag = await fs.put("k/a.json", b"x", mode="create")
    with pytest.raises(AlreadyExists):
        await fs.put("k/a.json", b"y", mode="create")
    with pytest.raises(PreconditionFailed):
        await fs.put("k/a.json", b"y", mode=IfMatch('"stale"'))
    with pytest.raises(StoreError):
        await fs.put("k/a.json/b", b"y")
    await fs.put("k/a.json", b"z", mode=IfMatch(etag))
    assert leftover_temp_files(Path(fs.root)) == []


# -- durability, privacy, collisions, lifecycle ---------------------------------------------


async def test_put_lands_on_disk_privately(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "root"
    store = FilesystemStore(root)
    assert not root.exists(), "the constructor must not do I/O"
    data = os.urandom(100_000)
    etag = await store.put("a/b/c.json", data, mode="create")
    assert (root / "a" / "b" / "c.json").read_bytes() == data
    assert mode_of(root / "a" / "b" / "c.json") == 0o600
    for directory in [root, root / "a", root / "a" / "b", root / ".pawnqueue"]:
        assert mode_of(directory) == 0o700, directory
    for lock in (root / ".pawnqueue" / "locks").iterdir():
        assert mode_of(lock) == 0o600
    assert (await store.head("a/b/c.json")).etag == etag
    await store.put("a/b/c.json", b"replaced")
    assert (root / "a" / "b" / "c.json").read_bytes() == b"replaced"
    assert mode_of(root / "a" / "b" / "c.json") == 0o600
    await store.close()


async def test_key_and_directory_collisions(fs: FilesystemStore) -> None:
    await fs.put("a/b", b"file under a")
    for mode in ("overwrite", "create", IfMatch('"x"')):
        with pytest.raises(StoreError, match="collides"):
            await fs.put("a", b"would replace a directory", mode=mode)
    for mode in ("overwrite", "create"):
        with pytest.raises(StoreError, match="collides"):
            await fs.put("a/b/c", b"would need a/b to be a directory", mode=mode)
    with pytest.raises(PreconditionFailed):  # as on S3: there is no object at a/b/c
        await fs.put("a/b/c", b"x", mode=IfMatch('"x"'))
    assert (await fs.get("a/b")).data == b"file under a"
    assert [m.key for m in await fs.list()] == ["a/b"]


async def test_missing_root_after_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FilesystemStore(root)
    await store.put("k", b"x")
    shutil.rmtree(root)
    with pytest.raises(BucketNotFound):
        await store.get("k")
    with pytest.raises(BucketNotFound):
        await store.put("k", b"x")
    with pytest.raises(BucketNotFound):
        await store.list()
    assert not root.exists(), "a vanished root (an unmounted volume?) must not be recreated"
    await store.close()


async def test_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "root").write_bytes(b"not a directory")
    store = FilesystemStore(tmp_path / "root")
    with pytest.raises(BucketNotFound):
        await store.get("k")
    await store.close()


async def test_closed_store_refuses_work(fs: FilesystemStore) -> None:
    await fs.put("k", b"x")
    await fs.close()
    with pytest.raises(StoreError, match="closed"):
        await fs.get("k")
    await fs.close()  # idempotent


async def test_large_directory_listing_sees_every_change(tmp_path: Path) -> None:
    """Directories big enough to be indexed still list exactly what is on disk."""
    first, second = FilesystemStore(tmp_path / "r"), FilesystemStore(tmp_path / "r")
    try:
        keys = [f"t/messages/{n:05d}.json" for n in range(700)]
        for key in keys:
            await first.put(key, b"x")
        assert [m.key for m in await first.list("t/messages/")] == keys
        # Another store on the same root, and a file written behind the store's back
        # (as another process would), both show up.
        await second.put("t/messages/00700.json", b"y")
        (tmp_path / "r" / "t" / "messages" / "00701.json").write_bytes(b"z")
        await first.delete("t/messages/00000.json")
        expected = [*keys[1:], "t/messages/00700.json", "t/messages/00701.json"]
        assert [m.key for m in await first.list("t/messages/")] == expected
        assert [m.key for m in await second.list("t/messages/", limit=3)] == expected[:3]
        page = await first.list("t/messages/", start_after="t/messages/00650.json", limit=5)
        assert [m.key for m in page] == expected[650:655]
    finally:
        await first.close()
        await second.close()


async def test_non_durable_put_is_still_atomic_and_conditional(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path / "r")
    try:
        etag = await store.put("t/leases/x.lease", b"1", "create", durable=False)
        with pytest.raises(AlreadyExists):
            await store.put("t/leases/x.lease", b"2", "create", durable=False)
        new = await store.put("t/leases/x.lease", b"3", IfMatch(etag), durable=False)
        assert new != etag
        assert (await store.get("t/leases/x.lease")).data == b"3"
        assert (tmp_path / "r" / "t" / "leases" / "x.lease").read_bytes() == b"3"
    finally:
        await store.close()


# -- symbolic links, FIFOs and the umask ----------------------------------------------------


@pytest.mark.parametrize("linked", ["t", "t/messages"])
async def test_never_follows_a_linked_directory_out_of_the_root(
    tmp_path: Path, linked: str
) -> None:
    outside = tmp_path / "outside"
    (outside / "messages").mkdir(parents=True)
    (outside / "x.json").write_bytes(b"outside")
    (outside / "messages" / "x.json").write_bytes(b"outside")
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    store = FilesystemStore(tmp_path / "root")
    try:
        if linked == "t":  # a root this store prepared (its first write), holding nothing
            await store.put("prepare", b"")
            await store.delete("prepare")
        else:
            await store.put("t/.topic", b"marker")
        (tmp_path / "root" / linked).symlink_to(outside)
        for mode in ("overwrite", "create", IfMatch('"x"')):
            with pytest.raises(StoreError, match="symbolic link"):
                await store.put("t/messages/x.json", b"written through a link", mode=mode)
            with pytest.raises(StoreError, match="symbolic link"):
                await store.put("t/messages/new/deeper.json", b"x", mode=mode)
        with pytest.raises(NotFound):
            await store.get("t/messages/x.json")
        with pytest.raises(NotFound):
            await store.head("t/messages/x.json")
        assert await store.list("t/messages/") == []
        assert await store.list("t/messages/x") == []
        await store.delete("t/messages/x.json")
        await store.delete_many(["t/messages/x.json", "t/x.json"])
        assert [m.key for m in await store.list()] == (["t/.topic"] if linked != "t" else [])
    finally:
        await store.close()
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before


async def test_linked_reserved_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root" / ".pawnqueue").mkdir(parents=True)
    (tmp_path / "root" / ".pawnqueue" / "tmp").symlink_to(outside)
    store = FilesystemStore(tmp_path / "root")
    with pytest.raises(StoreError, match="symbolic link"):
        await store.put("k", b"x")
    await store.close()
    assert list(outside.iterdir()) == []


async def test_a_fifo_at_a_key_never_blocks(fs: FilesystemStore) -> None:
    await fs.put("_registry/names/producers/other.json", b"{}")
    fifo = Path(fs.root) / "_registry" / "names" / "producers" / "p.json"
    os.mkfifo(fifo)
    async with asyncio.timeout(10):  # a blocking open would hang a worker thread forever
        with pytest.raises(NotFound):
            await fs.get("_registry/names/producers/p.json")
        with pytest.raises(NotFound):
            await fs.head("_registry/names/producers/p.json")
        with pytest.raises(StoreError, match="collides"):
            await fs.put("_registry/names/producers/p.json", b"{}", mode="create")
        listed = await fs.list("_registry/")
    assert [m.key for m in listed] == ["_registry/names/producers/other.json"]


@pytest.mark.parametrize("umask", [0o000, 0o077], ids=["umask-000", "umask-077"])
async def test_files_0600_and_directories_0700_under_any_umask(tmp_path: Path, umask: int) -> None:
    from pawn_queue import PawnQueue

    root = tmp_path / "queue"
    previous = os.umask(umask)
    try:
        async with PawnQueue.from_url(f"file://{root}") as pq:
            await pq.create_topic("t")
            producer = await pq.register_producer("p")
            consumer = await pq.register_consumer("c", topics=["t"])
            await producer.publish("t", {"n": 1}, group="g")
            await producer.publish_batch("t", [1, 2])
            await producer.publish("t", b"bytes", delay=3600, dedup_id="d")
            for message in await consumer.poll(wait=10):
                await (message.nack() if message.payload == 1 else message.ack())
            await pq.registry.heartbeat()
    finally:
        os.umask(previous)
    paths = [root, *root.rglob("*")]
    assert len(paths) > 20
    for path in paths:
        expected = 0o700 if path.is_dir() else 0o600
        assert mode_of(path) == expected, (oct(mode_of(path)), path)
    assert {p.parent.name for p in paths} >= {"dead-letter", "messages", "dedup", "locks"}
