"""The blocking API kept in step with the async one (issue 40, "Layers you can see").

:mod:`pawn_queue.sync` re-declares the methods of ``PawnQueue``, ``Producer`` and
``Consumer``. Every public member of an async class (its ``from_*`` constructors,
properties, the ``with`` protocols and ``PawnQueue(...)`` itself included; ``Producer`` and
``Consumer`` are made by ``register_*``) must have a blocking twin of the same name, with
the same parameters in the same order (names, kinds, defaults, annotations) and the same
return type, an async class standing for its blocking twin (:data:`TWINS`). A twin method
must block: it is no coroutine function.

What differs on purpose is listed, with its reason, in :data:`ONE_SIDE_ONLY` (a member
without a twin) and :data:`PARAMETER_DIFFERENCES` (a parameter, or ``"return"``, that
differs). A listed difference that no longer holds fails too, so the lists cannot rot.
"""

from __future__ import annotations

import inspect
import re
import threading
import time
import typing
from collections.abc import Callable
from typing import Any

import pytest

import pawn_queue
from pawn_queue import client, consumer, producer, sync
from pawn_queue.registry import Registry

CLASSES: dict[str, tuple[type, type]] = {
    "PawnQueue": (client.PawnQueue, sync.PawnQueue),
    "Producer": (producer.Producer, sync.Producer),
    "Consumer": (consumer.Consumer, sync.Consumer),
}
"""Each async class and its blocking twin, by name."""

TWINS: dict[type, type] = {
    **dict(CLASSES.values()),
    pawn_queue.Message: sync.Message,
    Registry: sync.Registry,
}
"""The async classes that stand for a blocking one in an annotation."""

_PROTOCOLS = frozenset({"__aenter__", "__aexit__", "__await__", "__enter__", "__exit__"})
_BUILT_BY_USERS = frozenset({"PawnQueue"})  # whose __init__ is public

ONE_SIDE_ONLY: dict[tuple[str, str], str] = {
    ("PawnQueue", "__aenter__"): "async with; the blocking queue has __enter__",
    ("PawnQueue", "__aexit__"): "async with; the blocking queue has __exit__",
    ("PawnQueue", "__await__"): (
        "lets 'await PawnQueue.from_config(...)' work; nothing is awaited in the blocking API"
    ),
    ("PawnQueue", "__enter__"): "with; the async queue has __aenter__",
    ("PawnQueue", "__exit__"): "with; the async queue has __aexit__",
    ("PawnQueue", "close"): (
        "the blocking teardown (teardown is its alias): it also joins the loop thread, so it "
        "is final, where the async queue may be set up again"
    ),
    ("PawnQueue", "store"): (
        "the async store, for tools and tests on the queue's own loop: its methods are "
        "coroutines, which code without asyncio could not call"
    ),
    ("PawnQueue", "runtime"): "the async core's protocol objects, for tools and tests",
    ("Consumer", "held_leases"): (
        "the async LeaseKeeper, whose methods are coroutines; the blocking consumer has "
        "release_all()"
    ),
}
"""Members of one side without a twin on the other, by (class, member)."""

PARAMETER_DIFFERENCES: dict[tuple[str, str, str], str] = {
    ("PawnQueue", "__init__", "clock"): (
        "a test hook (a skewed host clock); tests of clock skew drive the async core"
    ),
    ("PawnQueue", "concurrency_limit", "return"): (
        "async with on the async queue, with on the blocking one: both hold a LimitSlot"
    ),
    ("PawnQueue", "rate_limit", "return"): (
        "async with on the async queue, with on the blocking one: both wait for a permit"
    ),
    ("PawnQueue", "run_schedules", "stop"): (
        "blocking only: a threading.Event that ends run_schedules(); the async runner ends "
        "when its task is cancelled"
    ),
    ("Consumer", "listen", "stop"): (
        "blocking only: a threading.Event that ends listen(); the async listener ends when "
        "its task is cancelled"
    ),
    ("Consumer", "listen", "workers"): (
        "blocking only: the size of the thread pool plain handlers run in, which the "
        "blocking listen() owns"
    ),
    ("Consumer", "listen", "executor"): (
        "async only: the blocking listen() runs plain handlers in its own pool ('workers')"
    ),
}
"""Parameters (or ``"return"``) that differ on purpose, by (class, member, parameter)."""


