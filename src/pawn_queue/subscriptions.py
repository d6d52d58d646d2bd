"""A topic's subscriptions, as ``create_subscription``, ``subscription`` and
``list_subscriptions`` return them. They are kept by
:mod:`pawn_queue._protocol.subscriptions`."""

from pawn_queue._protocol.subscriptions import MAX_LINGER_SECONDS, Subscription

__all__ = ["MAX_LINGER_SECONDS", "Subscription"]

Subscription.__module__ = __name__
