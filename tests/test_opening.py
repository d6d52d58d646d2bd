"""``PawnQueue.from_config`` and ``PawnQueue.from_url`` are used the same way: awaited or not,
in ``async with`` directly or after an ``await``.

``from_config`` had to be awaited and ``from_url`` must not be: ``async with await
PawnQueue.from_url(...)`` raised "object PawnQueue can't be used in 'await' expression", and
``async with PawnQueue.from_config(...)`` "'coroutine' object does not support the
asynchronous context manager protocol", while the docs offered the two side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import assert_type

import pytest
import yaml

from pawn_queue import PawnQueue, PawnQueueError, sync
from tests.helpers.support import poll_count

Opener = Callable[[], PawnQueue]


@pytest.fixture(params=["from_url", "from_config"])
def open_queue(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """``PawnQueue.from_url`` or ``PawnQueue.from_config`` (a YAML file) of one directory."""
    directory = tmp_path / "queue"
    if request.param == "from_url":
        return lambda: PawnQueue.from_url(f"file://{directory}")
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump({"backend": "filesystem", "filesystem": {"path": str(directory)}}),
        encoding="utf-8",
    )
    return lambda: PawnQueue.from_config(path)


async def round_trip(pq: PawnQueue) -> None:
    """Publish a message and take it: the queue works."""
    await pq.create_topic("orders")
    producer = await pq.register_producer("shop")
    consumer = await pq.register_consumer("billing", ["orders"])
    sent = await producer.publish("orders", {"order_id": 42})
    [message] = await poll_count(consumer, 1)
    assert (message.id, message.payload) == (sent, {"order_id": 42})
    await message.ack()


async def assert_closed(pq: PawnQueue) -> None:
    with pytest.raises(PawnQueueError, match="not set up"):
        await pq.list_topics()


async def test_async_with_opens_and_closes(open_queue: Opener) -> None:
    async with open_queue() as pq:
        await round_trip(pq)
    await assert_closed(pq)


async def test_async_with_await_opens_and_closes(open_queue: Opener) -> None:
    async with await open_queue() as pq:
        await round_trip(pq)
    await assert_closed(pq)


async def test_awaited_gives_the_queue_not_set_up(open_queue: Opener) -> None:
    pq = await open_queue()
    assert_type(pq, PawnQueue)
    assert isinstance(pq, PawnQueue)
    await assert_closed(pq)
    async with pq:
        await round_trip(pq)
    await assert_closed(pq)


async def test_not_awaited_gives_the_queue_not_set_up(open_queue: Opener) -> None:
    pq = open_queue()
    await assert_closed(pq)
    await pq.setup()
    try:
        await round_trip(pq)
    finally:
        await pq.teardown()
    await assert_closed(pq)


async def test_awaiting_a_queue_gives_itself() -> None:
    pq = PawnQueue.from_url("memory://")
    assert await pq is pq
    async with pq:
        assert await pq is pq  # and sets nothing up or down
        await round_trip(pq)


@pytest.mark.parametrize("opening", ["from_url", "from_config"])
def test_the_blocking_queue_opens_either_way(opening: str, tmp_path: Path) -> None:
    directory = tmp_path / "queue"

    def open_queue() -> sync.PawnQueue:
        if opening == "from_url":
            return sync.PawnQueue.from_url(f"file://{directory}")
        return sync.PawnQueue.from_config(
            {"backend": "filesystem", "filesystem": {"path": str(directory)}}
        )

    with open_queue() as pq:
        pq.create_topic("orders")
        sent = pq.register_producer("shop").publish("orders", {"order_id": 42})
        [message] = pq.register_consumer("billing", ["orders"]).poll()
        assert message.id == sent
        message.ack()
    with pytest.raises(PawnQueueError):
        pq.list_topics()
    unopened = open_queue()
    with pytest.raises(PawnQueueError, match="not set up"):
        unopened.list_topics()
    unopened.setup()
    try:
        assert unopened.list_topics() == ["orders"]
    finally:
        unopened.close()
