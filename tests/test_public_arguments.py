"""Every public method refuses a wrong value of each of its arguments, before anything is
claimed or written.

``consumer.listen(42)`` used to start and dead-letter every message; ``listen(h, retry=3)``
left the first failed message unsettled ("Task exception was never retrieved"); ``grace="x"``
and ``grace=-1`` were taken; ``poll(wait="5")`` raised a bare TypeError.

The cases walk the public signatures of the async classes and of their blocking twins: each
parameter gets the wrong values :data:`WRONG` lists for its name, and
:func:`test_every_parameter_has_wrong_values` fails for a parameter without any (a new method
or parameter included). The error is an ArgumentError, except where
:mod:`pawn_queue.exceptions` documents another: a ConfigError for the config, store URLs,
names and topic settings, a PayloadError for payloads and attributes.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from pawn_queue import ArgumentError, ConfigError, PayloadError, sync
from pawn_queue.client import PawnQueue
from pawn_queue.config import PawnQueueConfig
from pawn_queue.consumer import Consumer
from pawn_queue.message import Message
from pawn_queue.producer import Producer
from tests.helpers.support import poll_count


class Unrelated:
    """A value of no type any parameter takes."""

    def __repr__(self) -> str:
        return "Unrelated()"


def takes_no_message() -> None:
    """A handler that cannot be called with a message."""


def handle(message: object) -> None:
    """A handler that leaves its message to the visibility timeout."""


NAMES = [Unrelated(), 42, "", "a/b"]
SECONDS = [Unrelated(), "30", True, math.nan, math.inf, 0, -1]  # a number of seconds > 0
SECONDS_OR_ZERO = [Unrelated(), "30", True, math.nan, math.inf, -1]
COUNT = [Unrelated(), "4", True, 0, 1.5]  # a whole number >= 1
TEXT = [Unrelated(), 42, ""]  # a non-empty string

WRONG: dict[str, tuple[type[Exception], list[object]]] = {
    # the queue
    "config": (ConfigError, [Unrelated(), 42, None]),
    "url": (ConfigError, [Unrelated(), 42, "nowhere://x"]),
    "store": (ArgumentError, [Unrelated(), "memory://"]),
    "clock": (ArgumentError, [Unrelated(), 42]),
    "observers": (ArgumentError, [Unrelated(), "tracing", [Unrelated()]]),
    # names
    "name": (ConfigError, NAMES),
    "topic": (ConfigError, NAMES),
    "subscription": (ConfigError, NAMES),
    "topics": (ArgumentError, [Unrelated(), "t", []]),
    "message_id": (ArgumentError, [Unrelated(), 42, None]),
    # topic and subscription settings
    "max_receive_count": (ConfigError, COUNT),
    "max_pending": (ConfigError, COUNT),
    "retention_seconds": (ConfigError, SECONDS),
    "dedup_window_seconds": (ConfigError, SECONDS_OR_ZERO),
    "replay_window_seconds": (ConfigError, SECONDS_OR_ZERO),
    "retention_action": (ConfigError, [Unrelated(), 42, "keep"]),
    "claims": (ConfigError, [Unrelated(), 42, None, "minute", "Second"]),
    "filter": (ArgumentError, [Unrelated(), 42, {"source": 42}]),
    "start": (ArgumentError, [Unrelated(), 42, "now", datetime(2024, 1, 1)]),
    "linger_seconds": (ArgumentError, [Unrelated(), "0.5", True, math.nan, -1, 2]),
    # schedules
    "cron": (ArgumentError, [Unrelated(), 42, "", "* * *", "61 * * * *"]),
    "every": (ArgumentError, [Unrelated(), "30", True, math.nan, math.inf, 0, 0.5]),
    "timezone": (ArgumentError, [Unrelated(), 42, "", "Mars/Olympus_Mons"]),
    "jitter_seconds": (ArgumentError, SECONDS_OR_ZERO),
    "catch_up_seconds": (ArgumentError, SECONDS_OR_ZERO),
    "end": (ArgumentError, [Unrelated(), 42, "now", datetime(2024, 1, 1)]),
    # reading and redriving
    "limit": (ArgumentError, [Unrelated(), "5", True, 1.5, -1]),
    "ids": (ArgumentError, [Unrelated(), "id", [42]]),
    "per_second": (ArgumentError, [Unrelated(), "5", True, math.nan, math.inf, 0, -1]),
    "role": (ArgumentError, [Unrelated(), 42, "workers"]),
    "window": (ArgumentError, SECONDS),
    # publishing
    "payload": (PayloadError, [Unrelated(), math.nan, {"n": Unrelated()}]),
    "payloads": (ArgumentError, [Unrelated(), 42, "ab", b"ab", {"n": 1}]),
    "attributes": (PayloadError, [Unrelated(), {"k": 1}, {1: "v"}]),
    "delay": (ArgumentError, SECONDS_OR_ZERO),
    "group": (ArgumentError, TEXT),
    "dedup_id": (ArgumentError, TEXT),
    "wait_for_room": (ArgumentError, SECONDS_OR_ZERO),
    "expires_in": (ArgumentError, SECONDS),
    "priority": (ArgumentError, [Unrelated(), "9", True, 1.5, math.nan, None, -1, 10]),
    # consuming
    "visibility_timeout": (ArgumentError, SECONDS),
    "wait": (ArgumentError, SECONDS_OR_ZERO),
    "messages": (ArgumentError, [Unrelated(), "ab", [Unrelated()]]),
    "handler": (ArgumentError, [Unrelated(), 42, "handle", takes_no_message]),
    "retry": (ArgumentError, [Unrelated(), 3, {"max_receives": 3}]),
    "grace": (ArgumentError, SECONDS_OR_ZERO),
    "executor": (ArgumentError, [Unrelated(), 4]),
    "concurrency": (ArgumentError, COUNT),
    "workers": (ArgumentError, COUNT),
    "batch": (ArgumentError, COUNT),
    "batch_wait": (ArgumentError, SECONDS_OR_ZERO),
    "stop": (ArgumentError, [Unrelated(), True]),
    "max_in_flight": (ArgumentError, [*COUNT, 1001]),
    "rate_limit": (ArgumentError, [Unrelated(), 20, "", "0/s", "20/fortnight", "nan/s"]),
    # concurrency and rate limits (and ``limit`` above)
    "timeout": (ArgumentError, SECONDS_OR_ZERO),
    "rate": (ArgumentError, [Unrelated(), 20, "", "0/s", "20", "-1/s", "1/0s"]),
    # settling
    "seconds": (ArgumentError, SECONDS),
    "requeue": (ArgumentError, [Unrelated(), "yes", 1, None]),
    "reason": (ArgumentError, TEXT),
    "error": (ArgumentError, [Unrelated(), 42]),
}
"""Wrong values by parameter name, with the error each must raise."""

VALID: dict[str, object] = {
    "config": PawnQueueConfig.from_url("memory://"),
    "name": "t",
    "topic": "t",
    "topics": ["t"],
    "message_id": str(uuid.uuid4()),
    "payload": {"n": 3},
    "payloads": [{"n": 3}],
    "handler": handle,
    "reason": "test",
    "role": "consumers",
    "window": 60,
    "limit": 2,
    "rate": "20/s",
}
"""A value for each required parameter, given while another one is wrong."""

NOT_WALKED = {"seek": "its arguments are tested with it, in tests/protocol/test_replay.py"}

ASYNC_CLASSES: list[type] = [PawnQueue, Producer, Consumer, Message]
BLOCKING_CLASSES: list[type] = [
    sync.PawnQueue,
    sync.Producer,
    sync.Consumer,
    sync.Message,
    sync.Registry,
]
CONSTRUCTED = (PawnQueue, sync.PawnQueue)
"""The classes users construct themselves: their ``__init__`` is walked too (the others come
from a queue)."""


def public_parameters(cls: type) -> Iterator[tuple[str, list[inspect.Parameter]]]:
    """Each public method of ``cls`` (``__init__`` of a :data:`CONSTRUCTED` one) with its
    parameters, ``self`` and ``cls`` left out."""
    for name in sorted(dir(cls)):
        if name in NOT_WALKED or (name.startswith("_") and name != "__init__"):
            continue
        if name == "__init__" and cls not in CONSTRUCTED:
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, classmethod):
            yield name, list(inspect.signature(getattr(cls, name)).parameters.values())
        elif inspect.isfunction(raw):
            yield name, list(inspect.signature(raw).parameters.values())[1:]


@dataclass(frozen=True)
class Case:
    cls: type
    method: str
    param: str
    value: object

    @property
    def error(self) -> type[Exception]:
        return WRONG[self.param][0]

    def arguments(self) -> dict[str, object]:
        """The wrong value, a valid one for each other required parameter, and what makes
        the wrong one the only wrong one: ``batch_wait`` is ``batch``'s, and a blocking
        ``listen`` given a stop that is set returns at once should it take every value."""
        params = dict(public_parameters(self.cls))[self.method]
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        given = {name: VALID[name] for name in required if name != self.param}
        if self.param == "batch_wait":
            given["batch"] = 2
        if any(p.name == "stop" for p in params) and self.param != "stop":
            stop = threading.Event()
            stop.set()
            given["stop"] = stop
        return {**given, self.param: self.value}

    def __str__(self) -> str:
        value = getattr(self.value, "__name__", None) or repr(self.value)
        return f"{self.cls.__name__}.{self.method}({self.param}={value})"


def cases(classes: list[type]) -> list[Case]:
    return [
        Case(cls, method, param.name, value)
        for cls in classes
        for method, params in public_parameters(cls)
        for param in params
        for value in WRONG.get(param.name, (None, []))[1]
    ]


def test_every_parameter_has_wrong_values() -> None:
    found = {
        param.name
        for cls in ASYNC_CLASSES + BLOCKING_CLASSES
        for _, params in public_parameters(cls)
        for param in params
    }
    assert sorted(found - WRONG.keys()) == [], "give these parameters wrong values in WRONG"
    assert sorted(WRONG.keys() - found) == [], "no public method has these parameters"


def test_the_walk_finds_the_public_methods() -> None:
    methods = {f"{c.__name__}.{m}" for c in ASYNC_CLASSES for m, _ in public_parameters(c)}
    assert {"PawnQueue.__init__", "PawnQueue.from_url", "Consumer.listen", "Message.nack"} <= (
        methods
    )
    assert "Consumer.__init__" not in methods  # obtained from register_consumer


@dataclass
class World:
    """A queue on a fresh memory store: topic ``t`` with a message claimed by ``consumer``
    (``message``) and one pending."""

    queue: Any
    producer: Any
    consumer: Any
    message: Any

    def target(self, case: Case) -> Callable[..., Any]:
        if case.method == "__init__":
            return case.cls
        owner = {
            "PawnQueue": self.queue,
            "Producer": self.producer,
            "Consumer": self.consumer,
            "Message": self.message,
            "BlockingMessage": self.message,
            "Registry": self.queue.registry,
        }[case.cls.__name__]
        method: Callable[..., Any] = getattr(owner, case.method)
        return method


async def stored(queue: PawnQueue) -> dict[str, str]:
    """Every object of the store with its etag, but the change signals and the process
    records, which the queue writes in the background."""
    metas = await queue.store.list("")
    return {
        m.key: m.etag for m in metas if not m.key.startswith(("_notify/", "_registry/instances/"))
    }


@asynccontextmanager
async def async_world() -> AsyncIterator[World]:
    async with PawnQueue.from_url("memory://") as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", ["t"])
        await producer.publish("t", {"n": 1})
        [message] = await poll_count(consumer, 1)
        await producer.publish("t", {"n": 2})
        yield World(pq, producer, consumer, message)


@contextmanager
def blocking_world() -> Iterator[World]:
    with sync.PawnQueue.from_url("memory://") as pq:
        pq.create_topic("t")
        producer = pq.register_producer("p")
        consumer = pq.register_consumer("c", ["t"])
        producer.publish("t", {"n": 1})
        [message] = consumer.poll()
        producer.publish("t", {"n": 2})
        yield World(pq, producer, consumer, message)


GUARD_SECONDS = 5.0
"""How long a call may run before the test gives up on it: a ``listen()`` that took its
arguments would run until cancelled."""


@pytest.mark.parametrize("case", cases(ASYNC_CLASSES), ids=str)
async def test_async_api_refuses_wrong_values(case: Case) -> None:
    async with async_world() as world:
        before = await stored(world.queue)
        call = world.target(case)
        with pytest.raises(case.error) as info:
            async with asyncio.timeout(GUARD_SECONDS):
                result = call(**case.arguments())
                if inspect.isawaitable(result):
                    await result
        assert case.param in str(info.value)
        assert await stored(world.queue) == before
        assert not world.message.settled and world.message.lease_held


@pytest.mark.parametrize("case", cases(BLOCKING_CLASSES), ids=str)
def test_blocking_api_refuses_wrong_values(case: Case) -> None:
    with blocking_world() as world:
        queue = world.queue._queue  # the async queue it runs, to read its store

        def store_now() -> dict[str, str]:
            return world.queue._runner.call(stored(queue))  # type: ignore[no-any-return]

        before = store_now()
        call = world.target(case)
        with pytest.raises(case.error) as info:
            call(**case.arguments())
        assert case.param in str(info.value)
        assert store_now() == before
        assert not world.message.settled and world.message.lease_held
