"""Throttling is back-pressure: what a store refuses for its request rate is sent again,
backing off, and a caller sees it only past the store's throttle timeout (docs/protocol.md,
"Request rates")."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import StoreThrottledError
from pawn_queue.metrics import MetricsStore, QueueMetrics
from pawn_queue.store import open_store
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.throttling import ThrottleBackoff, throttle_backoff_of
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from tests.helpers.limits import limited
from tests.helpers.stores import queue_config_dict
from tests.servers.fault_proxy import FaultProxy, FaultRule
from tests.servers.seaweedfs import SeaweedFS

T = TypeVar("T")


class Refusing(StoreWrapper):
    """Refuses the first ``times`` calls for the request rate, asking ``retry_after``."""

    def __init__(self, times: int, retry_after: float | None = None) -> None:
        super().__init__(MemoryStore())
        self.times = times
        self.retry_after = retry_after
        self.calls = 0

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        self.calls += 1
        if self.calls <= self.times:
            raise StoreThrottledError("refused (test)", retry_after=self.retry_after)
        return await run()


class Pauses:
    """A sleep that records what it was asked and returns at once."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


async def test_a_refused_write_goes_through_after_a_pause_of_a_second_or_more() -> None:
    store, limit = limited(MemoryStore())
    await store.put("k", b"1")
    await store.put("k", b"2")  # within the key's second: refused once, then sent again
    assert limit.refused["key"] == 1
    assert (await store.get("k")).data == b"2"
    backoff = throttle_backoff_of(store)
    assert backoff is not None and backoff.throttled == 1


async def test_pauses_double_from_one_second_and_the_store_s_retry_after_wins() -> None:
    pauses = Pauses()
    refusing = Refusing(times=4)
    store = ThrottleBackoff(refusing, timeout_seconds=600, sleep=pauses)
    await store.put("k", b"x")
    assert refusing.calls == 5 and len(pauses.asked) == 4
    for asked, base in zip(pauses.asked, [1, 2, 4, 8], strict=True):
        assert base <= asked <= base * 1.5
    pauses = Pauses()
    store = ThrottleBackoff(Refusing(times=2, retry_after=7.0), timeout_seconds=600, sleep=pauses)
    await store.list("")
    assert pauses.asked == [7.0, 7.0]


async def test_the_caller_sees_the_refusal_once_the_timeout_would_pass() -> None:
    pauses = Pauses()
    refusing = Refusing(times=1000)
    store = ThrottleBackoff(refusing, timeout_seconds=2.0, sleep=pauses)
    with pytest.raises(StoreThrottledError):
        await store.put("k", b"x")
    # One pause of 1-1.5 s fits in 2 s, the next (2-3 s) would not: sent twice.
    assert refusing.calls == 2 and len(pauses.asked) == 1


async def test_refusals_are_logged_once_a_minute_and_counted_in_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    backoff = ThrottleBackoff(Refusing(times=5), sleep=Pauses())
    store = MetricsStore(backoff, QueueMetrics(registry))
    with caplog.at_level(logging.WARNING, logger="pawn_queue.store.throttling"):
        await store.put("k", b"x")
        await store.get("k")
    lines = [r.getMessage() for r in caplog.records if r.name == "pawn_queue.store.throttling"]
    assert len(lines) == 1 and "refused 1 request(s)" in lines[0] and "'k'" in lines[0]
    assert registry.get_sample_value("pawnqueue_store_throttled_total", {"operation": "put"}) == 5
    ok = {"operation": "put", "outcome": "ok"}
    assert registry.get_sample_value("pawnqueue_store_requests_total", ok) == 1


# -- S3: the answers as a provider gives them ------------------------------------------------


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint, seed=3, max_lifetime_seconds=120) as running:
        yield running


def s3_through(proxy: FaultProxy, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    config = queue_config_dict("s3", request, tmp_path)
    s3 = {**config["s3"], "endpoint_url": proxy.endpoint, "max_retries": 0}
    return PawnQueueConfig.from_dict({**config, "s3": s3})


async def test_s3_slowdown_is_a_throttle_and_is_sent_again(
    proxy: FaultProxy, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = open_store(s3_through(proxy, request, tmp_path))
    backoff = throttle_backoff_of(store)
    assert backoff is not None and repr(store).startswith("S3Store(")
    try:
        await store.list("", limit=1)  # the bucket exists
        proxy.set_rules([FaultRule("slowdown_503", 1.0, frozenset({"put"}), limit=2)])
        await store.put("k", b"x")
        assert backoff.throttled == 2 and proxy.stats()["slowdown_503"] == 2
        proxy.set_rules([FaultRule("slowdown_503", 1.0, frozenset({"get"}), limit=1)])
        with pytest.raises(StoreThrottledError) as raised:
            await backoff.inner.get("k")  # the store alone: the refusal as it reads
        assert "HTTP 503 SlowDown" in str(raised.value)
    finally:
        await store.close()


async def test_doctor_reports_a_store_that_throttles(
    proxy: FaultProxy, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from pawn_queue import PawnQueue
    from pawn_queue.cli.doctor import diagnose

    async with PawnQueue(s3_through(proxy, request, tmp_path)) as pq:
        await pq.setup()
        proxy.set_rules([FaultRule("slowdown_503", 1.0, frozenset({"put"}), limit=2)])
        report = await diagnose(pq)
    rate = [c for c in report.checks if c.name == "request rate"]
    assert len(rate) == 1 and rate[0].status == "warn", report.checks
    assert "refused 2 request(s)" in rate[0].detail and report.ok
    proxy.set_rules([])
    async with PawnQueue(s3_through(proxy, request, tmp_path)) as pq:
        report = await diagnose(pq)
    assert [c.status for c in report.checks if c.name == "request rate"] == ["ok"]
