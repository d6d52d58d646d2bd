"""What a handler's exception does to its message: retried with backoff or dead-lettered
(``listen(retry=)``); for :class:`~pawn_queue.exceptions.RateLimited`, the subscriber paused
in every process (:mod:`pawn_queue._protocol.pauses`) and the message back after the pause,
this receive not counted (docs/concepts/flow-control.md, "Pausing a subscriber")."""

from __future__ import annotations

import logging

from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.runtime import Runtime
from pawn_queue.exceptions import PawnQueueError, RateLimited, StoreError, TopicNotFoundError
from pawn_queue.retry import Retry

logger = logging.getLogger("pawn_queue.consumer")


class Failures:
    """Settles the messages whose handler raised, for one subscriber ``name``."""

    def __init__(self, runtime: Runtime, name: str) -> None:
        self._topics = runtime.topics
        self._pauses = runtime.pauses
        self._name = name

    async def failed(self, message: Message, exc: Exception, retry: Retry | None) -> None:
        """The handler raised ``exc``: log it and settle the message it left unsettled."""
        if not isinstance(exc, RateLimited):
            logger.error(
                "handler failed message=%s topic=%s receive_count=%d error=%r",
                message.id,
                message.topic,
                message.receive_count,
                exc,
                exc_info=exc,
            )
        await self.settle(message, exc, retry)

    async def settle(self, message: Message, exc: Exception, retry: Retry | None) -> None:
        """Pause (RateLimited), retry or dead-letter ``message`` unless it is settled."""
        if isinstance(exc, RateLimited):
            await self._pause(message, exc.retry_after)
            return
        if message.settled:
            return
        try:
            if retry is not None and retry.retries(
                exc, message.receive_count, await self._receive_limit(message.queue)
            ):
                await message.nack(requeue=True, delay=retry.delay(message.receive_count))
            else:
                await message.dead_letter("handler_error", repr(exc))
        except PawnQueueError as nack_exc:
            logger.error(
                "settling failed message=%s error=%s; it is redelivered after the "
                "visibility timeout",
                message.id,
                nack_exc,
            )

    async def _pause(self, message: Message, seconds: float) -> None:
        if not self._pauses.paused(self._name):
            logger.warning(
                "handler rate limited: subscriber %s paused for %g s in every process",
                self._name,
                seconds,
            )
        await self._pauses.pause(self._name, seconds)
        if message.settled:
            return
        try:
            await message._put_back(seconds)
        except PawnQueueError as exc:
            logger.error(
                "putting back failed message=%s error=%s; it is redelivered after the "
                "visibility timeout",
                message.id,
                exc,
            )

    async def _receive_limit(self, queue: str) -> int | None:
        """The topic's ``max_receive_count`` (cached settings; None when unknown)."""
        try:
            return (await self._topics.settings(queue)).max_receive_count
        except (StoreError, TopicNotFoundError):
            return None
