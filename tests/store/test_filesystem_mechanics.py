"""The filesystem store's mechanics: what runs on the event loop, stripe locks (held by
others, removed, inherited by a fork), deferred unlinks, temp files and the listing index."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed
from pawn_queue.store.base import IfMatch
from pawn_queue.store.filesystem import FilesystemStore
from tests.helpers.support import leftover_temp_files, mode_of


def stripe_of(key: str) -> int:
    import zlib

    return zlib.crc32(key.encode()) % 256


def hold_stripe_lock(root: Path, key: str) -> int:
    """Take ``key``'s stripe lock as another process would; close the descriptor to release."""
    import fcntl

    path = root / ".pawnqueue" / "locks" / f"{stripe_of(key):02x}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_a_held_lock_never_blocks_the_event_loop(tmp_path: Path) -> None:
    """Deletes and small non-durable puts run on the loop, where a stripe lock is only tried:
    while another writer holds it they wait on a worker thread, and the loop keeps going."""
    root = tmp_path / "root"
    leases = root / "t" / "leases"
    store = FilesystemStore(root)
    locked = "t/leases/a.lease"
    same_stripe = next(
        key
        for key in (f"t/leases/{n}.lease" for n in range(10_000))
        if key != locked and stripe_of(key) == stripe_of(locked)
    )
    try:
        await store.put(locked, b"1", durable=False)
        await store.put("t/leases/b.lease", b"1", durable=False)
        lock = hold_stripe_lock(root, locked)
        try:
            delete = asyncio.create_task(store.delete_many(["t/leases/b.lease", locked]))
            put = asyncio.create_task(store.put(same_stripe, b"2", "create", durable=False))
            ticks = 0
            for _ in range(20):
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks == 20
            assert not delete.done() and not put.done()
            # A key on another stripe went ahead; the locked stripe's keys are untouched.
            assert not (leases / "b.lease").exists()
            assert (leases / "a.lease").read_bytes() == b"1"
            assert not (root / same_stripe).exists()
        finally:
            os.close(lock)
        async with asyncio.timeout(10):
            await delete
            await put
        assert not (leases / "a.lease").exists()
        assert (await store.get(same_stripe)).data == b"2"
    finally:
        await store.close()
    assert leftover_temp_files(root) == []


async def test_a_removed_lock_file_is_not_trusted(tmp_path: Path) -> None:
    """Lock files stay open in each process. If one is removed, the store locks the file now
    at its path, the one another process locks."""
    root = tmp_path / "root"
    store = FilesystemStore(root)
    key = "t/leases/a.lease"
    try:
        await store.put(key, b"1", durable=False)  # opens the stripe's lock file, and keeps it
        shutil.rmtree(root / ".pawnqueue" / "locks")
        (root / ".pawnqueue" / "locks").mkdir()
        lock = hold_stripe_lock(root, key)  # another process, on a new file at that path
        try:
            put = asyncio.create_task(store.put(key, b"2", durable=False))
            done, _ = await asyncio.wait({put}, timeout=0.3)
            assert not done, "the store locked the removed file"
            assert (root / key).read_bytes() == b"1"
        finally:
            os.close(lock)
        async with asyncio.timeout(10):
            await put
        assert (await store.get(key)).data == b"2"
    finally:
        await store.close()


async def test_a_forked_child_does_not_share_the_parents_locks(tmp_path: Path) -> None:
    """An flock belongs to an open file, which a fork shares: a child opens its own."""
    store = FilesystemStore(tmp_path / "root")
    key = "t/leases/a.lease"
    try:
        await store.put(key, b"1", durable=False)  # the lock file is open before the fork
        held_r, held_w = os.pipe()
        answer_r, answer_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: try the stripe while the parent holds it
            code = 1
            try:
                os.read(held_r, 1)
                busy = store._stripes.acquire(key, wait=False) is None
                os.write(answer_w, b"busy" if busy else b"free")
                code = 0
            finally:
                os._exit(code)
        stripe = store._stripes.acquire(key, wait=True)
        assert stripe is not None
        try:
            os.write(held_w, b"x")
            answer = os.read(answer_r, 4)
        finally:
            store._stripes.release(stripe)
            await asyncio.to_thread(os.waitpid, pid, 0)
            for fd in (held_r, held_w, answer_r, answer_w):
                os.close(fd)
        assert answer == b"busy"
    finally:
        await store.close()


async def test_deleted_files_are_unlinked_after_the_key_is_gone(tmp_path: Path) -> None:
    """A delete on the loop moves the file into tmp/ (the key is gone at once) and a worker
    thread unlinks it; nothing is left behind once the store is closed."""
    root = tmp_path / "root"
    store = FilesystemStore(root)
    keys = [f"t/messages/{n:03d}.json" for n in range(20)]
    for key in keys:
        await store.put(key, os.urandom(5000))
    await store.delete_many(keys)
    assert await store.list("t/") == []
    for key in keys:
        with pytest.raises(NotFound):
            await store.get(key)
        assert not (root / key).exists()
    await store.close()
    assert leftover_temp_files(root) == []


@pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "named-temp-files"])
async def test_every_put_mode_with_and_without_unnamed_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    from pawn_queue.store import _fs_files

    if not unnamed:
        monkeypatch.setattr(_fs_files, "_O_TMPFILE", 0)
    root = tmp_path / "root"
    store = FilesystemStore(root)
    try:
        for durable in (True, False):
            key = f"k/{durable}.json"
            first = await store.put(key, b"1", "create", durable=durable)
            with pytest.raises(AlreadyExists):
                await store.put(key, b"x", "create", durable=durable)
            second = await store.put(key, b"2", "overwrite", durable=durable)
            with pytest.raises(PreconditionFailed):
                await store.put(key, b"x", IfMatch(first), durable=durable)
            third = await store.put(key, b"3", IfMatch(second), durable=durable)
            fresh = await store.put(f"k/new-{durable}.json", b"4", "overwrite", durable=durable)
            assert len({first, second, third, fresh}) == 4
            assert (await store.get(key)).data == b"3"
            assert (await store.head(key)).etag == third
            assert (await store.get(f"k/new-{durable}.json")).meta.etag == fresh
            assert mode_of(root / key) == 0o600
    finally:
        await store.close()
    assert leftover_temp_files(root) == []


async def test_an_indexed_listing_in_progress_follows_changes_in_place(tmp_path: Path) -> None:
    """A listing reads a large directory's index a window at a time, so changes made while
    it runs (by this process) never duplicate, reorder or skip the keys it has not reached."""
    from pawn_queue.store import _fs_listing

    root = tmp_path / "root"
    store = FilesystemStore(root)
    try:
        names = [f"{n:05d}.json" for n in range(0, 1400, 2)]
        for name in names:
            await store.put(f"t/messages/{name}", b"x")
        directory = str(root / "t" / "messages")
        listing = _fs_listing.entries(directory, lambda name: True, "", None)
        seen = [next(listing) for _ in range(100)]
        await store.delete(f"t/messages/{names[-1]}")
        await store.put("t/messages/01001.json", b"y")  # between two listed-to-come keys
        await store.put("t/messages/00001.json", b"y")  # behind the listing: not seen
        seen += list(listing)
        expected = sorted([*names[:-1], "01001.json"])
        assert seen == expected
    finally:
        await store.close()
