"""What each S3 server of the matrix does with conditional writes, as the probe, ``doctor``
and the queue see it (the conformance, README and crash suites run on them elsewhere).

SeaweedFS, moto and Ceph RGW enforce create-only and if-match writes (RGW only with the ETag
sent without its quotes); s3rver ignores both, so claims there use ``csprng_verify``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol.strategy import probe_store
from pawn_queue.config import S3Config
from pawn_queue.exceptions import AlreadyExists, ConfigError, PreconditionFailed, PublishError
from pawn_queue.store.base import IfMatch
from pawn_queue.store.s3 import S3Store
from tests.helpers.stores import CONDITIONAL, S3_SERVERS, queue_config_dict
from tests.helpers.support import poll_count
from tests.servers.fault_proxy import FaultProxy, FaultRule
from tests.servers.seaweedfs import SeaweedFS

SERVER_HEADERS = {
    "s3": "SeaweedFS",
    "s3-ceph": "not sent",  # RGW's beast frontend sends none
    "s3-moto": "Werkzeug",  # moto's server runs on Werkzeug and says so
    "s3-s3rver": "not sent",
}


@pytest.fixture(params=list(S3_SERVERS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def s3(s3_config: S3Config) -> AsyncIterator[S3Store]:
    store = S3Store(s3_config)
    try:
        yield store
    finally:
        await store.close()


async def test_probe_reports_what_the_server_enforces(s3: S3Store, backend: str) -> None:
    probe = await probe_store(s3)
    found = {c.name: (c.ok, c.detail) for c in probe.capabilities}
    if backend == "s3-s3rver":
        assert probe.strategy == "csprng_verify"
        assert found["if-match, stale ETag"] == (False, "ignored: the write went through")
        assert found["create-only, existing key"] == (False, "ignored: the write went through")
    else:
        assert probe.strategy == "conditional_write"
        assert found["if-match, stale ETag"] == (True, "refused")
        assert found["create-only, existing key"] == (True, "refused")
    ok, detail = found["if-match, current ETag"]
    assert ok
    # Ceph RGW 16.2 refuses the ETag quoted, as HEAD and PUT return it, and takes it bare.
    assert ("without its quotes" in detail) == (backend == "s3-ceph")
    assert s3.if_match_unquoted is (backend == "s3-ceph")
    assert await s3.list("_probe/") == []


async def test_if_match_after_learning_the_bare_form(s3: S3Store) -> None:
    """Once learnt, every if-match write takes the server's form, and stale ones still fail."""
    first = await s3.put("k.json", b"1")
    second = await s3.put("k.json", b"2", IfMatch(first))
    third = await s3.put("k.json", b"3", IfMatch(second))
    for stale in (first, second):
        with pytest.raises(PreconditionFailed):
            await s3.put("k.json", b"x", IfMatch(stale))
    assert (await s3.get("k.json")).meta.etag == third


@pytest.mark.parametrize("backend", sorted(set(S3_SERVERS) & CONDITIONAL), indirect=True)
async def test_auto_picks_conditional_write_and_refresh_then_ack_works(
    queue_config: dict[str, Any], backend: str
) -> None:
    """On Ceph RGW every refresh and settle failed with LeaseLostError before the bare form."""
    async with await PawnQueue.from_config(queue_config) as pq:
        assert pq.strategy == "conditional_write"
        await pq.create_topic("t")
        await (await pq.register_producer("p")).publish("t", {"n": 1})
        consumer = await pq.register_consumer("c", ["t"])
        [message] = await poll_count(consumer, 1)
        await message.extend(30)  # an if-match write over the lease, like a refresh
        await message.ack()  # raised LeaseLostError on RGW
        assert await pq.store.list("t/messages/") == []


@pytest.mark.parametrize("backend", ["s3-s3rver"], indirect=True)
async def test_explicit_conditional_write_is_refused_where_not_enforced(
    queue_config: dict[str, Any],
) -> None:
    queue_config["concurrency"]["strategy"] = "conditional_write"
    with pytest.raises(ConfigError) as caught:
        async with await PawnQueue.from_config(queue_config):
            pass
    message = str(caught.value)
    assert "create-only, existing key: ignored: the write went through" in message
    assert "set concurrency.strategy to auto or csprng_verify" in message


