"""What the dashboard tests share: a page's CSRF token, dead letters made to look at, a store
that remembers the requests sent, and queue work run beside Playwright's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pawn_queue._protocol import layout
from pawn_queue.store.base import Store
from pawn_queue.store.wrapper import StoreCall, StoreWrapper
from pawn_queue.sync import PawnQueue

T = TypeVar("T")


class Requests(StoreWrapper):
    """Remembers every request: its operation and its key (a listing's prefix)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.sent: list[tuple[str, str]] = []

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        self.sent.append((call.operation, call.key))
        return await run()

    def under(self, prefix: str) -> list[str]:
        """The operations sent for keys under ``prefix``."""
        return sorted(operation for operation, key in self.sent if key.startswith(prefix))

    def reads(self) -> list[tuple[str, str]]:
        """What was sent but the change signals' HEADs, sorted."""
        return sorted(sent for sent in self.sent if not sent[1].startswith(layout.NOTIFY))


def in_a_thread(work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work()`` on an event loop of its own thread (a test's may be Playwright's)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, work()).result()  # type: ignore[arg-type]


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def dead_letter(
    pq: PawnQueue, topic: str, count: int, subscription: str | None = None
) -> list[str]:
    """``count`` messages published to ``topic`` (created if missing), then nacked (dead-
    lettered) in the topic's own queue, or in ``subscription`` only."""
    pq.create_topic(topic)
    producer = pq.register_producer("checkout")
    ids = [producer.publish(topic, {"n": n}) for n in range(count)]
    consumer = pq.register_consumer("billing", [topic], subscription=subscription)
    done = 0
    while done < count:
        for message in consumer.poll(wait=2):
            message.nack()
            done += 1
    return ids
