"""S3-specific behaviour of S3Store against a real SeaweedFS (no mocks)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import obstore.store
import pytest
from pydantic import SecretStr

from pawn_queue.config import S3Config
from pawn_queue.exceptions import (
    AccessDenied,
    AlreadyExists,
    BucketNotFound,
    ConfigError,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store.base import IfMatch
from pawn_queue.store.s3 import S3Store
from tests.helpers.stores import queue_config_dict
from tests.servers.seaweedfs import SeaweedFS

ACCESS_KEY = "PQTESTACCESSKEY0001"
SECRET_KEY = "pq-test-secret-7f3a9c2e51"
READER_ACCESS_KEY = "PQTESTREADERKEY0002"
READER_SECRET_KEY = "pq-test-reader-secret-b81d"
AUTH_BUCKET = "auth-bucket"


@pytest.fixture
async def s3(s3_config: S3Config) -> AsyncIterator[S3Store]:
    store = S3Store(s3_config)
    try:
        yield store
    finally:
        await store.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fast_config(endpoint: str, bucket: str = "bucket") -> S3Config:
    return S3Config(
        endpoint_url=endpoint,
        bucket_name=bucket,
        aws_access_key_id=SecretStr(ACCESS_KEY),
        aws_secret_access_key=SecretStr(SECRET_KEY),
        aws_session_token=SecretStr("pq-session-token-secret"),
        use_ssl=False,
        connect_timeout_seconds=0.5,
        request_timeout_seconds=0.5,
        max_retries=1,
        retry_timeout_seconds=2,
    )


def _assert_clean(exc: BaseException, *secrets: str) -> None:
    """Only pawn_queue errors in the chain, and no secret in any message or repr."""
    seen: BaseException | None = exc
    while seen is not None:
        module = type(seen).__module__
        assert module.startswith("pawn_queue"), f"{type(seen)} escaped"
        for text in (str(seen), repr(seen)):
            for secret in secrets:
                assert secret not in text
            assert "Signature=" not in text and "Credential=" not in text
        seen = seen.__cause__ or seen.__context__


# -- check() and errors -----------------------------------------------------------------


async def test_check_passes_on_existing_bucket(s3: S3Store) -> None:
    await s3.check()


async def test_missing_bucket(seaweedfs: SeaweedFS, s3_config: S3Config) -> None:
    config = s3_config.model_copy(update={"bucket_name": f"missing-{uuid.uuid4().hex[:12]}"})
    store = S3Store(config)
    with pytest.raises(BucketNotFound, match="missing-") as info:
        await store.check()
    _assert_clean(info.value, SECRET_KEY)
    with pytest.raises(BucketNotFound):
        await store.list("x/")
    with pytest.raises(BucketNotFound):
        await store.get("x")
    with pytest.raises(BucketNotFound):
        await store.delete_many(["x", "y"])
    # A HEAD response has no body to tell a missing bucket from a missing key.
    with pytest.raises(NotFound):
        await store.head("x")


async def test_unreachable_endpoint_is_unavailable_and_clean() -> None:
    store = S3Store(_fast_config(f"http://127.0.0.1:{_closed_port()}"))
    operations = [
        store.check(),
        store.get("k"),
        store.head("k"),
        store.put("k", b"x"),
        store.put("k", b"x", mode="create"),
        store.list("k/"),
        store.delete("k"),
    ]
    for operation in operations:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="connection refused") as info:
            await operation
        assert time.monotonic() - started < 5
        _assert_clean(info.value, SECRET_KEY, ACCESS_KEY, "pq-session-token-secret")


async def test_silent_endpoint_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # accepts connections, never answers
        port = listener.getsockname()[1]
        store = S3Store(_fast_config(f"http://127.0.0.1:{port}"))
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="timed out") as info:
            await store.get("k")
        assert time.monotonic() - started < 5
        _assert_clean(info.value, SECRET_KEY, ACCESS_KEY)


@pytest.fixture(scope="module")
def auth_seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A second server that checks credentials: an admin and a read-only identity."""
    data_dir = tmp_path_factory.mktemp("seaweedfs-auth")
    identities = {
        "identities": [
            {
                "name": "admin",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            },
            {
                "name": "reader",
                "credentials": [{"accessKey": READER_ACCESS_KEY, "secretKey": READER_SECRET_KEY}],
                "actions": [f"Read:{AUTH_BUCKET}"],
            },
        ]
    }
    config_path = data_dir / "s3.json"
    config_path.write_text(json.dumps(identities))
    server = SeaweedFS.start(data_dir / "data", s3_config=config_path)
    try:
        server.create_bucket(AUTH_BUCKET, ACCESS_KEY, SECRET_KEY)
        yield server
    finally:
        server.stop()


