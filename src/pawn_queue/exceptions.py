"""Every error pawn-queue raises.

One root, so ``except PawnQueueError`` catches everything the library raises::

    PawnQueueError
    ├── ConfigError                  invalid configuration, URL or name (raised before any I/O)
    ├── StoreError                   the storage failed or refused a request
    │   ├── NotFound                 the key does not exist
    │   ├── AlreadyExists            create-only put on an existing key
    │   ├── PreconditionFailed       if-match put whose etag no longer matches (or key is gone)
    │   ├── StoreUnavailable         transient: timeout, connection refused, 5xx, throttling
    │   ├── AccessDenied             credentials missing, wrong or without permission
    │   └── BucketNotFound           the bucket (or root directory) does not exist
    │       └── RootNotFound         the local directory does not exist (yet): also a NotFound
    ├── TopicNotFoundError           the topic has no marker
    ├── TopicSettingsConflictError   create_topic asked for settings other than the stored ones
    ├── PublishError                 a message could not be written (``__cause__`` says why)
    ├── QueueFullError               a topic stayed at ``max_pending`` for the whole wait
    ├── PayloadError                 the payload cannot be encoded (not JSON-serialisable, NaN...)
    ├── LeaseConflictError           another consumer holds the lease
    └── LeaseLostError               the lease expired and was taken over; nothing was deleted

Storage-client exceptions (obstore, OSError) are translated where the store is called and
never reach users; the original is kept as ``__cause__``. Messages never contain credentials.
"""

from __future__ import annotations


class PawnQueueError(Exception):
    """Root of every pawn-queue error."""


class ConfigError(PawnQueueError, ValueError):
    """Invalid configuration, store URL or name."""


class StoreError(PawnQueueError):
    """The storage failed or refused a request."""


class NotFound(StoreError):
    """The key does not exist."""


class AlreadyExists(StoreError):
    """A create-only put found the key already present."""


class PreconditionFailed(StoreError):
    """An if-match put found another etag (or no object) at the key."""


class StoreUnavailable(StoreError):
    """A transient failure: timeout, refused connection, server error or throttling."""


class AccessDenied(StoreError):
    """The credentials are missing, wrong, or lack permission."""


class BucketNotFound(StoreError):
    """The bucket or root directory does not exist."""


class RootNotFound(BucketNotFound, NotFound):
    """The local directory of a filesystem store does not exist (yet).

    Reads raise it, naming the directory (a delete there has nothing to delete); the first
    write creates the directory. It is also a :class:`NotFound`: a key read there does not
    exist, so code that reads before its first write (a registration) sees a missing key,
    as in an empty store.
    """


class TopicNotFoundError(PawnQueueError):
    """The topic has not been created."""


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
