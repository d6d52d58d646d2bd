"""Test an app's handlers without a store: :class:`TestClient` runs them on a memory store.

::

    async def test_ship() -> None:
        async with TestClient(app) as client:
            await client.publish("orders", {"id": 1, "qty": 2})
            await client.drain()
            assert await client.pending("shipments") == [{"order_id": 1}]
            assert await client.dead_letters("orders") == []

The app runs as in production (its startup and shutdown hooks, validation, retries, dead
letters), on a fresh memory store whose topics are created for it, and the subscriptions its
subscribers read (``@app.subscriber("orders", subscription="billing")``): a message
published to such a topic goes to each of them, and :meth:`TestClient.drain` waits for all
(``client.dead_letters("orders", subscription="billing")`` reads one's dead letters).
Creating a subscription takes about 2 s, so entering the block does too. The schedules the
app declares (``@app.schedule``) are created but not run, so that nothing fires by the clock:
``await client.app.queue.trigger_schedule(name)`` publishes one tick now.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Any

from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.topics import TopicStats
from pawn_queue.app import App
from pawn_queue.config import PawnQueueConfig
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.observe import Observer, Outcome, Publication

__all__ = ["TestClient"]

_CHECK_SECONDS = 0.05  # a requeue delay comes due without any hook firing


class TestClient:
    """Runs ``app`` on a memory store for the length of an ``async with`` block."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        app: App,
        config: PawnQueueConfig | None = None,
        *,
        grace: float = 1.0,
        retry_delays: bool = False,
    ) -> None:
        """``config``: the memory store's settings (default: ``memory://`` defaults).
        ``grace``: how long handlers still running at the end of the block may finish.
        ``retry_delays``: wait for each ``Retry``'s backoff as in production; by default a
        retried message comes back at once (its receive count and limits unchanged), so a
        test of five retries does not take a minute."""
        self.app = app
        self._grace = grace
        self._retry_delays = retry_delays
        self._config = config or PawnQueueConfig.from_url("memory://")
        self._changed = asyncio.Event()
        self._serving: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TestClient:
        if self._config.backend != "memory":
            raise ValueError("TestClient runs an app on a memory store only")
        self.app.add_observer(_Changes(self._changed))
        create, self.app.create_topics = self.app.create_topics, True
        self.app._instant_retries = not self._retry_delays
        try:
            await self.app.start(self._config)
        finally:
            self.app.create_topics = create
        self._serving = asyncio.create_task(self.app.serve(grace=self._grace, schedules=False))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._serving is not None:
                self.app.stop_consuming()
                await self._serving
        finally:
            self.app._instant_retries = False
            await self.app.stop()

    async def publish(self, topic: str, payload: Any, **options: Any) -> str:
        """Publish as the app's producer (``options``: those of ``Producer.publish``)."""
        return await self.app.producer.publish(topic, payload, **options)

    async def pending(self, topic: str, limit: int = 100) -> list[Any]:
        """The payloads waiting in ``topic`` (one the app does not consume: what its
        handlers published there), oldest first."""
        return [m.payload for m in await self.app.queue.peek(topic, limit)]

    async def dead_letters(
        self, topic: str, *, subscription: str | None = None
    ) -> list[DeadLetter]:
        """The dead letters of ``topic``, or of its ``subscription``, oldest first."""
        return await self.app.queue.dead_letters(topic, subscription=subscription)

    async def drain(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - a test's bound
        """Wait until the app's topics and subscriptions hold no message that is pending,
        delayed or being handled (a retry with a delay waits for it); after ``timeout``,
        raise TimeoutError saying what each still holds."""
        queues = sorted(
            {(topic, sub.subscription) for sub in self.app.subscribers for topic in sub.topics},
            key=lambda queue: (queue[0], queue[1] or ""),
        )
        stats: list[TopicStats] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self._changed.clear()
                    stats = [
                        await self.app.queue.topic_stats(topic, subscription=subscription)
                        for topic, subscription in queues
                    ]
                    if all(s.pending + s.in_flight + s.delayed == 0 for s in stats):
                        return
                    if self._serving is not None and self._serving.done():
                        await self._serving  # it failed: say why
                        raise RuntimeError("the app stopped consuming")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), _CHECK_SECONDS)
        except TimeoutError:
            left = ", ".join(
                f"{_shown(queue)}: {s.pending} pending, {s.in_flight} in flight, "
                f"{s.delayed} delayed"
                for queue, s in zip(queues, stats, strict=False)
                if s.pending + s.in_flight + s.delayed
            )
            raise TimeoutError(f"drain: not done after {timeout:g} s ({left})") from None


def _shown(queue: tuple[str, str | None]) -> str:
    topic, subscription = queue
    return topic if subscription is None else f"{topic} (subscription {subscription})"


class _Changes(Observer):
    """Sets ``event`` whenever a message moves (so :meth:`TestClient.drain` looks again)."""

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event

    def published(self, publication: Publication) -> None:
        self.event.set()

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        self.event.set()

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        self.event.set()
