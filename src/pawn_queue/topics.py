"""Topics' settings, counts and peeked messages, as ``create_topic``, ``topic_settings``,
``topic_stats`` and ``peek`` return them. Topics are kept by
:mod:`pawn_queue._protocol.topics`."""

from pawn_queue._protocol.topics import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION_ACTION,
    NO_LIMIT,
    NotGiven,
    PeekedMessage,
    TopicSettings,
    TopicStats,
)

__all__ = [
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_REPLAY_WINDOW",
    "DEFAULT_RETENTION_ACTION",
    "NO_LIMIT",
    "NotGiven",
    "PeekedMessage",
    "TopicSettings",
    "TopicStats",
]

for _public in (NotGiven, PeekedMessage, TopicSettings, TopicStats):
    _public.__module__ = __name__
