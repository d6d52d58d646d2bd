"""The subscriptions an :class:`~pawn_queue.app.App`'s subscribers read.

``@app.subscriber("orders", subscription="billing")`` reads the subscription ``billing`` of
``orders``: a copy of every message published to the topic since the subscription was
created (those whose attributes its filter takes), with the other consumers of ``billing``
competing for them, whatever the topic's other subscriptions do. When the app starts it
creates each subscription that is missing (:func:`ensure_subscriptions`), all at once: a new
one takes about 2 s, until every producer copies to it. A declared ``filter`` is checked
against an existing subscription's (SubscriptionConflictError: the app does not start);
without one, an existing subscription is read with the filter it has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pawn_queue._protocol import layout
from pawn_queue._protocol.filters import parse_filter
from pawn_queue.client import PawnQueue
from pawn_queue.exceptions import (
    ArgumentError,
    SubscriptionConflictError,
    SubscriptionNotFoundError,
)

logger = logging.getLogger("pawn_queue.app")


class Reader(Protocol):
    """What these functions read of a subscriber (:class:`pawn_queue.app.Subscriber`)."""

    @property
    def name(self) -> str: ...
    @property
    def topics(self) -> tuple[str, ...]: ...
    @property
    def subscription(self) -> str | None: ...
    @property
    def filter(self) -> dict[str, Any] | None: ...


def declared_filter(
    others: Sequence[Reader],
    topics: Sequence[str],
    subscription: str | None,
    given: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """The filter a new subscriber declares, in its canonical form (``{}``: every message;
    None: not declared), checked against the ``others`` that read the same subscription of
    one of ``topics``: one subscription has one filter. ArgumentError if it is invalid."""
    if subscription is None:
        if given is not None:
            raise ArgumentError("filter= is a subscription's: give subscription= too")
        return None
    layout.validate_name(subscription, "subscription name")
    if given is None:
        return None
    wanted = parse_filter(given).to_json() or {}
    for other in others:
        if (
            other.subscription == subscription
            and other.filter is not None
            and other.filter != wanted
            and set(other.topics) & set(topics)
        ):
            raise ArgumentError(
                f"subscriber {other.name!r} reads subscription {subscription!r} with filter "
                f"{other.filter!r}, not {wanted!r}: a subscription has one filter"
            )
    return wanted


async def ensure_subscriptions(queue: PawnQueue, subscribers: Sequence[Reader]) -> None:
    """Create the subscriptions ``subscribers`` read that are missing, and check those
    whose filter is declared (SubscriptionConflictError if it differs), concurrently."""
    wanted: dict[tuple[str, str], dict[str, Any] | None] = {}
    for sub in subscribers:
        if sub.subscription is not None:
            for topic in sub.topics:
                key = (topic, sub.subscription)
                wanted[key] = wanted.get(key) if sub.filter is None else sub.filter

    async def ensure(topic: str, name: str, declared: dict[str, Any] | None) -> None:
        if declared is None:
            try:
                await queue.subscription(topic, name)
                return
            except SubscriptionNotFoundError:
                pass
        try:
            await queue.create_subscription(topic, name, filter=declared)
        except SubscriptionConflictError:
            if declared is not None:
                raise
            # Created meanwhile by another process, with a filter: read it as it is.

    results = await asyncio.gather(
        *(ensure(topic, name, declared) for (topic, name), declared in wanted.items()),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def warn_of_subscriptions(queue: PawnQueue, subscribers: Sequence[Reader]) -> None:
    """Warn of subscribers that read a topic's own messages while the topic has
    subscriptions: every message published from then on goes to those only."""
    direct = [sub for sub in subscribers if sub.subscription is None]
    for topic in dict.fromkeys(topic for sub in direct for topic in sub.topics):
        found = [s.name for s in await queue.list_subscriptions(topic)]
        if found:
            logger.warning(
                "topic %s has subscriptions (%s): every message published goes to those "
                "only, none to subscriber %s, which reads the topic's own",
                topic,
                ", ".join(found),
                ", ".join(sub.name for sub in direct if topic in sub.topics),
            )


__all__ = ["declared_filter", "ensure_subscriptions", "warn_of_subscriptions"]
