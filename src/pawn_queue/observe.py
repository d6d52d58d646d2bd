"""Observers: hooks the core calls as messages are published, delivered, handled and settled,
and as schedule runners fire ticks.

Register observers on the queue, ``PawnQueue(config, observers=[...])`` (the blocking
``pawn_queue.sync.PawnQueue`` the same); :mod:`pawn_queue.metrics` and
:mod:`pawn_queue.tracing` are built on them. Subclass :class:`Observer` and override what
you need: every method is a no-op. Hooks run on the event loop, inline: keep them quick and
never block. An observer that raises is logged and skipped, never breaks the call that
invoked it. With no observer registered the core calls none of them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pawn_queue._protocol.observers import Observers, Outcome, Publication, no_op

if TYPE_CHECKING:
    from pawn_queue._protocol.delivery import Message
    from pawn_queue._protocol.schedules import Schedule

__all__ = ["Observer", "Observers", "Outcome", "Publication"]


class Observer:
    """Base class of observers: override the hooks you need (each is a no-op here)."""

    @no_op
    def before_publish(self, publication: Publication) -> None:
        """Before the write: may add attributes (``publication.attributes``) to the messages."""

    @no_op
    def published(self, publication: Publication) -> None:
        """After the store acknowledged the write (a dedup repeat too: nothing new written)."""

    @no_op
    def publish_failed(self, publication: Publication, error: BaseException) -> None:
        """The publish raised ``error`` after :meth:`before_publish` (nothing published)."""

    @no_op
    def delivered(self, message: Message) -> None:
        """``poll()`` returns the message, or ``listen()`` is about to hand it to a handler."""

    @no_op
    def handler_started(self, message: Message) -> None:
        """``listen()`` calls its handler with the message (in the task that runs it)."""

    @no_op
    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        """The handler returned (``error`` None) or raised ``error`` after ``seconds``."""

    @no_op
    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        """The settlement succeeded; ``reason`` is a dead letter's (``"nack"``,
        ``"handler_error"``, ``"max_receive_count"``, ``"retention"``, ``"expired"``), else
        None. ``outcome`` ``"expired"``: removed undelivered past its own deadline."""

    @no_op
    def lease_lost(self, message: Message) -> None:
        """Settling the message found its lease lost (another consumer has it now)."""

    @no_op
    def quarantined(self, topic: str, key: str, error: str) -> None:
        """An unreadable object at ``key`` was moved to dead letter (reason ``corrupt``):
        it never became a message, so no other hook saw it."""

    @no_op
    def schedule_fired(self, schedule: Schedule, tick: datetime, late_seconds: float) -> None:
        """This process's schedule runner published ``tick`` (UTC) of ``schedule``,
        ``late_seconds`` after the tick's time by its clock (jitter, catch-up, a slow store).
        Across the runners of a queue, each tick is reported once."""

    @no_op
    def schedule_missed(self, schedule: Schedule, count: int) -> None:
        """This process's schedule runner recorded ``count`` ticks of ``schedule`` as missed
        (older than ``catch_up_seconds`` when a runner came back), in the marker of the tick
        it fired next: across runners, each missed tick is reported once."""