def _members(name: str, cls: type) -> set[str]:
    """The members of ``cls`` the twins must share: its public ones, its with protocols, and
    ``__init__`` for a class users build themselves."""
    members = {m for m in dir(cls) if not m.startswith("_") or m in _PROTOCOLS}
    if name in _BUILT_BY_USERS:
        members.add("__init__")
    return members


def _shown(annotation: object, *, of_async: bool) -> str:
    """An evaluated annotation as text. In async code (``of_async``) each async class is
    named as its blocking twin; in blocking code it keeps its name, so that a blocking method
    declared to return an async object differs."""
    text = inspect.formatannotation(annotation)
    if not of_async:
        return text
    for async_cls, blocking_cls in TWINS.items():
        async_name = re.escape(f"{async_cls.__module__}.{async_cls.__qualname__}")
        blocking_name = f"{blocking_cls.__module__}.{blocking_cls.__qualname__}"
        text = re.sub(rf"(?<![\w.]){async_name}(?![\w.])", blocking_name, text)
    return text


def _attribute_type(cls: type, name: str, *, of_async: bool) -> str | None:
    """The type a property or forwarded attribute gives; None if it is neither."""
    member = inspect.getattr_static(cls, name)
    if isinstance(member, property) and member.fget is not None:
        returned = inspect.signature(member.fget, eval_str=True).return_annotation
        return _shown(returned, of_async=of_async)
    origin = getattr(member, "__orig_class__", None)  # Forwarded[T]() in pawn_queue.sync
    if origin is not None:
        return _shown(typing.get_args(origin)[0], of_async=of_async)
    return None


def _parameter(parameter: inspect.Parameter | None, *, of_async: bool) -> str:
    if parameter is None:
        return "none"
    default = "" if parameter.default is inspect.Parameter.empty else f" = {parameter.default!r}"
    shown = _shown(parameter.annotation, of_async=of_async)
    return f"{parameter.kind.description} {shown}{default}"


def _signature_differences(
    async_member: Callable[..., Any], blocking_member: Callable[..., Any]
) -> dict[str, str]:
    """What differs between two signatures, by parameter name (``"return"`` for the return
    type, ``"order"`` for the order of the parameters both have)."""
    theirs = inspect.signature(async_member, eval_str=True)
    ours = inspect.signature(blocking_member, eval_str=True)
    found: dict[str, str] = {}
    for name in theirs.parameters.keys() | ours.parameters.keys():
        a, b = theirs.parameters.get(name), ours.parameters.get(name)
        same = (
            a is not None
            and b is not None
            and a.kind == b.kind
            and (a.default is b.default or a.default == b.default)
            and _shown(a.annotation, of_async=True) == _shown(b.annotation, of_async=False)
        )
        if not same:
            shown = _parameter(a, of_async=True), _parameter(b, of_async=False)
            found[name] = f"async: {shown[0]}; blocking: {shown[1]}"
    shared = [name for name in theirs.parameters if name in ours.parameters]
    if shared != [name for name in ours.parameters if name in theirs.parameters]:
        found["order"] = f"async: {list(theirs.parameters)}; blocking: {list(ours.parameters)}"
    returned = (
        _shown(theirs.return_annotation, of_async=True),
        _shown(ours.return_annotation, of_async=False),
    )
    if returned[0] != returned[1]:
        found["return"] = f"async: {returned[0]}; blocking: {returned[1]}"
    return found


