"""What the dashboard tests share: a page's CSRF token, and dead letters made to look at."""

from __future__ import annotations

import re

from pawn_queue.sync import PawnQueue


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
