"""An in-process store with the same semantics as S3: for tests, demos and single-process use.

Not a mock: create-only and if-match puts are atomic, listing is in key order with
``start_after`` and ``limit``, and every write gets a fresh etag.
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import ClassVar

from pawn_queue.exceptions import (
    AlreadyExists,
    ConfigError,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, StoredObject

_MAX_KEY_BYTES = 1024  # S3's limit, so code that works here works there


def _check_key(key: str) -> None:
    if not key:
        raise ConfigError("store key must not be empty")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(f"store key {key!r} is not valid UTF-8") from exc
    if size > _MAX_KEY_BYTES:
        raise ConfigError(f"store key is {size} bytes; the limit is {_MAX_KEY_BYTES}")


class MemoryStore:
    """A thread-safe in-memory store.

    ``MemoryStore()`` is private to its owner. ``MemoryStore.named(name)`` returns one shared
    instance per name for the whole process (what ``memory://name`` URLs resolve to); closing a
    named store does not clear it, since other clients may still use it.

    One lock guards everything: every operation is short (a dict lookup, a bisect, or a slice
    of at most ``limit`` keys), so callers from a blocking facade's threads barely contend.
    """

    _registry: ClassVar[dict[str, MemoryStore]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, StoredObject] = {}
        self._keys: list[str] = []  # sorted; str order is code-point order, i.e. UTF-8 byte order
        self._closed = False
        self._shared = False

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """Return the process-wide store called ``name``, creating it on first use."""
        if not name:
            raise ConfigError("a shared memory store needs a non-empty name")
        with cls._registry_lock:
            store = cls._registry.get(name)
            if store is None:
                store = cls()
                store._shared = True
                cls._registry[name] = store
            return store

    @classmethod
    def forget(cls, name: str) -> None:
        """Drop the shared store ``name`` (its data goes once nobody holds it)."""
        with cls._registry_lock:
            cls._registry.pop(name, None)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("memory store is closed")

    async def get(self, key: str) -> StoredObject:
        _check_key(key)
        with self._lock:
            self._check_open()
            obj = self._objects.get(key)
        if obj is None:
            raise NotFound(f"no object at {key!r}")
        return obj

    async def head(self, key: str) -> ObjectMeta:
        return (await self.get(key)).meta

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        _check_key(key)
        # bytes() copies mutable buffers, so later changes by the caller cannot leak in.
        payload = bytes(data)
        meta = ObjectMeta(
            key=key,
            etag=f'"{uuid.uuid4().hex}"',
            size=len(payload),
            last_modified=datetime.now(UTC),
        )
        with self._lock:
            self._check_open()
            current = self._objects.get(key)
            if mode == "create":
                if current is not None:
                    raise AlreadyExists(f"an object already exists at {key!r}")
            elif isinstance(mode, IfMatch):
                if current is None:
                    raise PreconditionFailed(f"no object at {key!r} to match {mode.etag}")
                if current.meta.etag != mode.etag:
                    raise PreconditionFailed(
                        f"object at {key!r} has etag {current.meta.etag}, not {mode.etag}"
                    )
            elif mode != "overwrite":
                raise ConfigError(f"unknown put mode {mode!r}")
            if current is None:
                bisect.insort(self._keys, key)
            self._objects[key] = StoredObject(data=payload, meta=meta)
        return meta.etag

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        if limit is not None and limit <= 0:
            return []
        with self._lock:
            self._check_open()
            keys = self._keys
            if start_after is not None and start_after >= prefix:
                i = bisect.bisect_right(keys, start_after)
            else:
                i = bisect.bisect_left(keys, prefix)
            end = len(keys) if limit is None else min(len(keys), i + limit)
            result: list[ObjectMeta] = []
            for key in keys[i:end]:
                if not key.startswith(prefix):
                    break
                result.append(self._objects[key].meta)
            return result

    async def delete(self, key: str) -> None:
        await self.delete_many([key])

    async def delete_many(self, keys: Sequence[str]) -> None:
        for key in keys:
            _check_key(key)
        with self._lock:
            self._check_open()
            gone = {key for key in keys if self._objects.pop(key, None) is not None}
            if len(gone) > 16:
                # One O(n) rebuild beats many O(n) list deletions.
                self._keys = [key for key in self._keys if key not in gone]
            else:
                for key in gone:
                    del self._keys[bisect.bisect_left(self._keys, key)]

    async def close(self) -> None:
        if self._shared:
            return
        with self._lock:
            self._closed = True
            self._objects.clear()
            self._keys.clear()