def _auth_store(server: SeaweedFS, access_key: str, secret_key: str) -> S3Store:
    return S3Store(
        S3Config(
            endpoint_url=server.endpoint,
            bucket_name=AUTH_BUCKET,
            aws_access_key_id=SecretStr(access_key),
            aws_secret_access_key=SecretStr(secret_key),
            use_ssl=False,
            max_retries=0,
        )
    )


async def test_right_credentials_work(auth_seaweedfs: SeaweedFS) -> None:
    store = _auth_store(auth_seaweedfs, ACCESS_KEY, SECRET_KEY)
    await store.check()
    await store.put("k", b"v")
    assert (await store.get("k")).data == b"v"


@pytest.mark.parametrize(
    ("access_key", "secret_key"),
    [(ACCESS_KEY, "wrong-secret-4411"), ("PQUNKNOWNACCESSKEY", SECRET_KEY)],
    ids=["wrong-secret", "unknown-access-key"],
)
async def test_wrong_credentials_are_access_denied(
    auth_seaweedfs: SeaweedFS, access_key: str, secret_key: str
) -> None:
    store = _auth_store(auth_seaweedfs, access_key, secret_key)
    operations = [
        store.check(),
        store.put("k", b"x"),
        store.get("k"),
        store.list(""),
        store.head("k"),
    ]
    for operation in operations:
        with pytest.raises(AccessDenied) as info:
            await operation
        _assert_clean(info.value, secret_key, access_key)
    assert re.search(r"SignatureDoesNotMatch|InvalidAccessKeyId|HTTP 403", str(info.value))


async def test_missing_permission_is_access_denied(auth_seaweedfs: SeaweedFS) -> None:
    store = _auth_store(auth_seaweedfs, READER_ACCESS_KEY, READER_SECRET_KEY)
    with pytest.raises(AccessDenied) as info:
        await store.put("k", b"x")
    _assert_clean(info.value, READER_SECRET_KEY)


# -- semantics --------------------------------------------------------------------------


async def test_etag_is_the_servers_quoted_etag(s3: S3Store) -> None:
    etag = await s3.put("e/k", b"hello")
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
    assert (await s3.head("e/k")).etag == etag
    assert (await s3.get("e/k")).meta.etag == etag
    assert [m.etag for m in await s3.list("e/")] == [etag]
    assert await s3.put("e/k", b"again", mode=IfMatch(etag)) != etag
    with pytest.raises(PreconditionFailed):
        await s3.put("e/k", b"stale", mode=IfMatch(etag))
    with pytest.raises(AlreadyExists):
        await s3.put("e/k", b"x", mode="create")
    with pytest.raises(PreconditionFailed):
        await s3.put("e/missing", b"x", mode=IfMatch(etag))


async def test_prefix_isolation(s3_config: S3Config) -> None:
    # "app" and "app2": string-prefix related, isolated because obstore joins with "/".
    stores = {
        prefix: S3Store(s3_config.model_copy(update={"prefix": prefix}))
        for prefix in ("app", "app2", "app/sub")
    }
    for prefix, store in stores.items():
        await store.put("topic/.topic", prefix.encode())
        await store.put("topic/messages/1", prefix.encode())
    for prefix, store in stores.items():
        assert (await store.get("topic/.topic")).data == prefix.encode()
    assert [m.key for m in await stores["app2"].list("")] == ["topic/.topic", "topic/messages/1"]
    # "app/sub" lives inside "app": the outer store sees it, the inner one sees only itself.
    assert [m.key for m in await stores["app"].list("")] == [
        "sub/topic/.topic",
        "sub/topic/messages/1",
        "topic/.topic",
        "topic/messages/1",
    ]
    await stores["app2"].delete_many(["topic/.topic", "topic/messages/1"])
    assert await stores["app2"].list("") == []
    assert len(await stores["app"].list("topic/")) == 2
    root = S3Store(s3_config)
    assert [m.key for m in await root.list("app2")] == []
    assert len(await root.list("app")) == 4
    assert repr(stores["app/sub"]).endswith("prefix='app/sub')")


# Includes SeaweedFS's traps: it lists directory "ab/" before siblings "ab-" and "ab.c" and
# skips the whole of "ab/" when asked to start after "t/ab".
LISTING_KEYS = sorted(
    [
        "t/.topic",
        "t/ab",
        "t/ab-",
        "t/ab-/q",
        "t/ab.c",
        "t/ab/x",
        "t/ab/y/z",
        "t/ab/y-1",
        "t/abc",
        "t/m0",
        "t/m00/a",
        "t/m1",
        "t/mess",
        "t/messages/0001",
        "t/messages/0002",
        "t/messages/1000",
        "t/messagesX",
        "t/n",
        "t-eu/x",
        "t.v2/.topic",
        "t0/x",
        "tt/x",
        "u/v",
    ]
)


