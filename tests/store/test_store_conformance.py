"""One contract, every store: the queue relies on exactly these behaviours.

Runs on the whole store matrix (memory, a local directory, SeaweedFS, Ceph RGW, moto,
s3rver and Azurite). The conditional-write tests run where the store enforces conditions;
on s3rver, which ignores them, tests/store/test_store_matrix.py checks that the probe sees it and
the queue claims with ``csprng_verify``.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Iterable
from datetime import UTC, datetime, timedelta

import pytest

from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed
from pawn_queue.store.base import LIST_PAGE, IfMatch, PutMode, Store
from tests.helpers.stores import CONDITIONAL, LIMITED, STORE_MATRIX, is_s3

RACERS = 24

conditional = pytest.mark.parametrize("backend", sorted(CONDITIONAL), indirect=True)
"""For tests of conditional writes: only the stores that enforce them."""


@pytest.fixture(params=[*STORE_MATRIX, LIMITED])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def bounded(aws: Iterable[Awaitable[object]], limit: int = 64) -> None:
    """Run awaitables with at most ``limit`` in flight."""
    semaphore = asyncio.Semaphore(limit)

    async def one(aw: Awaitable[object]) -> None:
        async with semaphore:
            await aw

    await asyncio.gather(*(one(aw) for aw in aws))


async def put_all(store: Store, keys: Iterable[str]) -> None:
    await bounded(store.put(key, key.encode()) for key in keys)


async def listed_keys(
    store: Store, prefix: str = "", start_after: str | None = None, limit: int | None = None
) -> list[str]:
    return [meta.key for meta in await store.list(prefix, start_after, limit)]


# -- conditional writes ---------------------------------------------------------------------


async def race(store: Store, key: str, mode: PutMode, loser: type[Exception]) -> str:
    """Race RACERS puts of distinct bytes on ``key``; check one winner whose bytes are stored
    and that every loser got ``loser``. Return the winner's etag."""
    payloads = [f"writer {i} on {key}".encode() for i in range(RACERS)]
    results = await asyncio.gather(
        *(store.put(key, p, mode=mode) for p in payloads), return_exceptions=True
    )
    winners = [(i, r) for i, r in enumerate(results) if isinstance(r, str)]
    assert len(winners) == 1, results
    assert all(isinstance(r, loser) for r in results if not isinstance(r, str)), results
    (index, etag), stored = winners[0], await store.get(key)
    assert (stored.data, stored.meta.etag) == (payloads[index], etag)
    return etag


# The ten races of each test run at once, on distinct keys: on SeaweedFS a contended
# conditional put waits seconds for a lock, so one race after another would take minutes.


@conditional
async def test_create_race_has_exactly_one_winner(store: Store) -> None:
    keys = [f"race/create-{i}.json" for i in range(10)]
    await asyncio.gather(*(race(store, key, "create", AlreadyExists) for key in keys))


@conditional
async def test_compare_and_swap_race_has_exactly_one_winner(store: Store) -> None:
    keys = [f"race/cas-{i}.json" for i in range(10)]
    start = await asyncio.gather(*(store.put(key, b"start") for key in keys))

    async def cas(key: str, etag: str) -> None:
        new_etag = await race(store, key, IfMatch(etag), PreconditionFailed)
        assert new_etag != etag
        await store.put(key, b"next", mode=IfMatch(new_etag))  # the winner's etag is current

    await asyncio.gather(*(cas(key, etag) for key, etag in zip(keys, start, strict=True)))


@conditional
async def test_if_match_on_missing_key_fails(store: Store) -> None:
    with pytest.raises(PreconditionFailed):
        await store.put("cas/missing.json", b"x", mode=IfMatch('"0123456789abcdef"'))
    with pytest.raises(NotFound):
        await store.head("cas/missing.json")


@conditional
async def test_if_match_on_deleted_key_fails(store: Store) -> None:
    etag = await store.put("cas/gone.json", b"x")
    await store.delete("cas/gone.json")
    with pytest.raises(PreconditionFailed):
        await store.put("cas/gone.json", b"y", mode=IfMatch(etag))
    with pytest.raises(NotFound):
        await store.get("cas/gone.json")


