"""What only the filesystem store promises: cross-process atomicity, containment, privacy."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import stat
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any

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

PROCESSES = 8
RACE_KEYS = [f"race/{i}/k.json" for i in range(6)]


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[FilesystemStore]:
    store = FilesystemStore(tmp_path / "root")
    try:
        yield store
    finally:
        await store.close()


def leftover_temp_files(root: Path) -> list[Path]:
    return list((root / ".pawnqueue" / "tmp").iterdir())


# -- across processes -----------------------------------------------------------------------
# Workers run in "spawn" children, so they must be importable module-level functions. Each
# reports (worker, result) or (worker, traceback) on the queue; a barrier lines them up.


def _report(results: Any, worker: int, fn: Callable[[], object]) -> None:
    try:
        results.put((worker, fn(), None))
    except BaseException:
        results.put((worker, None, traceback.format_exc()))


def _race_worker(
    root: str, worker: int, etags: dict[str, str] | None, barrier: Any, results: Any
) -> None:
    """Put every race key once, create-only (``etags`` None) or if-match; say who won what."""

    async def main() -> dict[str, str]:
        store = FilesystemStore(root)
        try:
            await store.list("warm-up/")  # prepare the root before the starting line
            await asyncio.to_thread(barrier.wait)

            async def one(key: str) -> tuple[str, str]:
                data = f"{worker}:{key}".encode()
                try:
                    if etags is None:
                        return key, await store.put(key, data, mode="create")
                    return key, await store.put(key, data, mode=IfMatch(etags[key]))
                except (AlreadyExists, PreconditionFailed) as exc:
                    return key, type(exc).__name__

            return dict(await asyncio.gather(*(one(key) for key in RACE_KEYS)))
        finally:
            await store.close()

    _report(results, worker, lambda: asyncio.run(main()))


def _counter_worker(
    root: str, worker: int, threads: int, increments: int, barrier: Any, results: Any
) -> None:
    """From ``threads`` threads (one event loop each, one shared store), increment a counter
    with compare-and-swap and create one log key per increment."""

    def run() -> int:
        store = FilesystemStore(root)
        start = threading.Barrier(threads)
        retries: list[int] = []

        async def thread_main(thread: int) -> None:
            await asyncio.to_thread(start.wait)
            conflicts = 0
            for i in range(increments):
                while True:
                    current = await store.get("counter")
                    new = str(int(current.data) + 1).encode()
                    try:
                        await store.put("counter", new, mode=IfMatch(current.meta.etag))
                        break
                    except PreconditionFailed:
                        conflicts += 1
                await store.put(f"log/{worker}-{thread}-{i}", new, mode="create")
            retries.append(conflicts)

        barrier.wait()
        pool = [
            threading.Thread(target=asyncio.run, args=(thread_main(t),)) for t in range(threads)
        ]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        asyncio.run(store.close())
        assert len(retries) == threads, "a thread died"
        return sum(retries)

    _report(results, worker, run)


def run_processes(target: Callable[..., None], args: Sequence[tuple[object, ...]]) -> list[Any]:
    """Start one spawned process per ``args`` entry (each gets worker, *args, barrier, queue
    appended as documented by the target) and return their results in worker order."""
    ctx: SpawnContext = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(*a[:1], worker, *a[1:], barrier, results))
        for worker, a in enumerate(args)
    ]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    errors = [tb for _, _, tb in reports if tb]
    assert not errors, errors[0]
    return [value for _, value, _ in sorted(reports, key=lambda r: r[0])]


def check_one_winner_per_key(root: Path, outcomes: list[dict[str, str]], loser: str) -> None:
    for key in RACE_KEYS:
        winners = [w for w, out in enumerate(outcomes) if out[key].startswith('"')]
        assert len(winners) == 1, (key, [out[key] for out in outcomes])
        assert all(out[key] == loser for w, out in enumerate(outcomes) if w != winners[0])
        assert (root / key).read_bytes() == f"{winners[0]}:{key}".encode()


async def test_create_race_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outcomes = await asyncio.to_thread(run_processes, _race_worker, [(str(root), None)] * PROCESSES)
    check_one_winner_per_key(root, outcomes, "AlreadyExists")
    assert leftover_temp_files(root) == []


async def test_compare_and_swap_race_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FilesystemStore(root)
    etags = {key: await store.put(key, b"start") for key in RACE_KEYS}
    await store.close()
    outcomes = await asyncio.to_thread(
        run_processes, _race_worker, [(str(root), etags)] * PROCESSES
    )
    check_one_winner_per_key(root, outcomes, "PreconditionFailed")


async def test_threads_and_processes_share_one_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    procs, threads, increments = 3, 3, 8
    store = FilesystemStore(root)
    await store.put("counter", b"0")
    await asyncio.to_thread(
        run_processes, _counter_worker, [(str(root), threads, increments)] * procs
    )
    total = procs * threads * increments
    assert (await store.get("counter")).data == str(total).encode()
    log = await store.list("log/")
    assert len(log) == total
    # Every increment was seen exactly once: the logged values are 1..total.
    values = sorted([int((await store.get(m.key)).data) for m in log])
    assert values == list(range(1, total + 1))
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


async def test_stale_temp_files_are_swept_on_start(tmp_path: Path) -> None:
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


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


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
        await store.put("t/.topic", b"marker") if linked != "t" else await store.list()
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


# -- the event loop's share of the work -----------------------------------------------------


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
    from pawn_queue.store import filesystem

    if not unnamed:
        monkeypatch.setattr(filesystem, "_O_TMPFILE", 0)
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