def _expected(prefix: str, start_after: str | None, limit: int | None) -> list[str]:
    keys = [k for k in LISTING_KEYS if k.startswith(prefix)]
    if start_after is not None:
        keys = [k for k in keys if k > start_after]
    return keys[:limit] if limit is not None else keys


@pytest.mark.parametrize(
    "prefix",
    ["", "t", "t/", "t/a", "t/ab", "t/ab/", "t/ab-", "t/ab/y", "t/m", "t/m0", "t/mess",
     "t/messages/", "t/messages/0", "t/messages/1", "t/z", "t/messagesX", "t/messagesX/", "tt",
     "v", "t//", "t-", "t."],
)  # fmt: skip
@pytest.mark.parametrize("server", ["seaweedfs", "byte-order"])
async def test_string_prefix_listing(s3_config: S3Config, prefix: str, server: str) -> None:
    s3 = S3Store(s3_config) if server == "seaweedfs" else _byte_order_store()
    for key in LISTING_KEYS:
        await s3.put(key, key.encode())
    starts: list[str | None] = [None, "", "a", "t", "t-eu/x", "t/", "t/ab", "t/ab-", "t/ab-/q",
                                "t/ab.", "t/ab.c", "t/ab/", "t/ab/x", "t/ab/y", "t/ab/y-1",
                                "t/m0", "t/messages/", "t/messages/0001", "t/messages/1000",
                                "t/n", "t/o", "zz"]  # fmt: skip
    for start_after in starts:
        for limit in (None, 1, 2, 100):
            got = [m.key for m in await s3.list(prefix, start_after=start_after, limit=limit)]
            assert got == _expected(prefix, start_after, limit), (prefix, start_after, limit)
    await s3.close()


def _byte_order_store() -> S3Store:
    """An S3Store on obstore's in-memory store, which lists in byte order like AWS S3 and
    MinIO: exercises the path taken once a server is seen not to list in tree order."""
    store = S3Store(S3Config(endpoint_url="http://127.0.0.1:9", bucket_name="byte-order"))
    store._store = obstore.store.MemoryStore()  # type: ignore[assignment]
    return store


async def test_byte_order_server_is_detected() -> None:
    store = _byte_order_store()
    for key in ("a/1", "a-b", "a/2", "b"):
        await store.put(key, b"x")
    assert [m.key for m in await store.list("", limit=3)] == ["a-b", "a/1", "a/2"]
    assert store.list_order == "bytes"
    assert [m.key for m in await store.list("a")] == ["a-b", "a/1", "a/2"]


def _requests(server: SeaweedFS, bucket: str, kind: str) -> int:
    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        text = response.read().decode()
    pattern = rf'SeaweedFS_s3_request_total{{bucket="{bucket}",code="\d+",type="{kind}"}} (\d+)'
    return sum(int(n) for n in re.findall(pattern, text))


async def _requests_since(
    server: SeaweedFS, bucket: str, kind: str, before: int, least: int
) -> int:
    """How many ``kind`` requests SeaweedFS counted since ``before``, once it counted at least
    ``least`` (or 10 s passed): it counts a request after answering it, which a loaded
    machine made visible."""
    for _ in range(200):
        count = _requests(server, bucket, kind) - before
        if count >= least:
            return count
        await asyncio.sleep(0.05)  # polling a server's counter: nothing to wait on
    return count


async def test_flat_listing_costs_one_request(
    s3: S3Store, s3_config: S3Config, seaweedfs: SeaweedFS
) -> None:
    """The tree-order repair costs requests only at directories, not in flat listings."""
    keys = [f"t/messages/{i:04d}-x.json" for i in range(50)]
    await asyncio.gather(*(s3.put(key, b"x") for key in [*keys, "t/.topic", "t/leases/a"]))
    calls = [
        s3.list("t/messages/", limit=10),
        s3.list("t/messages/", start_after=keys[20], limit=10),
        s3.list("t/messages/0"),
    ]
    for call in calls:
        before = _requests(seaweedfs, s3_config.bucket_name, "LIST")
        assert await call
        assert await _requests_since(seaweedfs, s3_config.bucket_name, "LIST", before, 1) == 1


SPECIAL_KEYS = [
    "orders/.topic",
    "_registry/consumers/c-1.json",
    "k/héllo wörld",
    "k/日本語/ключ",
    "k/emoji-😀",
    "k/a=b+c",
    "k/100%",
    "k/a%20b",
    "k/sp ace",
    "k/~tilde#hash?q&amp;x",
    "k/{braces}[brackets]|pipe^caret`tick",
    "k/quote\"apos'semi;colon:comma,",
    "k/..dots",
    "k/trailing.",
    "k/c1\x85control",
    "k/max\U0010ffff",
]


