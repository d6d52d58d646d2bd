"""The storage protocol: the only primitives the queue needs.

Every backend implements :class:`Store`. Keys are ``/``-separated strings; listing is
lexicographic by key (UTF-8 byte order). Errors are the :class:`~pawn_queue.exceptions.StoreError`
subclasses, never a storage client's own exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, TypeAlias, runtime_checkable

LIST_PAGE = 1000
"""The most keys one S3 LIST request returns, and the most one DeleteObjects request takes:
the page in which the queue lists and deletes (re-exported as ``layout.LIST_PAGE``)."""


class AnswerLost(Exception):
    """Kept as ``__cause__`` of a StoreUnavailableError whose request got no answer (its
    connection broke or it timed out): the store may have applied it. A store that always
    answers (memory, a local directory) never raises it."""


def answer_lost(error: BaseException) -> bool:
    """Whether ``error`` came without an answer, so its request may have been applied."""
    return isinstance(error.__cause__, AnswerLost)


@dataclass(frozen=True, slots=True)
class IfMatch:
    """Put mode: replace the object only if its current etag is ``etag``."""

    etag: str


PutMode: TypeAlias = Literal["overwrite", "create"] | IfMatch
"""``"overwrite"`` (unconditional), ``"create"`` (fail with AlreadyExists if the key exists),
or ``IfMatch(etag)`` (fail with PreconditionFailed unless the current etag is ``etag``)."""


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a listing or a HEAD tells about one object."""

    key: str
    etag: str
    size: int
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object's bytes with its metadata, as returned by :meth:`Store.get`."""

    data: bytes
    meta: ObjectMeta


@runtime_checkable
class Store(Protocol):
    """Async storage primitives. Implementations: memory, filesystem, s3."""

    async def get(self, key: str) -> StoredObject:
        """Return the object; raise NotFound if absent."""
        ...

    async def head(self, key: str) -> ObjectMeta:
        """Return the object's metadata; raise NotFound if absent."""
        ...

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        """Write ``data`` at ``key`` and return the new etag once the write is durable.

        Raises AlreadyExists (mode ``"create"``) or PreconditionFailed (``IfMatch``).
        ``durable=False`` allows a store to skip flushing to stable storage (leases and
        change signals, which a power loss may forget safely); the write is still atomic
        and visible to every reader when ``put`` returns.
        """
        ...

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        """Objects whose key starts with ``prefix`` and sorts after ``start_after``, in key
        order, at most ``limit`` of them (all when None)."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object; deleting a missing key is not an error."""
        ...

    async def delete_many(self, keys: Sequence[str]) -> None:
        """Delete all ``keys`` (missing ones are ignored) in as few requests as the store allows."""
        ...

    async def close(self) -> None:
        """Release connections and threads. The store is unusable afterwards."""
        ...