def test_doctor_verdict_matches_the_queue(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = queue_config_dict(backend, request, tmp_path)
    s3 = config["s3"]
    url = f"s3://{s3['bucket_name']}?endpoint_url={s3['endpoint_url']}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    env |= {
        "PAWNQUEUE_S3_ACCESS_KEY": s3["aws_access_key_id"],
        "PAWNQUEUE_S3_SECRET_KEY": s3["aws_secret_access_key"],
    }
    done = subprocess.run(
        [sys.executable, "-m", "pawn_queue", "--url", url, "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    expected = "conditional_write" if backend in CONDITIONAL else "csprng_verify"
    assert report["strategy"] == expected
    tested = [c for name, c in checks.items() if name.startswith("conditional write: ")]
    assert len(tested) == 3
    assert all(c["status"] == "ok" for c in tested) == (expected == "conditional_write")
    assert SERVER_HEADERS[backend] in checks["server"]["detail"]
    assert checks["create-only race"]["status"] == "ok"
    assert ("not run" in checks["create-only race"]["detail"]) == (backend == "s3-s3rver")
    assert any("csprng_verify" in risk for risk in report["risks"]) == (backend == "s3-s3rver")


# -- AWS's 409 ConditionalRequestConflict -----------------------------------------------------


@pytest.fixture
def conflicts(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint, seed=5, max_lifetime_seconds=120) as proxy:
        yield proxy


async def test_a_409_is_resent_then_reported_as_the_lost_race(
    conflicts: FaultProxy, s3_config: S3Config
) -> None:
    config = s3_config.model_copy(update={"endpoint_url": conflicts.endpoint, "max_retries": 2})
    store = S3Store(config)
    try:
        etag = await store.put("k.json", b"1")
        conflicts.set_rules([FaultRule("conflict_409", 1.0)])
        with pytest.raises(AlreadyExists):
            await store.put("new.json", b"x", "create")
        with pytest.raises(PreconditionFailed):
            await store.put("k.json", b"2", IfMatch(etag))
        assert conflicts.stats()["conflict_409"] == 6  # each resent twice, none applied
        conflicts.set_rules([FaultRule("conflict_409", 1.0, limit=1)])
        await store.put("new.json", b"x", "create")  # one 409, then the resend lands
        assert (await store.get("new.json")).data == b"x"
        await store.put("k.json", b"2", IfMatch(etag))
        assert (await store.get("k.json")).data == b"2"
    finally:
        await store.close()


async def test_a_publish_refused_as_a_conflict_is_not_taken_for_written(
    conflicts: FaultProxy, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A create-only write refused 409 was reported as AlreadyExists, which a publish takes
    for its own earlier attempt that landed: publish() returned an id that was never
    written. Now it looks, and raises."""
    config = queue_config_dict("s3", request, tmp_path)
    config["s3"] = {**config["s3"], "endpoint_url": conflicts.endpoint, "max_retries": 1}
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        conflicts.set_rules([FaultRule("conflict_409", 1.0, frozenset({"put"}), "/messages/")])
        with pytest.raises(PublishError, match="refused as a conflict, and not stored"):
            await producer.publish("t", {"n": 1})
        conflicts.set_rules([])
        assert await pq.store.list("t/messages/") == []
        mid = await producer.publish("t", {"n": 2})
        [message] = await (await pq.register_consumer("c", ["t"])).poll()
        assert message.id == mid


async def test_puts_racing_deletes_in_one_directory_lose_nothing(s3: S3Store, backend: str) -> None:
    """A lease or message PUT next to the DELETE that empties its "directory" (s3rver keeps
    keys as files and removes emptied directories; unpatched, this race made it exit)."""
    rounds = 150
    for n in range(rounds):
        await s3.put(f"d/{n}/old", b"x")
        await asyncio.gather(s3.delete(f"d/{n}/old"), s3.put(f"d/{n}/new", b"y"))
    listed = [meta.key for meta in await s3.list("d/")]
    assert sorted(listed) == sorted(f"d/{n}/new" for n in range(rounds))
    assert [(await s3.get(key)).data for key in listed[:3]] == [b"y"] * 3


async def test_lists_racing_deletes_list_what_remains(s3: S3Store, backend: str) -> None:
    """A LIST while keys under its prefix are deleted and written again answers what exists
    (s3rver keeps keys as files and lists by walking them; unpatched, a file deleted
    between being named and being read made the LIST answer 500)."""
    churned = [f"l/{n:02d}" for n in range(40)]
    await asyncio.gather(*(s3.put(key, b"x") for key in [*churned, "l/kept"]))
    lists_each = 50

    async def churn(listing: asyncio.Future[Any]) -> None:
        while not listing.done():
            await asyncio.gather(*(s3.delete(key) for key in churned))
            await asyncio.gather(*(s3.put(key, b"y") for key in churned))

    async def lists() -> None:
        for _ in range(lists_each):
            listed = {meta.key for meta in await s3.list("l/")}
            assert "l/kept" in listed and listed <= {*churned, "l/kept"}

    listing = asyncio.gather(lists(), lists())
    await asyncio.gather(listing, churn(listing))