async def test_special_keys_round_trip(s3: S3Store) -> None:
    for key in SPECIAL_KEYS:
        await s3.put(key, key.encode())
    for key in SPECIAL_KEYS:
        obj = await s3.get(key)
        assert obj.data == key.encode() and obj.meta.key == key
        assert (await s3.head(key)).key == key
    listed = {m.key for m in await s3.list("")}
    assert listed == set(SPECIAL_KEYS)
    await s3.delete_many(SPECIAL_KEYS)
    assert await s3.list("") == []


@pytest.mark.parametrize(
    "key",
    ["", "/lead", "trail/", "a//b", "a/./b", "a/../b", ".", "tab\there", "nul\x00", "del\x7f",
     "back\\slash", "x" * 1025, "lone\ud800surrogate"],
)  # fmt: skip
async def test_unrepresentable_keys_are_config_errors(s3: S3Store, key: str) -> None:
    with pytest.raises(ConfigError):
        await s3.put(key, b"x")
    with pytest.raises(ConfigError):
        await s3.get(key)
    with pytest.raises(ConfigError):
        await s3.delete_many(["fine", key])


async def test_delete_many_batches_by_thousand(
    s3: S3Store, s3_config: S3Config, seaweedfs: SeaweedFS
) -> None:
    keys = [f"d/{i:05d}" for i in range(2_345)]
    for start in range(0, len(keys), 200):
        await asyncio.gather(*(s3.put(key, b"x") for key in keys[start : start + 200]))
    before = _requests(seaweedfs, s3_config.bucket_name, "DELETE")
    await s3.delete_many([*keys, "d/missing-1", "d/missing-2"])
    assert await _requests_since(seaweedfs, s3_config.bucket_name, "DELETE", before, 3) == 3
    assert await s3.list("d/") == []
    await s3.delete("d/missing-3")
    with pytest.raises(NotFound):
        await s3.get(keys[0])


async def test_close_makes_store_unusable(s3_config: S3Config) -> None:
    store = S3Store(s3_config)
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.get("k")


def test_repr_and_endpoint_forms() -> None:
    secret = "do-not-print-this-secret"
    config = S3Config(
        endpoint_url="http://minio.local:9000",
        bucket_name="b-1",
        prefix="/queues/prod/",
        aws_access_key_id=SecretStr("AKIAEXAMPLEKEY"),
        aws_secret_access_key=SecretStr(secret),
        use_ssl=False,
    )
    store = S3Store(config)
    assert (
        repr(store)
        == "S3Store(endpoint='http://minio.local:9000', bucket='b-1', prefix='queues/prod')"
    )
    assert secret not in repr(store) and "AKIAEXAMPLEKEY" not in repr(store)
    # model_copy skips S3Config's validators: these reach S3Store's own checks.
    bare = S3Store(config.model_copy(update={"endpoint_url": "minio.local:9000"}))
    assert "endpoint='http://minio.local:9000'" in repr(bare)
    virtual = config.model_copy(
        update={"endpoint_url": "https://minio.local:9000", "addressing_style": "virtual"}
    )
    assert "endpoint='https://b-1.minio.local:9000'" in repr(S3Store(virtual))
    with_userinfo = S3Store(config.model_copy(update={"endpoint_url": "http://u:pw@h:1"}))
    assert "pw" not in repr(with_userinfo)
    with pytest.raises(ConfigError):
        S3Store(config.model_copy(update={"aws_secret_access_key": None}))
    with pytest.raises(ConfigError):
        S3Store(config.model_copy(update={"prefix": "a//b"}))
    with pytest.raises(ConfigError):
        S3Store(config.model_copy(update={"endpoint_url": "ftp://h"}))


def test_seaweedfs_helper_cleans_up(tmp_path: Path) -> None:
    server = SeaweedFS.start(tmp_path / "sw")
    server.create_bucket("helper-bucket")
    server.create_bucket("helper-bucket")  # already owned: fine
    pid = server.process.pid
    server.stop()
    assert server.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


CLEAN_EXIT = """
import asyncio, json, sys
from pawn_queue import PawnQueue

async def main():
    async with await PawnQueue.from_config(json.loads(sys.argv[1])) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        for n in range(3):
            await producer.publish("t", {"n": n})
        consumer = await pq.register_consumer("c", topics=["t"])
        for message in await consumer.poll():
            await message.ack()

asyncio.run(main())
"""


async def test_scripts_exit_cleanly(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A process that used the S3 store and closed its queue exits with status 0. The client
    library can abort the process (SIGABRT) if it exits just after a request; closing the
    store waits that moment out (without it, 3-7 runs in 40 aborted)."""
    config = queue_config_dict("s3", request, tmp_path)
    slots = asyncio.Semaphore(4)

    async def run() -> int:
        async with slots:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CLEAN_EXIT, json.dumps(config)
            )
            return await asyncio.wait_for(process.wait(), 60)

    codes = await asyncio.gather(*(run() for _ in range(24)))
    assert codes == [0] * 24
