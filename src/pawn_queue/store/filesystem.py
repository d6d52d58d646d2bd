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
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import itertools
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar

from pawn_queue.exceptions import (
    AlreadyExists,
    BucketNotFound,
    ConfigError,
    NotFound,
    RootNotFound,
    StoreError,
)
from pawn_queue.store import _fs_listing
from pawn_queue.store._fs_support import (
    RESERVED,
    StripeLocks,
    check_condition,
    check_key,
    collision,
    etag_of,
    fsync_dir,
    make_parents,
    meta_of,
    read_all,
    root_error,
    segment_problem,
    sweep_stale_temps,
    translate,
    unique_ns,
)
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode, StoredObject

T = TypeVar("T")
Access = Literal["read", "write", "delete"]  # what an operation may do to a missing root

_LOCK_STRIPES = 256
_INLINE_PUT_BYTES = 64 * 1024
_INLINE_GET_BYTES = 256 * 1024
_INLINE_DELETES = 32
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
_temp_names = itertools.count()
_TEMP_TOKEN = secrets.token_hex(4)  # with the pid: distinct across forks and pid namespaces


def require_root(root: str | os.PathLike[str]) -> None:
    """Raise RootNotFound or BucketNotFound unless ``root`` is a directory: for tools that
    only read, which must refuse a mistyped path before anything writes there."""
    error = root_error(os.path.abspath(os.fspath(root)))
    if error is not None:
        raise error


class _Offload(Exception):
    """Raised by an operation tried on the event loop that would have to wait (a busy lock,
    a directory to create, a large object): nothing was changed, run it on the pool."""