@conditional
async def test_if_match_with_stale_etag_fails_and_keeps_data(store: Store) -> None:
    old = await store.put("cas/k.json", b"v1")
    current = await store.put("cas/k.json", b"v2")
    with pytest.raises(PreconditionFailed):
        await store.put("cas/k.json", b"v3", mode=IfMatch(old))
    with pytest.raises(PreconditionFailed):
        await store.put("cas/k.json", b"v3", mode=IfMatch('"not-an-etag"'))
    stored = await store.get("cas/k.json")
    assert (stored.data, stored.meta.etag) == (b"v2", current)
    newest = await store.put("cas/k.json", b"v3", mode=IfMatch(current))
    stored = await store.get("cas/k.json")
    assert (stored.data, stored.meta.etag) == (b"v3", newest)


@conditional
async def test_create_on_existing_key_fails_and_keeps_data(store: Store) -> None:
    etag = await store.put("c/k.json", b"first", mode="create")
    with pytest.raises(AlreadyExists):
        await store.put("c/k.json", b"second", mode="create")
    stored = await store.get("c/k.json")
    assert (stored.data, stored.meta.etag) == (b"first", etag)


async def test_create_after_delete_succeeds(store: Store) -> None:
    await store.put("c/k.json", b"first", mode="create")
    await store.delete("c/k.json")
    await store.put("c/k.json", b"again", mode="create")
    assert (await store.get("c/k.json")).data == b"again"


# -- listing --------------------------------------------------------------------------------

# Keys in the same order whether a store sorts whole key strings or walks directories.
ORDER_KEYS = [
    "order/a/b",
    "order/a/b-2",
    "order/a_e",
    "order/a0",
    "order/a9",
    "order/ab/c",
    "order/A.json",
    "order/c-e",
    "order/c.d",
    "order/z",
    "order/b/1/2/3",
    "order/b/10",
    "order/b/1_0",
    "orderz",
]
# Keys that sort before a sibling directory of the same stem, because '-' and '.' come before
# '/'. A plain sorted directory walk lists them after it.
SEPARATOR_TRAPS = ["order/a-c", "order/a.d", "order/b/1-2", "order/b/1.5", "order-x/1"]


@pytest.fixture
async def ordered(store: Store) -> list[str]:
    """Write the ordering keys in shuffled order; return them sorted."""
    keys = ORDER_KEYS + SEPARATOR_TRAPS
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    await put_all(store, shuffled)
    return sorted(keys)


async def test_list_is_in_key_order(store: Store, ordered: list[str]) -> None:
    listed = await listed_keys(store)
    assert listed == ordered
    assert listed.index("order/a/b-2") < listed.index("order/a0") < listed.index("order/a_e")
    assert listed.index("order/b/1/2/3") < listed.index("order/b/10") < listed.index("order/b/1_0")
    assert listed.index("order/z") < listed.index("orderz")


async def test_list_order_around_separators(store: Store) -> None:
    # SeaweedFS lists in directory-walk order; the S3 store restores byte order on top of it.
    await put_all(store, ORDER_KEYS + SEPARATOR_TRAPS)
    listed = await listed_keys(store)
    assert listed == sorted(ORDER_KEYS + SEPARATOR_TRAPS)
    assert listed.index("order/a-c") < listed.index("order/a.d") < listed.index("order/a/b")
    assert listed.index("order/b/1-2") < listed.index("order/b/1.5") < listed.index("order/b/1/2/3")
    assert listed.index("order-x/1") < listed.index("order/A.json")
    assert await listed_keys(store, "order/a") == sorted(
        k for k in ORDER_KEYS + SEPARATOR_TRAPS if k.startswith("order/a")
    )
    assert await listed_keys(store, "order/", start_after="order/a-c", limit=2) == [
        "order/a.d",
        "order/a/b",
    ]
    # A start_after that is a "directory" (with or without its '/') must not skip its keys.
    for marker in ("order/a", "order/a.", "order/a/", "order/b/1", "order/b/1/"):
        expected = [k for k in listed if k.startswith("order/") and k > marker]
        assert await listed_keys(store, "order/", start_after=marker) == expected, marker


