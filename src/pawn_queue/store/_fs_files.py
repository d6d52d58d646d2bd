"""The blocking file work of :class:`~pawn_queue.store.filesystem.FilesystemStore`.

:class:`DirectoryFiles` does every operation on the store's directory with blocking calls:
preparing the root and its reserved directories, refusing symbolic links, the striped key
locks, temp files (unnamed where ``O_TMPFILE`` works), committing them with a link or a
rename, deletes (moved to the trash on the event loop, unlinked on the pool) and listings.
It runs on the store's thread pool, or on the event loop's thread when ``inline``, where an
operation that would have to wait raises :class:`Offload` instead. The guarantees are in
the docstring of :mod:`pawn_queue.store.filesystem`, which holds the async API.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import itertools
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from pawn_queue.exceptions import AlreadyExists, BucketNotFound, NotFound, RootNotFound, StoreError
from pawn_queue.store import _fs_listing
from pawn_queue.store._fs_support import (
    RESERVED,
    StripeLocks,
    check_condition,
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
_INLINE_GET_BYTES = 256 * 1024
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
_temp_names = itertools.count()
_TEMP_TOKEN = secrets.token_hex(4)  # with the pid: distinct across forks and pid namespaces


class Offload(Exception):
    """Raised by an operation tried on the event loop that would have to wait (a busy lock,
    a directory to create, a large object): nothing was changed, run it on the pool."""


class _Temp:
    """A temp file being written: its descriptor and, unless it is unnamed, its path."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str | None) -> None:
        self.fd = fd
        self.path = path


class DirectoryFiles:
    """The files of one store root, worked on with blocking calls (the base of
    :class:`~pawn_queue.store.filesystem.FilesystemStore`)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._tmp = os.path.join(self._root, RESERVED, "tmp")
        self._locks = os.path.join(self._root, RESERVED, "locks")
        self._stripes = StripeLocks(
            [f"{self._locks}/{n:02x}.lock" for n in range(_LOCK_STRIPES)],
            lambda path: self._open_internal(path, os.O_RDWR | os.O_CREAT),
        )
        self._ready = False  # the root is prepared by the first write: no I/O here
        self._ready_lock = threading.Lock()
        self._unnamed_temps = False  # O_TMPFILE works here (probed when preparing)

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
        the loop (``inline``) the lock is only tried: raise Offload if someone holds it."""
        stripe = self._stripes.acquire(key, wait=not inline)
        if stripe is None:
            raise Offload
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
                raise Offload
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
            raise Offload  # creating directories means fsyncing them
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
            except Offload:
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