def _differences(name: str, member: str) -> dict[str, str]:
    """What differs between ``member`` of the async class ``name`` and of its twin."""
    async_cls, blocking_cls = CLASSES[name]
    async_type = _attribute_type(async_cls, member, of_async=True)
    blocking_type = _attribute_type(blocking_cls, member, of_async=False)
    if async_type is not None or blocking_type is not None:
        if async_type != blocking_type:
            return {"return": f"async: {async_type}; blocking: {blocking_type}"}
        return {}
    kinds = [type(inspect.getattr_static(c, member)).__name__ for c in (async_cls, blocking_cls)]
    if kinds[0] != kinds[1]:  # a classmethod against a method...
        return {"kind": f"async: {kinds[0]}; blocking: {kinds[1]}"}
    blocking_member = getattr(blocking_cls, member)
    found = _signature_differences(getattr(async_cls, member), blocking_member)
    if inspect.iscoroutinefunction(blocking_member):
        found["blocks"] = "the blocking twin is a coroutine function"
    return found


SHARED = sorted(
    (name, member)
    for name, (async_cls, blocking_cls) in CLASSES.items()
    for member in _members(name, async_cls) & _members(name, blocking_cls)
)


@pytest.mark.parametrize(("name", "member"), SHARED, ids=[f"{n}.{m}" for n, m in SHARED])
def test_twins_take_the_same_parameters(name: str, member: str) -> None:
    found = _differences(name, member)
    listed = {p for (n, m, p) in PARAMETER_DIFFERENCES if (n, m) == (name, member)}
    unlisted = {p: why for p, why in found.items() if p not in listed}
    assert not unlisted, f"{name}.{member} differs (fix it, or list it): {unlisted}"
    stale = listed - found.keys()
    assert not stale, f"{name}.{member}: listed differences that no longer hold: {stale}"


@pytest.mark.parametrize("name", CLASSES)
def test_every_member_has_a_twin(name: str) -> None:
    async_cls, blocking_cls = CLASSES[name]
    theirs, ours = _members(name, async_cls), _members(name, blocking_cls)
    alone = {(name, m) for m in theirs ^ ours}
    listed = {key for key in ONE_SIDE_ONLY if key[0] == name}
    unlisted = sorted(
        f"{m} ({'async' if m in theirs else 'blocking'} only)" for _, m in alone - listed
    )
    assert not unlisted, f"{name}: members without a twin (add it, or list it): {unlisted}"
    stale = sorted(m for _, m in listed - alone)
    assert not stale, f"{name}: listed as one side only, but on both sides or neither: {stale}"


def test_listed_differences_are_of_shared_members() -> None:
    """A difference listed for a member that is gone (or on one side only) is never checked
    by the test above: it must go too."""
    listed = {(name, member) for name, member, _ in PARAMETER_DIFFERENCES}
    assert listed <= set(SHARED)


def test_a_difference_is_found() -> None:
    """The comparison sees what it must (a test that cannot fail proves nothing)."""

    class Async:
        async def get(self, key: str, *, wait: float = 1.0) -> client.PawnQueue:
            raise NotImplementedError

    class Blocking:
        def get(self, key: str, wait: float = 2.0, *, extra: int = 0) -> client.PawnQueue:
            raise NotImplementedError

        async def same(self, key: str, *, wait: float = 1.0) -> sync.PawnQueue:
            raise NotImplementedError

    found = _signature_differences(Async.get, Blocking.get)
    assert found.keys() == {"wait", "extra", "return"}
    assert _signature_differences(Async.get, Blocking.same) == {}


def test_listen_passes_concurrency_on() -> None:
    """``concurrency`` (once missing from the blocking listen) takes effect: with 1, handlers
    never overlap, though one poll brings four messages and four threads wait for them."""
    with sync.PawnQueue.from_url("memory://") as pq:
        pq.create_topic("jobs")
        producer = pq.register_producer("p")
        for n in range(4):
            producer.publish("jobs", n)
        consumer = pq.register_consumer("c", ["jobs"])
        lock, stop = threading.Lock(), threading.Event()
        running, most, handled = 0, 0, 0

        def handler(message: sync.Message) -> None:
            nonlocal running, most, handled
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.05)  # long enough for the others to start, were they allowed to
            message.ack()
            with lock:
                running -= 1
                handled += 1
                if handled == 4:
                    stop.set()

        consumer.listen(handler, stop=stop, workers=4, concurrency=1)
    assert (handled, most) == (4, 1)