@pytest.mark.parametrize(
    "prefix",
    ["", "o", "order", "order/", "order/a", "order/a/", "order/b/1", "order/b/1/", "order/zz",
     "nothing/", "order/b/1/2/3", "order/a/b"],
)  # fmt: skip
async def test_list_prefix(store: Store, ordered: list[str], prefix: str) -> None:
    assert await listed_keys(store, prefix) == [k for k in ordered if k.startswith(prefix)]


async def test_list_start_after_and_limit(store: Store, ordered: list[str]) -> None:
    markers = [
        *ordered,
        "",
        "a",
        "order/",
        "order/a/a",
        "order/b/1/3",
        "order/zzz",
        "~",
    ]
    for marker in markers:
        expected = [k for k in ordered if k.startswith("order/") and k > marker]
        assert await listed_keys(store, "order/", start_after=marker) == expected, marker
        for limit in (1, 2, 5):
            got = await listed_keys(store, "order/", start_after=marker, limit=limit)
            assert got == expected[:limit], (marker, limit)


async def test_list_pages_past_one_thousand(store: Store) -> None:
    keys = [f"page/{i % 7}/{i:05d}.json" for i in range(1_100)]
    await put_all(store, keys)
    await store.put("pagf/outside.json", b"x")
    pages: list[list[str]] = []
    start_after: str | None = None
    while True:
        page = await listed_keys(store, "page/", start_after=start_after, limit=250)
        if not page:
            break
        pages.append(page)
        start_after = page[-1]
    assert [len(p) for p in pages] == [250, 250, 250, 250, 100]
    assert [k for p in pages for k in p] == sorted(keys)
    assert await listed_keys(store, "page/") == sorted(keys)


async def test_list_empty_and_missing_prefix(store: Store) -> None:
    assert await store.list() == []
    assert await store.list("nothing/") == []
    await store.put("x/y.json", b"1")
    assert await store.list("nothing/") == []
    assert await store.list("nothing") == []
    assert await store.list("x/y.json/") == []
    assert await store.list("x/", start_after="x/y.json") == []
    assert await store.list("x/", limit=0) == []


# -- reads and deletes ----------------------------------------------------------------------


async def test_missing_keys_raise_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.get("no/such.json")
    with pytest.raises(NotFound):
        await store.head("no/such.json")
    await store.put("dir/inner.json", b"x")
    # A prefix of other keys is not itself an object.
    with pytest.raises(NotFound):
        await store.get("dir")
    with pytest.raises(NotFound):
        await store.head("dir")
    with pytest.raises(NotFound):
        await store.get("dir/inner.json/more")


async def test_delete(store: Store) -> None:
    await store.delete("no/such.json")
    await store.put("d/k.json", b"x")
    await store.put("d/other.json", b"y")
    await store.delete("d/k.json")
    await store.delete("d/k.json")
    await store.delete("d")  # a prefix, not an object: nothing to do
    with pytest.raises(NotFound):
        await store.get("d/k.json")
    assert await listed_keys(store, "d/") == ["d/other.json"]


async def test_delete_many(store: Store) -> None:
    # More keys than one request takes (S3: 1,000; Azure: a batch of 256).
    doomed = [f"many/{i % 5}/{i:05d}" for i in range(LIST_PAGE + 100)]
    kept = ["many/0/keep", "many/zz", "manyx/1"]
    await put_all(store, doomed + kept)
    await store.delete_many([*doomed, "many/never-existed"])
    assert await listed_keys(store, "many") == sorted(kept)
    with pytest.raises(NotFound):
        await store.head(doomed[LIST_PAGE + 50])
    await store.delete_many([])


# -- objects and metadata -------------------------------------------------------------------


