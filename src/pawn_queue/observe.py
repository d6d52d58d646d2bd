"""Observers: hooks the core calls as messages are published, delivered, handled and settled.

Register observers on the queue, ``PawnQueue(config, observers=[...])`` (the blocking
``pawn_queue.sync.PawnQueue`` the same); :mod:`pawn_queue.metrics` and
:mod:`pawn_queue.tracing` are built on them. Subclass :class:`Observer` and override what
you need: every method is a no-op. Hooks run on the event loop, inline: keep them quick and
never block. An observer that raises is logged and skipped, never breaks the call that
invoked it. With no observer registered the core calls none of them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pawn_queue.message import Message

logger = logging.getLogger(__name__)

Outcome = Literal["ack", "nack_requeue", "dead_letter"]
"""How a message was settled: acked, requeued (``nack(requeue=True)``, a retry), or
dead-lettered (``nack()``, a failed handler, ``max_receive_count``, retention)."""


@dataclass(slots=True)
class Publication:
    """One ``publish`` or ``publish_batch`` call, seen by every hook of that call."""

    topic: str
    attributes: dict[str, str]
    """The messages' attributes: :meth:`Observer.before_publish` may add str entries."""
    count: int
    """How many messages (1, or the batch's size)."""
    message_ids: list[str] = field(default_factory=list)
    """The published ids (filled once the write is durable)."""
    state: dict[object, Any] = field(default_factory=dict)
    """Room for an observer's own state between its hooks (key it by the observer)."""


class Observer:
    """Base class of observers: override the hooks you need (each is a no-op here)."""

    def before_publish(self, publication: Publication) -> None:
        """Before the write: may add attributes (``publication.attributes``) to the messages."""

    def published(self, publication: Publication) -> None:
        """After the store acknowledged the write (a dedup repeat too: nothing new written)."""

    def publish_failed(self, publication: Publication, error: BaseException) -> None:
        """The publish raised ``error`` after :meth:`before_publish` (nothing published)."""

    def delivered(self, message: Message) -> None:
        """``poll()`` returns the message, or ``listen()`` is about to hand it to a handler."""

    def handler_started(self, message: Message) -> None:
        """``listen()`` calls its handler with the message (in the task that runs it)."""

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        """The handler returned (``error`` None) or raised ``error`` after ``seconds``."""

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        """The settlement succeeded; ``reason`` is a dead letter's (``"nack"``,
        ``"handler_error"``, ``"max_receive_count"``, ``"retention"``), else None."""

    def lease_lost(self, message: Message) -> None:
        """Settling the message found its lease lost (another consumer has it now)."""

    def quarantined(self, topic: str, key: str, error: str) -> None:
        """An unreadable object at ``key`` was moved to dead letter (reason ``corrupt``):
        it never became a message, so no other hook saw it."""


class Observers:
    """The observers of one queue, called in order; one that raises is logged and skipped.

    False when empty: the core tests it before building anything for the hooks."""

    __slots__ = ("_observers",)

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers: list[Observer] = list(observers)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def __len__(self) -> int:
        return len(self._observers)

    def __contains__(self, observer: object) -> bool:
        return any(o is observer for o in self._observers)

    def add(self, observer: Observer) -> bool:
        """Add ``observer`` unless it is there already; return whether it was added."""
        if observer in self:
            return False
        self._observers.append(observer)
        return True

    def _failed(self, observer: Observer, hook: str) -> None:
        logger.exception("observer %r failed in %s; ignored", observer, hook)

    def _each(self, hook: str, *args: object) -> None:
        for o in self._observers:
            try:
                getattr(o, hook)(*args)
            except Exception:
                self._failed(o, hook)

    def before_publish(self, publication: Publication) -> None:
        for o in self._observers:
            before = dict(publication.attributes)
            try:
                o.before_publish(publication)
                _check_attributes(publication.attributes)
            except Exception:
                publication.attributes = before  # what a failed observer added is dropped
                self._failed(o, "before_publish")

    def published(self, publication: Publication) -> None:
        self._each("published", publication)

    def publish_failed(self, publication: Publication, error: BaseException) -> None:
        self._each("publish_failed", publication, error)

    def delivered(self, message: Message) -> None:
        self._each("delivered", message)

    def handler_started(self, message: Message) -> None:
        self._each("handler_started", message)

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        self._each("handler_finished", message, seconds, error)

    def settled(self, message: Message, outcome: Outcome, reason: str | None = None) -> None:
        self._each("settled", message, outcome, reason)

    def lease_lost(self, message: Message) -> None:
        self._each("lease_lost", message)

    def quarantined(self, topic: str, key: str, error: str) -> None:
        self._each("quarantined", topic, key, error)


def _check_attributes(attributes: object) -> None:
    """Attributes an observer left must stay a dict of str to str."""
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise TypeError(f"attributes must map str to str, got {attributes!r}")
