"""A local directory as the store (POSIX only: it relies on ``fcntl.flock`` and hard links).

Layout: key ``a/b/c.json`` is the file ``ROOT/a/b/c.json``. ``ROOT/.pawnqueue/`` is reserved
for temp files (``tmp/``) and lock files (``locks/``); it never shows in listings and keys
cannot start with it. The root is created by the first operation, not the constructor. Files
are created ``0o600`` and directories ``0o700``: the store is private to the user running it.

Guarantees, across threads and processes on one host (not across NFS clients):

- ``put`` writes a temp file in the same filesystem, fsyncs it, commits it with a rename
  (overwrite, if-match) or a hard link (create, so an existing key is never replaced), and
  fsyncs the directory (and the parents of directories it created) before returning.
  ``durable=False`` (leases, change signals) skips the two fsyncs of the file and its
  directory: the write is as atomic and as visible, and a power loss may forget it.
- If-match, overwrite, create and delete on one key serialise on one of 256 striped lock files
  (``fcntl.flock`` on a freshly opened descriptor, so it excludes threads as well as processes).
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
- As with any store, a put whose caller is cancelled may still complete.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import os
import re
import stat
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TypeVar

from pawn_queue.exceptions import (
    AccessDenied,
    AlreadyExists,
    BucketNotFound,
    ConfigError,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store import _fs_listing
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, StoredObject

T = TypeVar("T")

RESERVED = ".pawnqueue"
_LOCK_STRIPES = 256
_MAX_KEY_BYTES = 1024  # S3's limit
_MAX_SEGMENT_BYTES = 255  # NAME_MAX on every common filesystem
_STALE_TMP_NS = 3600 * 10**9
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")  # category Cc, and backslash
_TRANSIENT = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE}

_clock_lock = threading.Lock()
_last_ns = 0


def _unique_ns() -> int:
    """A wall-clock nanosecond timestamp never handed out twice in this process."""
    global _last_ns
    with _clock_lock:
        _last_ns = max(time.time_ns(), _last_ns + 1)
        return _last_ns


def _segment_problem(segment: str) -> str | None:
    if segment in ("", ".", ".."):
        return f"segment {segment!r} is not allowed"
    if _FORBIDDEN_CHARS.search(segment):
        return "backslashes and control characters are not allowed"
    try:
        size = len(segment.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > _MAX_SEGMENT_BYTES:
        return f"a segment is {size} bytes; the limit is {_MAX_SEGMENT_BYTES}"
    return None


def check_key(key: str) -> None:
    """Raise ConfigError unless ``key`` maps to a path strictly inside the root."""
    if not key:
        raise ConfigError("store key must not be empty")
    if key.startswith("/"):
        raise ConfigError(f"store key {key!r} must not start with '/'")
    segments = key.split("/")
    if segments[0] == RESERVED:
        raise ConfigError(f"store key {key!r} is in the reserved directory {RESERVED}/")
    for segment in segments:
        problem = _segment_problem(segment)
        if problem is not None:
            raise ConfigError(f"invalid store key {key!r}: {problem}")
    if len(key.encode("utf-8")) > _MAX_KEY_BYTES:
        raise ConfigError(f"store key {key[:40]!r}... is longer than {_MAX_KEY_BYTES} bytes")


def _etag(st: os.stat_result) -> str:
    return f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'


def _meta(key: str, st: os.stat_result) -> ObjectMeta:
    return ObjectMeta(
        key=key,
        etag=_etag(st),
        size=st.st_size,
        last_modified=datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC),
    )


def _translate(exc: OSError, action: str, path: str) -> StoreError:
    message = f"{action} {path}: {exc.strerror or exc}"
    if exc.errno == errno.ENOENT:
        return NotFound(message)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccessDenied(message)
    if exc.errno in _TRANSIENT:
        return StoreUnavailable(message)
    return StoreError(message)


def _read_all(fd: int, size: int) -> bytes:
    # Objects are replaced, never modified in place, so the size from fstat is final.
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(fd, size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _collision(key: str) -> StoreError:
    return StoreError(
        f"key {key!r} collides with a directory or file of other keys on the filesystem store "
        "(a key cannot be both an object and a prefix followed by '/')"
    )


class FilesystemStore:
    """A directory as the store (see the module docstring for the guarantees)."""

    def __init__(self, root: str | os.PathLike[str], *, workers: int = 16) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._tmp = os.path.join(self._root, RESERVED, "tmp")
        self._locks = os.path.join(self._root, RESERVED, "locks")
        self._closed = False
        self._ready = False  # the root is prepared by the first operation: no I/O here
        self._ready_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pawnqueue-fs")

    @property
    def root(self) -> str:
        return self._root

    def __repr__(self) -> str:
        return f"FilesystemStore({self._root!r})"

    # -- async API ------------------------------------------------------------------------

    async def get(self, key: str) -> StoredObject:
        check_key(key)
        return await self._run(self._get, key)

    async def head(self, key: str) -> ObjectMeta:
        check_key(key)
        return await self._run(self._head, key)

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        check_key(key)
        if not (mode in ("overwrite", "create") or isinstance(mode, IfMatch)):
            raise ConfigError(f"unknown put mode {mode!r}")
        return await self._run(self._put, key, data, mode, durable)

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        if limit is not None and limit <= 0:
            return []
        return await self._run(self._list, prefix, start_after, limit)

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._run(self._delete, key)

    async def delete_many(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        for key in keys:
            check_key(key)
        # A few large batches in parallel: each delete is a lock plus an unlink.
        chunk = max(64, -(-len(keys) // 8))
        batches = [keys[i : i + chunk] for i in range(0, len(keys), chunk)]
        await asyncio.gather(*(self._run(self._delete_batch, batch) for batch in batches))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Let in-flight writes finish so nothing returns after close with a half-done put.
        await asyncio.to_thread(self._pool.shutdown, True)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._call, fn, *args)

    # -- blocking helpers (run in the pool) -------------------------------------------------

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        if not self._ready:
            self._prepare()
        return fn(*args)

    def _prepare(self) -> None:
        """Create the root and the reserved directories, and sweep crashed writers' temp files."""
        with self._ready_lock:
            if self._ready:
                return
            try:
                os.makedirs(self._root, mode=0o700, exist_ok=True)
                self._make_internal_dirs()
                for path in (self._tmp, self._locks):
                    if self._linked_dir(path[len(self._root) + 1 :], last=True):
                        raise StoreError(f"{path} is a symbolic link; the store does not follow")
                self._sweep_stale_tmp()
            except (FileExistsError, NotADirectoryError) as exc:
                raise BucketNotFound(f"store root {self._root} is not a directory") from exc
            except OSError as exc:
                raise _translate(exc, "prepare store root", self._root) from exc
            self._ready = True

    def _path(self, key: str) -> str:
        return self._root + "/" + key

    def _linked_dir(self, key: str, *, last: bool = False) -> str | None:
        """The first directory on the way to ``key`` (with ``last``: to and including it) that
        is a symbolic link, or None: the store follows none, they may lead out of the root."""
        segments = key.split("/")
        path = self._root
        for segment in segments if last else segments[:-1]:
            path = path + "/" + segment
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None  # missing (or unreadable: the operation itself reports that)
            if stat.S_ISLNK(mode):
                return path
            if not stat.S_ISDIR(mode):
                return None
        return None

    def _refuse_links(self, key: str) -> None:
        link = self._linked_dir(key)
        if link is not None:
            raise StoreError(
                f"cannot write {key!r}: {link} is a symbolic link, and the store does not "
                "follow links inside its root"
            )

    def _make_internal_dirs(self) -> None:
        for path in (os.path.join(self._root, RESERVED), self._tmp, self._locks):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)

    def _sweep_stale_tmp(self) -> None:
        # Temp files of crashed writers; a live writer's temp file is seconds old at most.
        cutoff = time.time_ns() - _STALE_TMP_NS
        with os.scandir(self._tmp) as entries:
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_mtime_ns < cutoff:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    pass

    def _open_internal(self, path: str, flags: int) -> int:
        """Open a temp or lock file, recreating the reserved directories if someone removed
        them; a missing root means the store itself is gone."""
        try:
            return os.open(path, flags | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            if not os.path.isdir(self._root):
                raise BucketNotFound(f"store root {self._root} does not exist") from None
            self._make_internal_dirs()
            return os.open(path, flags | os.O_CLOEXEC, 0o600)

    def _lock(self, key: str) -> int:
        stripe = zlib.crc32(key.encode("utf-8")) % _LOCK_STRIPES
        path = os.path.join(self._locks, f"{stripe:02x}.lock")
        fd = self._open_internal(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd  # closing the descriptor releases the lock

    def _missing(self, key: str) -> StoreError:
        if not os.path.isdir(self._root):
            return BucketNotFound(f"store root {self._root} does not exist")
        return NotFound(f"no object at {key!r}")

    def _get(self, key: str) -> StoredObject:
        path = self._path(key)
        if self._linked_dir(key):
            raise self._missing(key)
        try:
            # O_NOFOLLOW: only regular files the store wrote are objects, as in listings.
            # O_NONBLOCK: opening a FIFO planted at the key must not wait for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._missing(key) from exc
            raise _translate(exc, "open", path) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._missing(key)  # a directory: a prefix of other keys
            data = _read_all(fd, st.st_size)
        except OSError as exc:
            raise _translate(exc, "read", path) from exc
        finally:
            os.close(fd)
        return StoredObject(data=data, meta=_meta(key, st))

    def _head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        if self._linked_dir(key):
            raise self._missing(key)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except OSError as exc:
            raise _translate(exc, "stat", path) from exc
        if not stat.S_ISREG(st.st_mode):
            raise self._missing(key)
        return _meta(key, st)

    def _put(self, key: str, data: bytes, mode: PutMode, durable: bool) -> str:
        path = self._path(key)
        tmp = os.path.join(self._tmp, f"{uuid.uuid4().hex}.tmp")
        self._refuse_links(key)
        try:
            if mode != "overwrite":
                # Fail a doomed conditional put before paying for a temp file and an fsync;
                # the deciding check is repeated under the lock.
                self._check_condition(key, path, mode)
            etag = self._write_tmp(tmp, data, durable)
            created = self._make_parents(key)
            lock = self._lock(key)
            try:
                before = _fs_listing.directory_mtime(os.path.dirname(path))
                self._commit(key, tmp, path, mode)
                _fs_listing.changed(
                    os.path.dirname(path), os.path.basename(path), added=True, before_ns=before
                )
            finally:
                os.close(lock)
            for directory in created:
                _fsync_dir(directory)  # always: a directory lost in a crash loses later keys
            if durable:
                _fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise _translate(exc, "write", path) from exc
        finally:
            # Still there after a link or a failure; a leftover is swept by a later start.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return etag

    def _write_tmp(self, tmp: str, data: bytes, durable: bool) -> str:
        fd = self._open_internal(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            ns = _unique_ns()
            os.utime(fd, ns=(ns, ns))  # after the writes, which would bump mtime again
            if durable:
                os.fsync(fd)
            return _etag(os.fstat(fd))  # rename and link keep the inode and mtime
        finally:
            os.close(fd)

    def _make_parents(self, key: str) -> builtins.list[str]:
        """Create the key's missing parent directories; return the directories whose entries
        changed (to fsync)."""
        missing: list[str] = []
        parent = os.path.dirname(self._path(key))
        while parent != self._root:
            try:
                st = os.stat(parent)
            except FileNotFoundError:
                missing.append(parent)
                parent = os.path.dirname(parent)
                continue
            except NotADirectoryError:
                raise _collision(key) from None
            if not stat.S_ISDIR(st.st_mode):
                raise _collision(key)
            break
        changed: list[str] = []
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700)
                changed.append(os.path.dirname(directory))
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise _collision(key) from None
            except NotADirectoryError:
                raise _collision(key) from None
        return changed

    def _check_condition(self, key: str, path: str, mode: PutMode) -> None:
        """Raise unless a ``create`` or ``IfMatch`` put may replace what is at ``path`` now."""
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            if isinstance(mode, IfMatch):
                raise PreconditionFailed(f"no object at {key!r} to match {mode.etag}") from None
            return
        if not stat.S_ISREG(st.st_mode):
            raise _collision(key)
        if mode == "create":
            raise AlreadyExists(f"an object already exists at {key!r}")
        if isinstance(mode, IfMatch) and _etag(st) != mode.etag:
            raise PreconditionFailed(f"object at {key!r} has etag {_etag(st)}, not {mode.etag}")

    def _commit(self, key: str, tmp: str, path: str, mode: PutMode) -> None:
        """Move the temp file into place; the caller holds the key's stripe lock."""
        if mode == "create":
            try:
                os.link(tmp, path)  # fails if anything exists there, atomically
            except FileExistsError:
                self._check_condition(key, path, mode)
                raise AlreadyExists(f"an object already exists at {key!r}") from None
            return
        if isinstance(mode, IfMatch):
            self._check_condition(key, path, mode)
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            raise _collision(key) from None

    def _delete(self, key: str) -> None:
        path = self._path(key)
        if self._linked_dir(key):
            return  # nothing the store could have written
        lock = self._lock(key)
        try:
            before = _fs_listing.directory_mtime(os.path.dirname(path))
            os.unlink(path)
            _fs_listing.changed(
                os.path.dirname(path), os.path.basename(path), added=False, before_ns=before
            )
        except (FileNotFoundError, NotADirectoryError):
            pass  # nothing stored at this key
        except OSError as exc:
            # A directory is a prefix of other keys, not an object (macOS says EPERM).
            if not os.path.isdir(path):
                raise _translate(exc, "delete", path) from exc
        finally:
            os.close(lock)

    def _delete_batch(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._delete(key)

    # -- listing ----------------------------------------------------------------------------

    def _list(
        self, prefix: str, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectMeta]:
        dir_part, slash, partial = prefix.rpartition("/")
        if slash:
            segments = dir_part.split("/")
            if segments[0] == RESERVED or any(_segment_problem(s) for s in segments):
                return []  # no valid key can start with this prefix
            if self._linked_dir(dir_part, last=True):
                return []  # the store never follows a link: nothing it wrote is there
            directory, base = self._path(dir_part), dir_part + "/"
        else:
            directory, base = self._root, ""
        result: list[ObjectMeta] = []
        for meta in self._walk(directory, base, partial, start_after):
            result.append(meta)
            if limit is not None and len(result) >= limit:
                break
        if not result and not os.path.isdir(self._root):
            raise BucketNotFound(f"store root {self._root} does not exist")
        return result

    def _walk(
        self, directory: str, base: str, partial: str, start_after: str | None
    ) -> Iterator[ObjectMeta]:
        """Yield the objects under ``directory`` (whose keys start with ``base``) in key order,
        skipping subtrees entirely at or before ``start_after``."""
        relative: str | None = None
        if start_after is not None and start_after >= base:
            if not start_after.startswith(base):
                return  # every key here sorts before start_after
            relative = start_after[len(base) :]
        try:
            keys = _fs_listing.sorted_entries(directory, self._nameable)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise _translate(exc, "list", directory) from exc
        for name in _fs_listing.window(keys, partial, relative):
            path = os.path.join(directory, name.rstrip("/"))
            if name.endswith("/"):
                if base or name != RESERVED + "/":
                    yield from self._walk(path, base + name, "", start_after)
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # deleted since the scan
            except OSError as exc:
                raise _translate(exc, "stat", path) from exc
            if stat.S_ISREG(st.st_mode):
                yield _meta(base + name, st)

    @staticmethod
    def _nameable(name: str) -> bool:
        """Whether some key could name this entry (stray files are not objects)."""
        return _segment_problem(name) is None