async def test_large_object_round_trips(store: Store) -> None:
    data = os.urandom(8 * 1024 * 1024)
    etag = await store.put("big/blob.bin", data)
    stored = await store.get("big/blob.bin")
    assert stored.data == data
    assert stored.meta.size == len(data) == (await store.head("big/blob.bin")).size
    assert stored.meta.etag == etag


async def test_empty_object_round_trips(store: Store) -> None:
    await store.put("empty/obj", b"")
    stored = await store.get("empty/obj")
    assert (stored.data, stored.meta.size) == (b"", 0)


async def test_unicode_keys(store: Store) -> None:
    keys = [
        "topic/ünïcødé-日本/€.json",
        "topic/ünïcødé-日本/z.json",
        "topic/ascii.json",
        "topic/\uffef.json",  # sorts before the emoji by code point (UTF-8), after it in UTF-16
        "topic/😀.json",
        "topic/ñ space.json",
    ]
    for key in keys:
        await store.put(key, key.encode())
    assert await listed_keys(store, "topic/") == sorted(keys)
    assert await listed_keys(store, "topic/ünïcødé-日本/") == sorted(keys[:2])
    for key in keys:
        stored = await store.get(key)
        assert (stored.data, stored.meta.key) == (key.encode(), key)
        assert (await store.head(key)).key == key


async def test_etags_and_metadata_agree(store: Store) -> None:
    first = await store.put("meta/k.json", b"one")
    second = await store.put("meta/k.json", b"two")
    assert first != second
    head = await store.head("meta/k.json")
    (listed,) = await store.list("meta/")
    stored = await store.get("meta/k.json")
    assert head.etag == listed.etag == stored.meta.etag == second
    assert head.size == listed.size == stored.meta.size == 3
    assert head.key == listed.key == stored.meta.key == "meta/k.json"


async def test_etag_changes_on_identical_rewrite(store: Store, backend: str) -> None:
    if is_s3(backend):
        pytest.skip("S3 etags are content MD5s: identical bytes give the identical etag")
    if backend == LIMITED:
        pytest.skip("50 writes to one key at once: the limit lets one through a second")
    etags = await asyncio.gather(*(store.put("meta/same.json", b"same") for _ in range(50)))
    etags.append(await store.put("meta/same.json", b"same"))
    assert len(set(etags)) == len(etags)


async def test_last_modified_is_aware_utc(store: Store) -> None:
    before = datetime.now(UTC)
    await store.put("time/k.json", b"x")
    head = await store.head("time/k.json")
    (listed,) = await store.list("time/")
    for stamp in (head.last_modified, listed.last_modified):
        assert stamp.tzinfo is not None
        assert stamp.utcoffset() == timedelta(0)
        assert abs(stamp - before) < timedelta(minutes=5)


# -- MemoryStore's own promises (beyond the contract) ---------------------------------------


async def test_memory_store_names_are_shared_and_plain_stores_private() -> None:
    from pawn_queue.store.memory import MemoryStore

    name = f"conformance-{os.getpid()}-{id(object())}"
    shared = MemoryStore.named(name)
    assert MemoryStore.named(name) is shared
    assert MemoryStore() is not MemoryStore()
    await shared.put("k", b"x")
    await shared.close()  # other holders of the name keep working
    assert (await MemoryStore.named(name).get("k")).data == b"x"
    MemoryStore.forget(name)
    assert MemoryStore.named(name) is not shared
    MemoryStore.forget(name)


async def test_memory_store_is_thread_safe() -> None:
    import threading

    from pawn_queue.store.memory import MemoryStore

    store = MemoryStore()
    keys = [f"threads/{i}" for i in range(20)]
    start = threading.Barrier(8)
    wins: list[str] = []

    async def writer(worker: int) -> None:
        await asyncio.to_thread(start.wait)
        for key in keys:
            try:
                await store.put(key, f"{worker}".encode(), mode="create")
                wins.append(key)
            except AlreadyExists:
                pass

    threads = [threading.Thread(target=asyncio.run, args=(writer(w),)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(wins) == sorted(keys)
    assert await listed_keys(store, "threads/") == sorted(keys)
