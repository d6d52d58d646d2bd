"""Handlers: how ``listen()`` calls a handler, whether it is a coroutine function or a plain one.

A coroutine function (``async def``) runs on the event loop and receives the async
:class:`~pawn_queue.Message`. A plain function runs in a worker thread and receives a
:class:`BlockingMessage`, whose ``ack()``, ``nack()``, ``extend()`` and ``dead_letter()``
block that thread until the loop has done them. Both kinds work in both APIs
(``pawn_queue.Consumer.listen`` and ``pawn_queue.sync.Consumer.listen``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import Executor
from typing import Any, Generic, Protocol, TypeVar, cast

from pawn_queue._protocol.delivery import Message
from pawn_queue.exceptions import ArgumentError, PawnQueueError

T = TypeVar("T")

Handler = Callable[[Any], Any]  # async def handler(message) or def handler(message)
AsyncHandler = Callable[[Message], Awaitable[Any]]
# A batch handler's: it takes a list of messages (``listen(handler, batch=N)``).
AsyncBatchHandler = Callable[[list[Message]], Awaitable[Any]]


class LoopCaller(Protocol):
    """Runs a coroutine on an event loop from another thread and waits for its result."""

    def call(self, coro: Coroutine[Any, Any, T], *, on_close: bool = True) -> T: ...


class Forwarded(Generic[T]):
    """A read-only attribute forwarded to the wrapped async object (``self._inner``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        return cast(T, getattr(obj._inner, self._name))


class BlockingMessage:
    """A claimed message. ``ack()``, ``nack()`` (idempotent) and ``extend()`` block; call
    them from any thread but the loop's. A lost lease raises ``LeaseLostError``.

    Read-only, as in the async API: ``id``, ``topic``, ``subscription``, ``producer_id``,
    ``created_at`` (ISO-8601 UTC), ``payload``, ``attributes``, ``expires_at``,
    ``priority``, ``receive_count``, ``settled`` (acked or nacked) and ``lease_held``.
    """

    __slots__ = ("_inner", "_runner")
    id = Forwarded[str]()
    topic = Forwarded[str]()
    subscription = Forwarded[str | None]()
    queue = Forwarded[str]()
    producer_id = Forwarded[str]()
    created_at = Forwarded[str]()
    payload = Forwarded[Any]()
    attributes = Forwarded[dict[str, str]]()
    group = Forwarded[str | None]()
    expires_at = Forwarded[str | None]()
    priority = Forwarded[int]()
    receive_count = Forwarded[int]()
    settled = Forwarded[bool]()
    lease_held = Forwarded[bool]()

    def __init__(self, inner: Message, runner: LoopCaller) -> None:
        self._inner = inner
        self._runner = runner

    def __repr__(self) -> str:
        return repr(self._inner)

    def ack(self) -> None:
        """Remove the message from the queue: it will not be delivered again."""
        self._runner.call(self._inner.ack(), on_close=False)

    def nack(self, requeue: bool = False, delay: float = 0) -> None:
        """Dead-letter the message (durable copy first), or with ``requeue=True`` make it
        visible again after ``delay`` seconds."""
        self._runner.call(self._inner.nack(requeue, delay), on_close=False)

    def extend(self, seconds: float) -> None:
        """Keep the message for ``seconds`` from now; the refresh keeps renewing by that much."""
        self._runner.call(self._inner.extend(seconds), on_close=False)

    def dead_letter(self, reason: str, error: str | None = None) -> None:
        """Dead-letter with a reason (and an error text)."""
        self._runner.call(self._inner.dead_letter(reason, error), on_close=False)


class _LoopBridge:
    """A :class:`LoopCaller` for one running loop (the async API's own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def call(self, coro: Coroutine[Any, Any, T], *, on_close: bool = True) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise PawnQueueError(
                "a blocking message method was called on the event loop; in a coroutine "
                "handler use the async message (await message.ack())"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


def is_coroutine_handler(handler: Handler) -> bool:
    """Whether ``handler`` is an ``async def`` function (or a partial or object of one)."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def as_async(
    handler: Handler,
    *,
    executor: Executor | None = None,
    runner: LoopCaller | None = None,
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
) -> AsyncHandler:
    """``handler`` as a coroutine function over async messages.

    A plain function runs in ``executor`` (default: the loop's) with a
    :class:`BlockingMessage` whose methods reach the loop through ``runner`` (default: the
    running loop); ``wrap`` may wrap the call in that thread. What it returns is returned
    (an awaitable is awaited on the loop first)."""
    return cast(AsyncHandler, _on_loop(handler, executor, runner, wrap))


def as_async_batch(
    handler: Handler,
    *,
    executor: Executor | None = None,
    runner: LoopCaller | None = None,
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
) -> AsyncBatchHandler:
    """As :func:`as_async`, for a handler of a list of messages: a plain function gets a
    list of :class:`BlockingMessage`."""
    return cast(AsyncBatchHandler, _on_loop(handler, executor, runner, wrap))


def _on_loop(
    handler: Handler,
    executor: Executor | None,
    runner: LoopCaller | None,
    wrap: Callable[[Callable[[], Any]], Callable[[], Any]] | None,
) -> Callable[[Any], Awaitable[Any]]:
    if is_coroutine_handler(handler):
        return cast(Callable[[Any], Awaitable[Any]], handler)

    async def in_thread(inner: Message | list[Message]) -> Any:
        loop = asyncio.get_running_loop()
        bridge = runner or _LoopBridge(loop)
        blocking: BlockingMessage | list[BlockingMessage] = (
            [BlockingMessage(m, bridge) for m in inner]
            if isinstance(inner, list)
            else BlockingMessage(inner, bridge)
        )
        call: Callable[[], Any] = functools.partial(handler, blocking)
        if wrap is not None:
            call = wrap(call)
        result = await loop.run_in_executor(executor, call)
        if inspect.isawaitable(result):
            return await result
        return result

    return in_thread


def messages_argument(call: str, messages: object, kind: type[T]) -> list[T]:
    """``messages`` as a list, each a ``kind``; else an ArgumentError naming ``call``."""
    if isinstance(messages, kind | str | bytes) or not isinstance(messages, Iterable):
        raise ArgumentError(f"{call} takes a list of messages, got {type(messages).__name__}")
    batch = list(messages)
    for item in batch:
        if not isinstance(item, kind):
            raise ArgumentError(f"{call} takes messages, got {type(item).__name__}")
    return batch