class _Temp:
    """A temp file being written: its descriptor and, unless it is unnamed, its path."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str | None) -> None:
        self.fd = fd
        self.path = path


class FilesystemStore:
    """A directory as the store (see the module docstring for the guarantees)."""

    def __init__(self, root: str | os.PathLike[str], *, workers: int = 16) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._tmp = os.path.join(self._root, RESERVED, "tmp")
        self._locks = os.path.join(self._root, RESERVED, "locks")
        self._stripes = StripeLocks(
            [f"{self._locks}/{n:02x}.lock" for n in range(_LOCK_STRIPES)],
            lambda path: self._open_internal(path, os.O_RDWR | os.O_CREAT),
        )
        self._closed = False
        self._ready = False  # the root is prepared by the first write: no I/O here
        self._ready_lock = threading.Lock()
        self._unnamed_temps = False  # O_TMPFILE works here (probed when preparing)
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
            with contextlib.suppress(_Offload):
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
            with contextlib.suppress(_Offload):
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

    # -- blocking helpers (on the pool, or on the loop when ``inline``) ---------------------

    def _call(self, access: Access, fn: Callable[..., T], *args: object) -> T:
        # Reads need nothing prepared (they report a missing root themselves); a delete
        # needs the lock files, in a root that exists; only a write may create the root.
        if access != "read" and not self._ready:
            self._prepare(create=access == "write")
        return fn(*args)

    def _prepare(self, create: bool) -> None:
        """Create the root (if ``create``; else raise unless it exists) and the reserved
        directories, and sweep crashed writers' temp files."""
        with self._ready_lock:
            if self._ready:
                return
            if not create:
                error = root_error(self._root)
                if error is not None:
                    raise error
            try:
                # exist_ok: another process or store creating the root at the same moment
                # is no error (makedirs tolerates that race at every level).
                os.makedirs(self._root, mode=0o700, exist_ok=True)
                self._make_internal_dirs()
                for path in (self._tmp, self._locks):
                    if self._linked_dir(path[len(self._root) + 1 :], last=True):
                        raise StoreError(f"{path} is a symbolic link; the store does not follow")
                sweep_stale_temps(self._tmp)
                self._unnamed_temps = self._probe_unnamed_temps()
            except OSError as exc:
                raise (
                    root_error(self._root) or translate(exc, "prepare store root", self._root)
                ) from exc
            self._ready = True

    def _probe_unnamed_temps(self) -> bool:
        """Whether an ``O_TMPFILE`` file can be written here and linked to a name (it needs
        Linux, a filesystem that supports it, and /proc)."""
        if not _O_TMPFILE:
            return False
        try:
            temp = self._open_temp(True)
        except OSError:
            return False
        probe = self._temp_name()
        try:
            self._link(temp, probe)
            os.unlink(probe)
        except OSError:
            return False
        finally:
            os.close(temp.fd)
        return True

    def _path(self, key: str) -> str:
        return self._root + "/" + key

    def _parents(self, key: str, last: bool = False) -> tuple[str | None, bool]:
        """The first directory on the way to ``key`` (with ``last``: to and including it) that
        is a symbolic link, or None: the store follows none, they may lead out of the root.
        And whether every one of them exists as a real directory."""
        segments = key.split("/")
        if not last:
            segments.pop()
        path = self._root
        for segment in segments:
            path = path + "/" + segment
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                return None, False  # missing (or unreadable: the operation itself reports that)
            if stat.S_ISLNK(mode):
                return path, False
            if not stat.S_ISDIR(mode):
                return None, False
        return None, True

    def _linked_dir(self, key: str, *, last: bool = False) -> str | None:
        return self._parents(key, last)[0]

    def _make_internal_dirs(self) -> None:
        for path in (os.path.join(self._root, RESERVED), self._tmp, self._locks):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)

    def _open_internal(self, path: str, flags: int) -> int:
        """Open a temp or lock file, recreating the reserved directories if someone removed
        them; a missing root means the store itself is gone."""
        try:
            return os.open(path, flags | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            error = self._root_error()
            if error is not None:
                raise error from None
            self._make_internal_dirs()
            return os.open(path, flags | os.O_CLOEXEC, 0o600)

    def _lock(self, key: str, inline: bool) -> int:
        """Take the key's stripe lock; return the stripe, for :meth:`StripeLocks.release`. On
        the loop (``inline``) the lock is only tried: raise _Offload if someone holds it."""
        stripe = self._stripes.acquire(key, wait=not inline)
        if stripe is None:
            raise _Offload
        return stripe

    def _root_error(self) -> StoreError | None:
        error = root_error(self._root)
        if self._ready and isinstance(error, RootNotFound):
            # Gone since this store prepared it (an unmounted volume?): not an empty store.
            return BucketNotFound(f"store root {self._root} no longer exists")
        return error

    def _missing(self, key: str) -> StoreError:
        return self._root_error() or NotFound(f"no object at {key!r}")

    def _get(self, key: str, inline: bool) -> StoredObject:
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
            raise translate(exc, "open", path) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._missing(key)  # a directory: a prefix of other keys
            if inline and st.st_size > _INLINE_GET_BYTES:
                raise _Offload
            data = read_all(fd, st.st_size)
        except OSError as exc:
            raise translate(exc, "read", path) from exc
        finally:
            os.close(fd)
        return StoredObject(data=data, meta=meta_of(key, st))

    def _head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        if self._linked_dir(key):
            raise self._missing(key)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing(key) from None
        except OSError as exc:
            raise translate(exc, "stat", path) from exc
        if not stat.S_ISREG(st.st_mode):
            raise self._missing(key)
        return meta_of(key, st)

    def _put(self, key: str, data: bytes, mode: PutMode, durable: bool, inline: bool) -> str:
        path = self._path(key)
        directory, _, name = path.rpartition("/")
        link, parents_exist = self._parents(key)
        if link is not None:
            raise StoreError(
                f"cannot write {key!r}: {link} is a symbolic link, and the store does not "
                "follow links inside its root"
            )
        if inline and not parents_exist:
            raise _Offload  # creating directories means fsyncing them
        temp: _Temp | None = None
        try:
            if mode != "overwrite":
                # Fail a doomed conditional put before paying for a temp file and an fsync;
                # the deciding check is repeated under the lock.
                check_condition(key, path, mode)
            # An if-match put renames; create and overwrite try a link first (see _commit).
            temp = self._open_temp(self._unnamed_temps and not isinstance(mode, IfMatch))
            etag = self._write_temp(temp.fd, data, durable)
            created = [] if parents_exist else make_parents(self._root, key)
            lock = self._lock(key, inline)
            try:
                before = _fs_listing.before_change(directory)
                self._commit(key, temp, path, mode)
                if before is not None:
                    _fs_listing.changed(directory, name, added=True, before_ns=before)
            finally:
                self._stripes.release(lock)
            for parent in created:
                fsync_dir(parent)  # always: a directory lost in a crash loses later keys
            if durable:
                fsync_dir(directory)
        except OSError as exc:
            raise translate(exc, "write", path) from exc
        finally:
            if temp is not None:
                os.close(temp.fd)
                if temp.path is not None:
                    # Still there after a link or a failure; a leftover is swept by a later start.
                    with contextlib.suppress(OSError):
                        os.unlink(temp.path)
        return etag

    def _open_temp(self, unnamed: bool) -> _Temp:
        if unnamed:  # no directory entry to create and remove, nothing left by a crash
            return _Temp(self._open_internal(self._tmp, os.O_WRONLY | _O_TMPFILE), None)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        while True:
            path = self._temp_name()
            try:
                return _Temp(self._open_internal(path, flags), path)
            except FileExistsError:
                continue  # left by a crashed process

    def _temp_name(self) -> str:
        return f"{self._tmp}/{os.getpid()}-{_TEMP_TOKEN}-{next(_temp_names)}.tmp"

    def _write_temp(self, fd: int, data: bytes, durable: bool) -> str:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        ns = unique_ns()
        os.utime(fd, ns=(ns, ns))  # after the writes, which would bump mtime again
        if durable:
            os.fsync(fd)
        return etag_of(os.fstat(fd))  # link and rename keep the inode and mtime

    def _link(self, temp: _Temp, path: str) -> None:
        if temp.path is not None:
            os.link(temp.path, path)
        else:
            # linkat(AT_SYMLINK_FOLLOW) on /proc/self/fd/N names an O_TMPFILE file. os.link
            # calls linkat only when given a dir fd; an absolute path ignores its value.
            os.link(f"/proc/self/fd/{temp.fd}", path, src_dir_fd=temp.fd)

    def _commit(self, key: str, temp: _Temp, path: str, mode: PutMode) -> None:
        """Move the temp file into place; the caller holds the key's stripe lock."""
        if mode == "create" or temp.path is None:
            try:
                self._link(temp, path)  # fails if anything exists there, atomically
                return
            except FileExistsError:
                if mode == "create":
                    check_condition(key, path, mode)
                    raise AlreadyExists(f"an object already exists at {key!r}") from None
        if isinstance(mode, IfMatch):
            check_condition(key, path, mode)
        if temp.path is None:  # an overwrite of an existing key: name the file to rename it
            temp.path = self._temp_name()
            self._link(_Temp(temp.fd, None), temp.path)
        try:
            os.replace(temp.path, path)
        except IsADirectoryError:
            raise collision(key) from None
        temp.path = None  # the name is no longer ours to remove

    def _delete(self, key: str, trash: builtins.list[str] | None) -> None:
        """Delete ``key``; on the loop (``trash`` given) move it into tmp/ and add the temp
        path to ``trash`` instead of unlinking it: the key is gone just the same, and the
        unlink (which frees disk blocks, ten times the cost of a rename) runs on the pool."""
        path = self._path(key)
        if self._linked_dir(key):
            return  # nothing the store could have written
        directory, _, name = path.rpartition("/")
        lock = self._lock(key, trash is not None)
        try:
            before = _fs_listing.before_change(directory)
            if trash is None:
                os.unlink(path)
            elif stat.S_ISDIR(os.lstat(path).st_mode):
                return  # a prefix of other keys, not an object
            else:
                moved = self._temp_name()
                try:
                    os.rename(path, moved)
                    trash.append(moved)
                except OSError:
                    os.unlink(path)  # tmp/ is gone or on another filesystem
            if before is not None:
                _fs_listing.changed(directory, name, added=False, before_ns=before)
        except (FileNotFoundError, NotADirectoryError):
            pass  # nothing stored at this key
        except OSError as exc:
            # A directory is a prefix of other keys, not an object (macOS says EPERM).
            if not os.path.isdir(path):
                raise translate(exc, "delete", path) from exc
        finally:
            self._stripes.release(lock)

    def _delete_batch(self, keys: Sequence[str], trash: builtins.list[str] | None) -> int:
        """Delete ``keys`` in order; return how many, fewer on the loop if a lock was busy."""
        for done, key in enumerate(keys):
            try:
                self._delete(key, trash)
            except _Offload:
                return done
        return len(keys)

    @staticmethod
    def _reap(paths: builtins.list[str]) -> None:
        for path in paths:
            with contextlib.suppress(OSError):  # a leftover is swept by a later start
                os.unlink(path)

    # -- listing ----------------------------------------------------------------------------

    def _list(
        self, prefix: str, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectMeta]:
        dir_part, slash, partial = prefix.rpartition("/")
        if slash:
            segments = dir_part.split("/")
            if segments[0] == RESERVED or any(segment_problem(s) for s in segments):
                return []  # no valid key can start with this prefix
            if self._linked_dir(dir_part, last=True):
                return []  # the store never follows a link: nothing it wrote is there
            directory, base = self._path(dir_part), dir_part + "/"
        else:
            directory, base = self._root, ""
        result: list[ObjectMeta] = []
        for meta in _fs_listing.walk(directory, base, partial, start_after):
            result.append(meta)
            if limit is not None and len(result) >= limit:
                break
        if not result:
            error = self._root_error()
            if error is not None:
                raise error
        return result
