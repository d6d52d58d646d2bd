"""The core's side of the observer hooks: internal, no stable API.

:class:`Observers` calls each registered observer in turn and logs and skips one that
raises; the public base class and the hooks' documentation are :mod:`pawn_queue.observe`.
This module knows messages and schedules only as objects it passes on, so the core below
:mod:`pawn_queue.message` can hold observers without importing it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

logger = logging.getLogger("pawn_queue.observe")

_F = TypeVar("_F")
_NO_OP = "__pawn_queue_no_op__"


def no_op(hook: _F) -> _F:
    """Mark a base-class hook that does nothing: observers that keep it are not called for
    it (a hook per message and observer is most of what observers cost)."""
    setattr(hook, _NO_OP, True)
    return hook


def _overrides(observer: object, hook: str) -> bool:
    method = getattr(observer, hook, None)
    return method is not None and not getattr(getattr(method, "__func__", method), _NO_OP, False)


Outcome = Literal["ack", "nack_requeue", "dead_letter", "expired"]
"""How a message was settled: acked, requeued (``nack(requeue=True)``, a retry),
dead-lettered (``nack()``, a failed handler, ``max_receive_count``, retention, its own
deadline), or removed undelivered past its own deadline (``publish(expires_in=...)``)."""


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


class Hooks(Protocol):
    """What the core calls; :class:`pawn_queue.observe.Observer` has every hook."""

    def before_publish(self, publication: Publication) -> None: ...
    def published(self, publication: Publication) -> None: ...
    def publish_failed(self, publication: Publication, error: BaseException) -> None: ...
    def delivered(self, message: Any) -> None: ...
    def handler_started(self, message: Any) -> None: ...
    def handler_finished(
        self, message: Any, seconds: float, error: BaseException | None
    ) -> None: ...
    def settled(self, message: Any, outcome: Outcome, reason: str | None) -> None: ...
    def lease_lost(self, message: Any) -> None: ...
    def quarantined(self, topic: str, key: str, error: str) -> None: ...
    def schedule_fired(self, schedule: Any, tick: datetime, late_seconds: float) -> None: ...
    def schedule_missed(self, schedule: Any, count: int) -> None: ...


class Observers:
    """The observers of one queue, called in order; one that raises is logged and skipped.

    False when empty: the core tests it before building anything for the hooks."""

    __slots__ = ("_calls", "_observers")

    def __init__(self, observers: Iterable[Hooks] = ()) -> None:
        self._observers: list[Hooks] = list(observers)
        self._calls: dict[str, list[Hooks]] = {}  # hook -> the observers that implement it

    def __bool__(self) -> bool:
        return bool(self._observers)

    def __len__(self) -> int:
        return len(self._observers)

    def __contains__(self, observer: object) -> bool:
        return any(o is observer for o in self._observers)

    def add(self, observer: Hooks) -> bool:
        """Add ``observer`` unless it is there already; return whether it was added."""
        if observer in self:
            return False
        self._observers.append(observer)
        self._calls.clear()
        return True

    def _failed(self, observer: Hooks, hook: str) -> None:
        logger.exception("observer %r failed in %s; ignored", observer, hook)

    def _implementing(self, hook: str) -> list[Hooks]:
        called = self._calls.get(hook)
        if called is None:
            called = self._calls[hook] = [o for o in self._observers if _overrides(o, hook)]
        return called

    def wants(self, *hooks: str) -> bool:
        """Whether an observer implements one of ``hooks``: a batch asks once, not a call
        per message and hook."""
        return any(self._implementing(hook) for hook in hooks)

    def _each(self, hook: str, *args: object) -> None:
        for o in self._implementing(hook):
            try:
                getattr(o, hook)(*args)
            except Exception:
                self._failed(o, hook)

    def before_publish(self, publication: Publication) -> None:
        for o in self._implementing("before_publish"):
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

    def delivered(self, message: object) -> None:
        self._each("delivered", message)

    def handler_started(self, message: object) -> None:
        self._each("handler_started", message)

    def handler_finished(
        self, message: object, seconds: float, error: BaseException | None
    ) -> None:
        self._each("handler_finished", message, seconds, error)

    def settled(self, message: object, outcome: Outcome, reason: str | None = None) -> None:
        self._each("settled", message, outcome, reason)

    def lease_lost(self, message: object) -> None:
        self._each("lease_lost", message)

    def quarantined(self, topic: str, key: str, error: str) -> None:
        self._each("quarantined", topic, key, error)

    def schedule_fired(self, schedule: object, tick: datetime, late_seconds: float) -> None:
        self._each("schedule_fired", schedule, tick, late_seconds)

    def schedule_missed(self, schedule: object, count: int) -> None:
        self._each("schedule_missed", schedule, count)


def _check_attributes(attributes: object) -> None:
    """Attributes an observer left must stay a dict of str to str."""
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise TypeError(f"attributes must map str to str, got {attributes!r}")
