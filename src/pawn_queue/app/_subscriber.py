"""A subscriber of an App: one handler and how it consumes, and the handler ``listen()``
calls for it (bind the payload, call, publish the result, ack; dead-letter a payload its
annotation refuses)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from pawn_queue._handling import handlers
from pawn_queue._handling.binding import Binding, InvalidPayload, jsonable
from pawn_queue._handling.handlers import BlockingMessage
from pawn_queue._protocol.delivery import Message
from pawn_queue.exceptions import BatchFailureError
from pawn_queue.producer import Producer
from pawn_queue.retry import Retry

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Subscriber:
    """One handler and how it consumes (made by :meth:`App.subscriber`)."""

    name: str
    topics: tuple[str, ...]
    handler: Callable[..., Any]
    concurrency: int
    retry: Retry | None
    visibility_timeout: float | None
    publish_to: str | None
    binding: Binding = field(repr=False)
    batch: int | None = None  # a batch handler's most messages per call
    batch_wait: float = 0.0
    subscription: str | None = None  # None: the topics' own messages
    filter: dict[str, Any] | None = None  # the subscription's, as declared (None: not declared)
    linger_seconds: float | None = None  # likewise
    max_in_flight: int | None = None  # across the processes reading the same queue
    rate_limit: str | None = None  # likewise

    @property
    def is_async(self) -> bool:
        return handlers.is_coroutine_handler(self.handler)


def message_handler(
    sub: Subscriber, producer: Producer, executor: Executor | None
) -> handlers.AsyncHandler:
    """The message handler ``listen()`` calls for ``sub``: bind, call, publish the result,
    ack; an invalid payload is dead-lettered at once."""
    if sub.is_async:

        async def on_loop(message: Message) -> Any:
            return await sub.binding.call(sub.handler, message)

        call: handlers.AsyncHandler = on_loop
    else:

        def in_thread(message: BlockingMessage) -> Any:
            return sub.binding.call(sub.handler, message)

        call = handlers.as_async(in_thread, executor=executor)

    async def handle(message: Message) -> None:
        try:
            result = await call(message)
        except InvalidPayload as exc:
            if not message.settled:
                await message.dead_letter("invalid_payload", exc.detail)
            return
        if message.settled:
            return
        if result is not None and sub.publish_to is not None:
            await producer.publish(sub.publish_to, jsonable(result))
        await message.ack()

    return handle


def batch_handler(
    sub: Subscriber, producer: Producer, executor: Executor | None
) -> handlers.AsyncBatchHandler:
    """The batch handler ``listen()`` calls for ``sub``: validate each payload (one its
    annotation refuses is dead-lettered alone), call with the others, publish the
    result; the listener acks what is left unsettled."""
    binding = sub.binding
    validate = binding.payload_type is not None
    wants_payloads = binding.payload_parameter is not None

    async def handle(batch: list[Message]) -> None:
        messages = batch
        payloads = [m.payload for m in batch] if wants_payloads else []
        if validate:
            messages, payloads = await _valid(sub, batch)
            if not messages:
                return
        try:
            if sub.is_async:
                result = await binding.call_batch(sub.handler, messages, payloads)
            else:

                def in_thread(blocking: list[BlockingMessage]) -> Any:
                    return binding.call_batch(sub.handler, blocking, payloads)

                call = handlers.as_async_batch(in_thread, executor=executor)
                result = await call(messages)
        except BatchFailureError as exc:
            # Positions are in the list the handler got, which left invalid ones out.
            raise BatchFailureError(
                {_position(messages, key): error for key, error in exc.failures.items()}
            ) from exc
        if result is None or sub.publish_to is None or all(m.settled for m in messages):
            return
        results = result if isinstance(result, list | tuple) else [result]
        # Published together, so that group commit writes them as few objects.
        await asyncio.gather(
            *(producer.publish(sub.publish_to, jsonable(r)) for r in results if r is not None)
        )

    return handle


async def _valid(sub: Subscriber, batch: list[Message]) -> tuple[list[Message], list[Any]]:
    """The messages of ``batch`` whose payload ``sub``'s annotation takes, and those
    payloads validated; the others are dead-lettered (reason ``invalid_payload``)."""
    messages: list[Message] = []
    payloads: list[Any] = []
    invalid: list[tuple[Message, InvalidPayload]] = []
    for message in batch:
        try:
            payloads.append(sub.binding.validated(message.payload))
        except InvalidPayload as exc:
            invalid.append((message, exc))
        else:
            messages.append(message)
    results = await asyncio.gather(
        *(m.dead_letter("invalid_payload", e.detail) for m, e in invalid if not m.settled),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            # Left unsettled: back after the visibility timeout, and refused again then.
            logger.error("dead-lettering an invalid payload failed error=%s", result)
    return messages, payloads


def _position(messages: list[Message], key: Any) -> Any:
    """A BatchFailureError's key as the listener reads it: a position in ``messages`` (the
    handler's list) becomes that message; one out of range names no message."""
    if isinstance(key, int) and not isinstance(key, bool):
        return messages[key] if 0 <= key < len(messages) else f"position {key}"
    return key
