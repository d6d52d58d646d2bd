"""Retry: what a handler's failure does to its message (requeue with a backoff, or dead-letter)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from pawn_queue._internal.durations import count_argument, rate_argument, seconds_argument
from pawn_queue.exceptions import ArgumentError


@dataclass(frozen=True, slots=True)
class Retry:
    """Retry policy for a failed handler (``listen(retry=...)``, ``App.subscriber(retry=...)``).

    A failure whose exception is one of ``retry_on`` requeues the message after
    ``base_delay * factor ** (receive_count - 1)`` seconds, at most ``max_delay``; ``jitter``
    (0 to 1) draws each delay at random from ``[delay * (1 - jitter), delay]``, so messages
    that failed together do not come back together. Any other exception dead-letters the
    message at once (it would fail again). The receive count decides: a message received
    ``max_receives`` times (or the topic's ``max_receive_count``, when lower) is
    dead-lettered instead of requeued. ``max_receives=None`` leaves the limit to the topic.
    """

    max_receives: int | None = 5
    base_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.max_receives is not None:
            count_argument("Retry.max_receives", self.max_receives, minimum=1)
        seconds_argument("Retry.base_delay", self.base_delay, zero=True)
        seconds_argument("Retry.max_delay", self.max_delay, zero=True)
        if rate_argument("Retry.factor", self.factor) < 1:
            raise ArgumentError(f"Retry.factor: got {self.factor!r}, must be a number >= 1")
        if not _is_fraction(self.jitter):
            raise ArgumentError(f"Retry.jitter: got {self.jitter!r}, must be a number from 0 to 1")
        if not isinstance(self.retry_on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in self.retry_on
        ):
            raise ArgumentError(f"invalid {self!r}: retry_on must be a tuple of exception classes")

    def delay(self, receive_count: int) -> float:
        """Seconds before the message comes back after its ``receive_count``-th receive."""
        delay = min(self.max_delay, self.base_delay * self.factor ** (receive_count - 1))
        if self.jitter:
            delay *= 1 - self.jitter * random.random()
        return delay

    def retries(self, error: BaseException, receive_count: int, topic_limit: int | None) -> bool:
        """Whether a message received ``receive_count`` times whose handler raised ``error``
        is requeued (else dead-lettered). ``topic_limit``: the topic's ``max_receive_count``."""
        if not isinstance(error, self.retry_on):
            return False
        limits = [limit for limit in (self.max_receives, topic_limit) if limit]
        return not limits or receive_count < min(limits)


def _is_fraction(value: object) -> bool:
    """A number from 0 to 1 (not a bool; NaN fails the comparison)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
