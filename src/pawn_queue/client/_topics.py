"""The topic administration of :class:`pawn_queue.client.PawnQueue`: create, change, look
at, purge and delete topics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pawn_queue._internal.durations import count_argument
from pawn_queue._protocol import layout
from pawn_queue._protocol.topics import (
    DEFAULT_CLAIMS,
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_REPLAY_WINDOW,
    DEFAULT_RETENTION_ACTION,
    NO_LIMIT,
    NotGiven,
    PeekedMessage,
    TopicSettings,
    TopicStats,
    given_settings,
    topic_stats,
)

if TYPE_CHECKING:
    from pawn_queue._protocol.runtime import Runtime
    from pawn_queue.config import PawnQueueConfig


class TopicMethods:
    """Topics: their settings, counts and oldest messages."""

    if TYPE_CHECKING:
        config: PawnQueueConfig

        def _ready(self) -> Runtime: ...

    async def create_topic(
        self,
        name: str,
        *,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        max_pending: int | NotGiven | None = NO_LIMIT,
        dedup_window_seconds: float | NotGiven = DEFAULT_DEDUP_WINDOW,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
        replay_window_seconds: float | NotGiven = DEFAULT_REPLAY_WINDOW,
        claims: str | NotGiven = DEFAULT_CLAIMS,
    ) -> None:
        """Create a topic, or make sure it exists. Never changes stored settings.

        A new topic gets the settings passed and the defaults for the rest. For an existing
        topic, the settings passed are compared with the stored ones: the same is fine, a
        difference raises TopicSettingsConflictError (nothing written). Settings left out
        are not compared, so ``create_topic(name)`` accepts any existing topic. Change
        settings with :meth:`update_topic`.

        ``max_receive_count``: dead-letter a message received more often than that.
        ``retention_seconds``: a message not consumed that long after it was due is expired
        (``retention_action``: ``"delete"`` or ``"dead_letter"``).
        ``max_pending``: ``publish`` waits for room, then raises QueueFullError.
        ``dedup_window_seconds``: how long a ``dedup_id`` is remembered.
        ``replay_window_seconds``: keep every message at least this long after it was
        published, acked or not, so that :meth:`seek` can deliver it again (0: acked
        messages are gone at once).
        ``claims``: ``"second"`` (the default): one claim covers a run, up to ten messages
        a producer published in one second, so a consumer pays one lease write a run, not
        one a message; pawn-queue 0.2.0 and older do not read such messages: ``"message"``
        claims each message on its own, for a topic they consume (docs/protocol.md, "Runs").
        """
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            max_pending=max_pending,
            dedup_window_seconds=dedup_window_seconds,
            retention_action=retention_action,
            replay_window_seconds=replay_window_seconds,
            claims=claims,
        )
        await self._ready().topics.create(layout.queue(name, None), given)

    async def update_topic(
        self,
        name: str,
        *,
        max_receive_count: int | NotGiven | None = NO_LIMIT,
        retention_seconds: float | NotGiven | None = NO_LIMIT,
        max_pending: int | NotGiven | None = NO_LIMIT,
        dedup_window_seconds: float | NotGiven = DEFAULT_DEDUP_WINDOW,
        retention_action: str | NotGiven = DEFAULT_RETENTION_ACTION,
        replay_window_seconds: float | NotGiven = DEFAULT_REPLAY_WINDOW,
        claims: str | NotGiven = DEFAULT_CLAIMS,
    ) -> TopicSettings:
        """Change the settings passed (None clears a limit) and keep the others; return the
        topic's new settings. Raises TopicNotFoundError for a missing topic.

        Other processes see the change within 30 s (they cache topic settings that long).
        """
        given = given_settings(
            max_receive_count=max_receive_count,
            retention_seconds=retention_seconds,
            max_pending=max_pending,
            dedup_window_seconds=dedup_window_seconds,
            retention_action=retention_action,
            replay_window_seconds=replay_window_seconds,
            claims=claims,
        )
        return await self._ready().topics.update(layout.queue(name, None), given)

    async def topic_settings(self, name: str) -> TopicSettings:
        """The topic's stored settings (read now); raises TopicNotFoundError if it is missing."""
        return await self._ready().topics.settings(layout.queue(name, None), fresh=True)

    async def purge_topic(self, name: str, *, subscription: str | None = None) -> int:
        """Delete the messages of the topic (or of one of its subscriptions), pending, in
        flight and delayed, and their leases, like SQS's PurgeQueue; return the number of
        message objects deleted (a batch counts once). Dead letters stay. A consumer holding
        a purged message learns it when it next writes its lease: see docs/protocol.md."""
        return await self._ready().topics.purge(layout.queue(name, subscription))

    async def list_topics(self) -> list[str]:
        """All topics in the store, sorted."""
        return await self._ready().topics.list()

    async def delete_topic(self, name: str) -> None:
        """Delete a topic with its messages, leases and dead letters."""
        await self._ready().topics.delete(layout.queue(name, None))

    async def topic_stats(self, name: str, *, subscription: str | None = None) -> TopicStats:
        """Approximate pending, in-flight, delayed and dead-letter counts and the age of the
        oldest pending message, of the topic or of one of its subscriptions. Costs one LIST
        per 1,000 objects of each kind."""
        queue = layout.queue(name, subscription)
        await self._ready().topics.settings(queue)
        return await topic_stats(
            self._ready().store, queue, self.config.polling.visibility_timeout_seconds
        )

    async def peek(
        self, topic: str, limit: int = 10, *, subscription: str | None = None
    ) -> list[PeekedMessage]:
        """The oldest messages of the topic (or of one of its subscriptions), at most
        ``limit``, each with its state (``pending``, ``in_flight`` or ``delayed``), read
        without claiming them. Costs two LISTs and a GET per message object shown."""
        count_argument("limit", limit, minimum=0)
        visibility = self.config.polling.visibility_timeout_seconds
        return await self._ready().topics.peek(layout.queue(topic, subscription), limit, visibility)
