"""The subscriptions an :class:`~pawn_queue.app.App`'s subscribers read.

``@app.subscriber("orders", subscription="billing")`` reads the subscription ``billing`` of
``orders``: a copy of every message published to the topic since the subscription was
created (those whose attributes its filter takes), with the other consumers of ``billing``
competing for them, whatever the topic's other subscriptions do. When the app starts it
creates each subscription that is missing (:func:`ensure_subscriptions`), all at once: a new
one takes about 2 s, until every producer copies to it. A declared ``filter`` or
``linger_seconds`` is checked against an existing subscription's (SubscriptionConflictError:
the app does not start); what is not declared, an existing subscription keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pawn_queue._protocol import layout
from pawn_queue._protocol.filters import parse_filter
from pawn_queue._protocol.subscriptions import Subscription, linger_seconds
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
    @property
    def linger_seconds(self) -> float | None: ...


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
    _check_others(others, topics, subscription, "filter", wanted)
    return wanted


def declared_linger(
    others: Sequence[Reader], topics: Sequence[str], subscription: str | None, given: object
) -> float | None:
    """The ``linger_seconds`` a new subscriber declares (None: not declared), checked like
    :func:`declared_filter`'s filter. ArgumentError if it is invalid."""
    if given is None:
        return None
    if subscription is None:
        raise ArgumentError("linger_seconds= is a subscription's: give subscription= too")
    wanted = linger_seconds(given)
    _check_others(others, topics, subscription, "linger_seconds", wanted)
    return wanted


def _check_others(
    others: Sequence[Reader], topics: Sequence[str], subscription: str, setting: str, wanted: object
) -> None:
    """ArgumentError if one of ``others`` reads ``subscription`` of one of ``topics`` with
    another ``setting`` declared: a subscription has one."""
    for other in others:
        declared = getattr(other, setting)
        if (
            other.subscription == subscription
            and declared is not None
            and declared != wanted
            and set(other.topics) & set(topics)
        ):
            raise ArgumentError(
                f"subscriber {other.name!r} reads subscription {subscription!r} with "
                f"{setting} {declared!r}, not {wanted!r}: a subscription has one {setting}"
            )


async def ensure_subscriptions(queue: PawnQueue, subscribers: Sequence[Reader]) -> None:
    """Create the subscriptions ``subscribers`` read that are missing, and check the
    declared filter and ``linger_seconds`` of those that exist (SubscriptionConflictError if
    one differs), concurrently."""
    filters: dict[tuple[str, str], dict[str, Any] | None] = {}
    lingers: dict[tuple[str, str], float | None] = {}
    for sub in subscribers:
        if sub.subscription is not None:
            for topic in sub.topics:
                key = (topic, sub.subscription)
                filters[key] = filters.get(key) if sub.filter is None else sub.filter
                lingers[key] = (
                    lingers.get(key) if sub.linger_seconds is None else sub.linger_seconds
                )

    async def ensure(topic: str, name: str) -> None:
        declared, linger = filters[(topic, name)], lingers[(topic, name)]
        if declared is not None:
            await queue.create_subscription(topic, name, filter=declared, linger_seconds=linger)
            return
        # No filter declared: an existing subscription is read with the one it has.
        try:
            existing = await queue.subscription(topic, name)
        except SubscriptionNotFoundError:
            try:
                await queue.create_subscription(topic, name, linger_seconds=linger)
                return
            except SubscriptionConflictError:
                # Created meanwhile by another process, with a filter: read it as it is.
                existing = await queue.subscription(topic, name)
        _check_linger(existing, linger)

    results = await asyncio.gather(
        *(ensure(topic, name) for topic, name in filters), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _check_linger(existing: Subscription, declared: float | None) -> None:
    if declared is not None and existing.linger_seconds != declared:
        differences: dict[str, tuple[object, object]] = {
            "linger_seconds": (existing.linger_seconds, declared)
        }
        raise SubscriptionConflictError(existing.topic, existing.name, differences)


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


__all__ = ["declared_filter", "declared_linger", "ensure_subscriptions", "warn_of_subscriptions"]
