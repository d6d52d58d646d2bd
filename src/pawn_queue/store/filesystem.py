"""A local directory as the store (POSIX only: it relies on ``fcntl.flock`` and hard links).

Layout: key ``a/b/c.json`` is the file ``ROOT/a/b/c.json``. ``ROOT/.pawnqueue/`` is reserved
for temp files (``tmp/``, which also holds deleted files until they are unlinked) and lock
files (``locks/``); it never shows in listings and keys cannot start with it. Files are
created ``0o600`` and directories ``0o700``: the store is private to the user running it.

The root (with its missing parents) and ``.pawnqueue/`` are created by the first write, never
by the constructor, a read or a delete. Reads of a root that does not exist raise
RootNotFound naming it (also a NotFound: a key there is missing), so a mistyped path is not
silently taken for a new, empty store; a delete there has nothing to delete. A root that
vanishes after this store prepared it (an unmounted volume?) is not recreated: every
operation then raises BucketNotFound.

Guarantees, across threads and processes on one host (not across NFS clients):

- ``put`` writes a temp file in the same filesystem (unnamed, ``O_TMPFILE``, where the OS
  and filesystem support it; else named, in ``tmp/``), fsyncs it, commits it with a hard link
  (create, so an existing key is never replaced; also an overwrite of a missing key when the
  temp file is unnamed) or a rename (if-match, overwrite), and fsyncs the directory (and the
  parents of directories it created) before returning. ``durable=False`` (leases, change
  signals) skips the two fsyncs of the file and its directory: the write is as atomic and
  as visible, and a power loss may forget it.
- If-match, overwrite, create and delete on one key serialise on one of 256 striped lock files
  (``fcntl.flock`` on a descriptor kept per process, behind a thread lock per stripe, so it
  excludes threads as well as processes).
- An etag is derived from ``(inode, mtime_ns, size)``; every write stamps its temp file with a
  process-unique nanosecond mtime, so etags change on every write without reading contents.
  This needs a filesystem with nanosecond timestamps (ext4, xfs, btrfs, tmpfs, APFS).
- Directories are never removed (empty ones are skipped by listings), so a put never races a
  cleanup of its parent. A key cannot be both an object and a prefix of other keys (``a`` and
  ``a/b``): the second put raises StoreError.
- Only regular files are objects: symlinks and stray files no key could name are ignored.
  The store never follows a symbolic link inside the root (only the root itself may be
  one): a key under a linked directory is missing to reads, lists and deletes and refused
  to writes, so nothing is read, written or deleted outside the root through a link planted
  in it. This is checked before each operation; the root is private (``0o700``), so only
  its owner could swap a directory for a link during one.
- Work that cannot wait on the disk or on another writer runs on the event loop's thread:
  reads of objects up to 256 KiB, deletes of a few keys, and non-durable puts of up to
  64 KiB into existing directories (a thread hop costs more than the work). There a stripe
  lock is only tried: if another writer holds it, the operation moves to the thread pool.
  Fsyncs, directory creation, listings and larger objects always run on the pool.
- As with any store, a put whose caller is cancelled may still complete.

This module is the async API: it decides where each operation runs (on the event loop's
thread or on the pool) and runs it there. The blocking file work itself is
:class:`~pawn_queue.store._fs_files.DirectoryFiles`'s, the base of :class:`FilesystemStore`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pawn_queue.exceptions import ConfigError, RootNotFound, StoreError
from pawn_queue.store._fs_files import Access, DirectoryFiles, Offload
from pawn_queue.store._fs_support import check_key, root_error
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, StoredObject

T = TypeVar("T")

_INLINE_PUT_BYTES = 64 * 1024
_INLINE_DELETES = 32


def require_root(root: str | os.PathLike[str]) -> None:
    """Raise RootNotFound or BucketNotFound unless ``root`` is a directory: for tools that
    only read, which must refuse a mistyped path before anything writes there."""
    error = root_error(os.path.abspath(os.fspath(root)))
    if error is not None:
        raise error


class FilesystemStore(DirectoryFiles):
    """A directory as the store (see the module docstring for the guarantees)."""

    def __init__(self, root: str | os.PathLike[str], *, workers: int = 16) -> None:
        super().__init__(root)
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pawnqueue-fs")

    @property
    def root(self) -> str:
        return self._root

    def __repr__(self) -> str:
        return f"FilesystemStore({self._root!r})"

    # -- async API ------------------------------------------------------------------------

    async def get(self, key: str) -> StoredObject:
        check_key(key)
        if self._ready and not self._closed:
            with contextlib.suppress(Offload):
                return self._get(key, True)
        return await self._run("read", self._get, key, False)

    async def head(self, key: str) -> ObjectMeta:
        check_key(key)
        if self._ready and not self._closed:
            return self._head(key)  # a few lstat calls
        return await self._run("read", self._head, key)

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        check_key(key)
        if not (mode in ("overwrite", "create") or isinstance(mode, IfMatch)):
            raise ConfigError(f"unknown put mode {mode!r}")
        if not durable and len(data) <= _INLINE_PUT_BYTES and self._ready and not self._closed:
            with contextlib.suppress(Offload):
                return self._put(key, data, mode, durable, True)
        return await self._run("write", self._put, key, data, mode, durable, False)

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        if limit is not None and limit <= 0:
            return []
        return await self._run("read", self._list, prefix, start_after, limit)

    async def delete(self, key: str) -> None:
        await self.delete_many([key])

    async def delete_many(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        for key in keys:
            check_key(key)
        if not self._ready and isinstance(root_error(self._root), RootNotFound):
            return  # no directory holds no keys, and a delete must not create one
        if len(keys) <= _INLINE_DELETES and self._ready and not self._closed:
            trash: builtins.list[str] = []
            keys = keys[self._delete_batch(keys, trash) :]
            if trash:
                with contextlib.suppress(RuntimeError):  # shut down: a later start sweeps
                    self._pool.submit(self._reap, trash)
            if not keys:
                return
        # A few large batches in parallel: each delete is a lock plus an unlink.
        chunk = max(64, -(-len(keys) // 8))
        batches = [keys[i : i + chunk] for i in range(0, len(keys), chunk)]
        await asyncio.gather(
            *(self._run("delete", self._delete_batch, batch, None) for batch in batches)
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Let in-flight writes finish so nothing returns after close with a half-done put.
        await asyncio.to_thread(self._pool.shutdown, True)
        self._stripes.close()

    async def _run(self, access: Access, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._call, access, fn, *args)
