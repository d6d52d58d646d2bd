"""Every error pawn-queue raises.

One root, so ``except PawnQueueError`` catches everything the library raises::

    PawnQueueError
    ├── ConfigError                  invalid configuration (raised before any I/O): see below
    ├── ArgumentError                a bad value for an option of one call: see below
    │   └── ReplayUnavailableError   seek would drop messages it cannot bring back
    ├── StoreError                   the storage failed or refused a request
    │   ├── NotFoundError            the key does not exist
    │   ├── AlreadyExistsError       create-only put on an existing key
    │   ├── PreconditionFailedError  if-match put whose etag no longer matches (or key is gone)
    │   ├── StoreUnavailableError    transient: timeout, connection refused, 5xx, throttling
    │   │   └── StoreThrottledError  refused for the store's request rate, for longer than
    │   │                            the store's throttle_timeout_seconds
    │   ├── AccessDeniedError        credentials missing, wrong or without permission
    │   └── BucketNotFoundError      the bucket (or root directory) does not exist
    │       └── RootNotFoundError    the local directory does not exist (yet): also a NotFoundError
    ├── TopicNotFoundError           the topic has no marker
    │   └── SubscriptionNotFoundError  the topic has no such subscription
    ├── TopicSettingsConflictError   create_topic asked for settings other than the stored ones
    │   └── SubscriptionConflictError  create_subscription asked for another filter or settings
    ├── ScheduleNotFoundError        the schedule has not been created (or was deleted)
    ├── ScheduleExistsError          create_schedule found a schedule of that name
    ├── LimitTimeoutError            concurrency_limit's timeout passed with every slot held, or
    │                                rate_limit's next permit is due later (also a ``TimeoutError``)
    ├── RateLimitedError             raised by a handler (as ``RateLimited(retry_after=)``):
    │                                pause its subscriber everywhere, the message back uncounted
    ├── PublishError                 a message could not be written (``__cause__`` says why)
    │   ├── QueueFullError           a topic stayed at ``max_pending`` for the whole wait
    │   └── PayloadError             the payload or attributes cannot be encoded (not
    │                                JSON-serialisable, NaN...)
    ├── LeaseConflictError           another consumer holds the lease
    ├── LeaseLostError               the lease expired and was taken over; nothing was deleted
    ├── DataLossError                (Spark) a message of a replayed micro-batch is gone
    └── BatchFailureError            raised by a batch handler: these messages failed, ack the rest

``ConfigError`` is for configuration: the config (file, mapping, URL, environment variables,
builder), the store it selects, topic settings (``create_topic``, ``update_topic``), a
consumer's ``visibility_timeout``, and the names of topics, producers, consumers and store
keys, wherever they are given. ``ArgumentError`` is for any other bad value given to a call:
``publish``'s ``delay``, ``group`` and ``dedup_id``, ``extend``'s seconds, ``nack``'s
``delay``, a ``Retry``'s fields, ``redrive``'s ``ids`` and ``per_second``,
``register_consumer``'s ``topics`` when not a list, ``registry.list``'s role. These raised
``ConfigError`` before ``ArgumentError`` existed; both subclass ``ValueError``, so ``except
ValueError`` catches either.

The store errors' shorter names (``NotFound``, ``AlreadyExists``, ``PreconditionFailed``,
``StoreUnavailable``, ``AccessDenied``, ``BucketNotFound``, ``RootNotFound``) remain, as
aliases of the same classes; ``RateLimited`` is ``RateLimitedError``.

Storage-client exceptions (obstore, OSError) are translated where the store is called and
never reach users; the original is kept as ``__cause__``. Messages never contain credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class PawnQueueError(Exception):
    """Root of every pawn-queue error."""


class ConfigError(PawnQueueError, ValueError):
    """Invalid configuration, store, topic settings or name (see the module docstring)."""


class ArgumentError(PawnQueueError, ValueError):
    """A bad value for an option of one call, such as ``publish(delay=-1)`` (see the module
    docstring); raised before anything is written."""


class ReplayUnavailableError(ArgumentError):
    """``seek`` was asked for messages the topic no longer keeps (or never kept: no
    ``replay_window_seconds``), so it would drop what waits and not bring it back; nothing
    was changed. ``seek(..., drop=True)`` drops what waits all the same."""


class StoreError(PawnQueueError):
    """The storage failed or refused a request."""


class NotFoundError(StoreError):
    """The key does not exist."""


class AlreadyExistsError(StoreError):
    """A create-only put found the key already present."""


class PreconditionFailedError(StoreError):
    """An if-match put found another etag (or no object) at the key."""


class StoreUnavailableError(StoreError):
    """A transient failure: timeout, refused connection, server error or throttling."""


class StoreThrottledError(StoreUnavailableError):
    """The store refused a request for its request rate (HTTP 429, 503 ``SlowDown``, Azure
    ``ServerBusy``). The queue backs off and resends such requests (docs/protocol.md,
    "Request rates"); a caller sees this only once the store's ``throttle_timeout_seconds``
    has passed."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        """The pause the store asked for (its ``Retry-After``), in seconds, if it said."""


class AccessDeniedError(StoreError):
    """The credentials are missing, wrong, or lack permission."""


class BucketNotFoundError(StoreError):
    """The bucket or root directory does not exist."""


class RootNotFoundError(BucketNotFoundError, NotFoundError):
    """The local directory of a filesystem store does not exist (yet).

    Reads raise it, naming the directory (a delete there has nothing to delete); the first
    write creates the directory. It is also a :class:`NotFoundError`: a key read there does
    not exist, so code that reads before its first write (a registration) sees a missing key,
    as in an empty store.
    """


# The shorter names, kept: the same classes.
NotFound = NotFoundError
AlreadyExists = AlreadyExistsError
PreconditionFailed = PreconditionFailedError
StoreUnavailable = StoreUnavailableError
AccessDenied = AccessDeniedError
BucketNotFound = BucketNotFoundError
RootNotFound = RootNotFoundError


class TopicNotFoundError(PawnQueueError):
    """The topic has not been created."""


class SubscriptionNotFoundError(TopicNotFoundError):
    """The subscription has not been created (or was deleted)."""


class ScheduleNotFoundError(PawnQueueError):
    """The schedule has not been created (or was deleted)."""


class ScheduleExistsError(PawnQueueError, ValueError):
    """``create_schedule`` found a schedule of that name; nothing was written (change it
    with ``update_schedule``)."""


class LimitTimeoutError(PawnQueueError, TimeoutError):
    """``concurrency_limit``'s ``timeout`` passed while every slot of the limit was held
    (nothing is held), or ``rate_limit``'s next permit is not due within its ``timeout``.
    Also a :class:`TimeoutError`."""


class RateLimitedError(PawnQueueError):
    """Raise it from a handler whose upstream refused for its rate (an HTTP 429): the
    subscriber pauses in every process for ``retry_after`` seconds, and the message comes
    back after them without counting as a failed receive (docs/concepts/flow-control.md)."""

    MAX_SECONDS = 86_400.0

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        seconds = retry_after
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ArgumentError(f"retry_after: got {seconds!r}, must be a number of seconds")
        if not 0 < seconds <= self.MAX_SECONDS:  # NaN fails this too
            raise ArgumentError(f"retry_after: got {seconds!r}, must be above 0 and at most a day")
        super().__init__(message or f"rate limited: retry after {seconds:g} s")
        self.retry_after = float(seconds)


RateLimited = RateLimitedError  # the name a handler raises: ``raise RateLimited(retry_after=30)``


class TopicSettingsConflictError(PawnQueueError, ValueError):
    """``create_topic`` was given settings that differ from the topic's stored ones.

    Nothing was written. ``differences`` maps each setting to ``(stored, asked)``; change
    settings with ``update_topic``.
    """

    def __init__(self, topic: str, differences: dict[str, tuple[object, object]]) -> None:
        self.topic = topic
        self.differences = differences
        shown = ", ".join(
            f"{name} is {stored!r}, asked {asked!r}"
            for name, (stored, asked) in differences.items()
        )
        super().__init__(
            f"topic {topic!r} exists with other settings: {shown} (use update_topic to change them)"
        )


class SubscriptionConflictError(TopicSettingsConflictError):
    """``create_subscription`` was given a filter or settings that differ from the stored
    ones. Nothing was written; change them with ``update_subscription``."""

    def __init__(
        self, topic: str, name: str, differences: dict[str, tuple[object, object]]
    ) -> None:
        self.topic = topic
        self.subscription = name
        self.differences = differences
        shown = ", ".join(
            f"{setting} is {stored!r}, asked {asked!r}"
            for setting, (stored, asked) in differences.items()
        )
        PawnQueueError.__init__(
            self,
            f"subscription {name!r} of topic {topic!r} exists with other settings: {shown} "
            "(use update_subscription to change them)",
        )


class PublishError(PawnQueueError):
    """A message could not be written; ``__cause__`` holds the store error."""


class QueueFullError(PublishError):
    """The topic stayed at its ``max_pending`` bound for the whole wait."""


class PayloadError(PublishError, TypeError):
    """The payload cannot be encoded as a message (not JSON-serialisable, NaN, too deep)."""


class LeaseConflictError(PawnQueueError):
    """Another consumer holds the lease."""


class LeaseLostError(PawnQueueError):
    """The lease expired and was taken over; the operation deleted nothing."""


class DataLossError(PawnQueueError):
    """A message listed in a Spark micro-batch's manifest is gone (see option failOnDataLoss)."""


class BatchFailureError(PawnQueueError):
    """Raised by a batch handler (``listen(handler, batch=N)``, ``App.subscriber(batch=N)``)
    to fail some of its messages and have the others acked.

    ``failures`` maps each failed message (the message itself, or its position in the list
    the handler got) to its error: each is retried or dead-lettered as a handler failure of
    its own would be (the listener's ``Retry`` decides, from that error).
    """

    def __init__(self, failures: Mapping[Any, BaseException]) -> None:
        self.failures = dict(failures)
        super().__init__(f"{len(self.failures)} message(s) of the batch failed")
