"""Stores: the storage primitives the queue is built on (see :mod:`pawn_queue.store.base`)."""

from __future__ import annotations

from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import ConfigError
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, Store, StoredObject
from pawn_queue.store.throttling import ThrottleBackoff

__all__ = ["IfMatch", "ObjectMeta", "PutMode", "Store", "StoredObject", "open_store"]


def open_store(config: PawnQueueConfig) -> Store:
    """The store selected by ``config.backend``. Does no I/O. An S3 or Azure store backs
    off from throttled requests (:class:`~pawn_queue.store.throttling.ThrottleBackoff`)."""
    if config.backend == "memory":
        from pawn_queue.store.memory import MemoryStore

        name = config.memory.name
        return MemoryStore.named(name) if name else MemoryStore()
    if config.backend == "filesystem":
        from pawn_queue.store.filesystem import FilesystemStore

        if config.filesystem is None:
            raise ConfigError("backend 'filesystem' needs filesystem.path")
        return FilesystemStore(config.filesystem.path)
    if config.backend == "s3":
        from pawn_queue.store.s3 import S3Store

        if config.s3 is None:
            raise ConfigError("backend 's3' needs an s3 section with bucket_name")
        return ThrottleBackoff(S3Store(config.s3), config.s3.throttle_timeout_seconds)
    if config.backend == "azure":
        from pawn_queue.store.azure import AzureStore

        if config.azure is None:
            raise ConfigError("backend 'azure' needs an azure section with container_name")
        return ThrottleBackoff(AzureStore(config.azure), config.azure.throttle_timeout_seconds)
    raise ConfigError(
        f"backend: got {config.backend!r}, allowed: 's3', 'filesystem', 'memory', 'azure'"
    )
