"""StoreWrapper, the one base of store wrappers, and the wrappers built on it (counting,
metrics, the tests' fault injection), on the real memory store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from pawn_queue import PawnQueue, PawnQueueConfig
from pawn_queue.exceptions import AlreadyExists, NotFound
from pawn_queue.store.base import IfMatch
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from tests.helpers.faults import FaultyStore

T = TypeVar("T")


class Recording(StoreWrapper):
    """Records each call with what the store answered (or the error's type)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.seen: list[tuple[StoreCall, object]] = []

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await run()
        except Exception as exc:
            self.seen.append((call, type(exc)))
            raise
        self.seen.append((call, result))
        return result


async def test_every_call_goes_through_around() -> None:
    inner = MemoryStore()
    store = Recording(inner)
    etag = await store.put("a/1", b"one", mode="create", durable=False)
    await store.put("a/1", b"two", mode=IfMatch(etag))
    assert (await store.get("a/1")).data == b"two"
    head = await store.head("a/1")
    assert [m.key for m in await store.list("a/", start_after="a/0", limit=5)] == ["a/1"]
    with pytest.raises(AlreadyExists):
        await store.put("a/1", b"x", mode="create")
    await store.delete("a/1")
    with pytest.raises(NotFound):
        await store.get("a/1")
    await store.delete_many(["b", "c"])

    calls = [call for call, _ in store.seen]
    assert calls == [
        StoreCall("put", "a/1", mode="create", durable=False),
        StoreCall("put", "a/1", mode=IfMatch(etag)),
        StoreCall("get", "a/1"),
        StoreCall("head", "a/1"),
        StoreCall("list", "a/", start_after="a/0", limit=5),
        StoreCall("put", "a/1", mode="create"),
        StoreCall("delete", "a/1"),
        StoreCall("get", "a/1"),
        StoreCall("delete_many", keys=("b", "c")),
    ]
    outcomes = [outcome for _, outcome in store.seen]
    assert outcomes[0] == etag and outcomes[3] == head
    assert outcomes[5] is AlreadyExists and outcomes[7] is NotFound
    assert repr(store) == f"Recording({inner!r})"
    await store.close()


async def test_a_wrapped_local_store_gets_no_request_at_setup() -> None:
    """setup() sends nothing to memory or a local directory, inside any wrapper too."""
    store = Recording(Recording(MemoryStore()))
    async with PawnQueue(PawnQueueConfig.from_url("memory://"), store=store) as pq:
        assert pq.strategy == "conditional_write"
        assert store.seen == []
        await pq.create_topic("t")
        assert store.seen


async def test_counting_store_counts_s3_requests() -> None:
    store = CountingStore(MemoryStore())
    keys = [f"k/{i:04d}" for i in range(1001)]
    for key in keys:
        await store.put(key, b"")
    etag = await store.put("x", b"", mode="create")
    await store.put("x", b"", mode=IfMatch(etag))
    with pytest.raises(NotFound):  # a failed request costs the same
        await store.get("missing")
    await store.head("x")
    assert len(await store.list("k/")) == 1001  # two pages
    await store.list("nothing/")  # one request, even when empty
    await store.delete("x")
    await store.delete_many(keys)  # two DeleteObjects requests
    await store.delete_many([])  # none
    assert store.reset() == {
        "PUT": 1001,
        "PUT create": 1,
        "PUT if-match": 1,
        "GET": 1,
        "HEAD": 1,
        "LIST": 3,
        "DELETE": 3,
    }
    assert store.counts == {}
    assert repr(store) == f"CountingStore({store.inner!r})"


async def test_metrics_store_counts_by_operation_and_outcome() -> None:
    from prometheus_client import CollectorRegistry

    from pawn_queue.metrics import MetricsStore, QueueMetrics

    registry = CollectorRegistry()
    store = MetricsStore(MemoryStore(), QueueMetrics(registry))
    etag = await store.put("t/messages/1", b"", mode="create")
    await store.put("t/messages/1", b"", mode=IfMatch(etag))
    await store.put("t/dead-letter/1", b"")
    with pytest.raises(AlreadyExists):
        await store.put("t/dead-letter/1", b"", mode="create")
    with pytest.raises(NotFound):
        await store.head("nothing")
    await store.list("t/")
    await store.delete_many(["t/messages/1"])

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"pawnqueue_{name}", labels)

    requests = "store_requests_total"
    assert value(requests, operation="put_create", outcome="ok") == 1
    assert value(requests, operation="put_create", outcome="already_exists") == 1
    assert value(requests, operation="put_if_match", outcome="ok") == 1
    assert value(requests, operation="put", outcome="ok") == 1
    assert value(requests, operation="head", outcome="not_found") == 1
    assert value(requests, operation="list", outcome="ok") == 1
    assert value(requests, operation="delete_many", outcome="ok") == 1
    assert value("store_request_seconds_count", operation="put_create") == 2
    # Dead letters are counted from settlements (tests/test_metrics.py), not from keys.
    assert value("messages_dead_lettered_total", topic="t") is None


async def test_faulty_store_hooks_and_observers() -> None:
    events: list[tuple[str, str, str]] = []

    async def hook(operation: str, key: str) -> None:
        events.append(("before", operation, key))
        if key == "refused":
            raise RuntimeError("injected")

    async def observer(operation: str, key: str) -> None:
        events.append(("after", operation, key))

    store = FaultyStore(MemoryStore(), hooks=[hook], observers=[observer])
    await store.put("a", b"")
    await store.get("a")
    await store.list("a")
    with pytest.raises(RuntimeError):
        await store.put("refused", b"")
    with pytest.raises(AlreadyExists):
        await store.put("a", b"", mode="create")
    await store.delete_many(["a", "b"])
    assert events == [
        ("before", "put", "a"),
        ("after", "put", "a"),
        ("before", "get", "a"),
        ("before", "list", "a"),
        ("before", "put", "refused"),
        ("before", "put", "a"),
        ("before", "delete", "a"),
        ("before", "delete", "b"),
        ("after", "delete", "a"),
        ("after", "delete", "b"),
    ]
    assert not await store.list("")
    assert repr(store) == f"FaultyStore({store.inner!r})"
