"""Helpers of the filesystem store: key checks, etags, error mapping, small file chores."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import threading
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime

from pawn_queue.exceptions import (
    AccessDenied,
    AlreadyExists,
    BucketNotFound,
    ConfigError,
    NotFound,
    PreconditionFailed,
    RootNotFound,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store.base import IfMatch, ObjectMeta, PutMode

RESERVED = ".pawnqueue"
MAX_KEY_BYTES = 1024  # S3's limit
MAX_SEGMENT_BYTES = 255  # NAME_MAX on every common filesystem
_STALE_TMP_NS = 3600 * 10**9
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")  # category Cc, and backslash
_TRANSIENT = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ESTALE}
# The common case in one match: printable ASCII segments (no "/" or "\"), none of them empty,
# "." or "..", at most 255 characters, and no reserved first segment. Anything else takes
# the segment-by-segment path, which accepts other valid keys and explains the invalid ones.
_SEGMENT = r"(?!\.\.?(?:/|\Z))[\x20-\x2e\x30-\x5b\x5d-\x7e]{1,255}"
_PLAIN_KEY = re.compile(rf"(?!{re.escape(RESERVED)}(?:/|\Z)){_SEGMENT}(?:/{_SEGMENT})*")

_clock_lock = threading.Lock()
_last_ns = 0


def unique_ns() -> int:
    """A wall-clock nanosecond timestamp never handed out twice in this process."""
    global _last_ns
    with _clock_lock:
        _last_ns = max(time.time_ns(), _last_ns + 1)
        return _last_ns


def segment_problem(segment: str) -> str | None:
    if segment in ("", ".", ".."):
        return f"segment {segment!r} is not allowed"
    if _FORBIDDEN_CHARS.search(segment):
        return "backslashes and control characters are not allowed"
    try:
        size = len(segment.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > MAX_SEGMENT_BYTES:
        return f"a segment is {size} bytes; the limit is {MAX_SEGMENT_BYTES}"
    return None


def check_key(key: str) -> None:
    """Raise ConfigError unless ``key`` maps to a path strictly inside the root."""
    if len(key) <= MAX_KEY_BYTES and _PLAIN_KEY.fullmatch(key):
        return  # ASCII: as many bytes as characters
    if not key:
        raise ConfigError("store key must not be empty")
    if key.startswith("/"):
        raise ConfigError(f"store key {key!r} must not start with '/'")
    segments = key.split("/")
    if segments[0] == RESERVED:
        raise ConfigError(f"store key {key!r} is in the reserved directory {RESERVED}/")
    for segment in segments:
        problem = segment_problem(segment)
        if problem is not None:
            raise ConfigError(f"invalid store key {key!r}: {problem}")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ConfigError(f"store key {key[:40]!r}... is longer than {MAX_KEY_BYTES} bytes")


def etag_of(st: os.stat_result) -> str:
    return f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'


def meta_of(key: str, st: os.stat_result) -> ObjectMeta:
    return ObjectMeta(
        key=key,
        etag=etag_of(st),
        size=st.st_size,
        last_modified=datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC),
    )


def translate(exc: OSError, action: str, path: str) -> StoreError:
    message = f"{action} {path}: {exc.strerror or exc}"
    if exc.errno == errno.ENOENT:
        return NotFound(message)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccessDenied(message)
    if exc.errno in _TRANSIENT:
        return StoreUnavailable(message)
    return StoreError(message)


def root_error(root: str) -> StoreError | None:
    """Why ``root`` cannot hold a store (RootNotFound: nothing is there), or None if it is
    a directory (or a link to one)."""
    try:
        st = os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return RootNotFound(f"store root {root} does not exist")
    except OSError as exc:
        return translate(exc, "open store root", root)
    if not stat.S_ISDIR(st.st_mode):
        return BucketNotFound(f"store root {root} is not a directory")
    return None


def collision(key: str) -> StoreError:
    return StoreError(
        f"key {key!r} collides with a directory or file of other keys on the filesystem store "
        "(a key cannot be both an object and a prefix followed by '/')"
    )


def read_all(fd: int, size: int) -> bytes:
    # Objects are replaced, never modified in place, so the size from fstat is final.
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(fd, size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sweep_stale_temps(tmp: str) -> None:
    """Remove temp files of crashed writers (a live writer's is seconds old at most) and the
    deleted files they had not unlinked yet (those are garbage at any age)."""
    cutoff = time.time_ns() - _STALE_TMP_NS
    with os.scandir(tmp) as entries:
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_mtime_ns < cutoff:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass


def make_parents(root: str, key: str) -> list[str]:
    """Create the key's missing parent directories under ``root``; return the directories
    whose entries changed (to fsync)."""
    missing: list[str] = []
    parent = os.path.dirname(root + "/" + key)
    while parent != root:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            missing.append(parent)
            parent = os.path.dirname(parent)
            continue
        except NotADirectoryError:
            raise collision(key) from None
        if not stat.S_ISDIR(st.st_mode):
            raise collision(key)
        break
    changed: list[str] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
            changed.append(os.path.dirname(directory))
        except FileExistsError:
            if not os.path.isdir(directory):
                raise collision(key) from None
        except NotADirectoryError:
            raise collision(key) from None
    return changed


def check_condition(key: str, path: str, mode: PutMode) -> None:
    """Raise unless a ``create`` or ``IfMatch`` put may replace what is at ``path`` now."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        if isinstance(mode, IfMatch):
            raise PreconditionFailed(f"no object at {key!r} to match {mode.etag}") from None
        return
    if not stat.S_ISREG(st.st_mode):
        raise collision(key)
    if mode == "create":
        raise AlreadyExists(f"an object already exists at {key!r}")
    if isinstance(mode, IfMatch) and etag_of(st) != mode.etag:
        raise PreconditionFailed(f"object at {key!r} has etag {etag_of(st)}, not {mode.etag}")


class StripeLocks:
    """Exclusion per key among the threads and processes that share a store: keys hash onto
    lock files, each opened once per process. A thread lock comes first, because an flock
    taken through one open file does not exclude the threads that share the file."""

    def __init__(self, paths: list[str], open_file: Callable[[str], int]) -> None:
        self._paths = paths
        self._open = open_file
        self._reset()

    def _reset(self) -> None:
        # A forked child must not use its parent's descriptors: it would share their flocks.
        self._pid = os.getpid()
        self._fds: list[int | None] = [None] * len(self._paths)
        self._guards = [threading.Lock() for _ in self._paths]

    def acquire(self, key: str, wait: bool) -> int | None:
        """Lock the stripe of ``key`` and return it; None if ``wait`` is false and another
        thread or process holds it."""
        if os.getpid() != self._pid:
            self._reset()
        stripe = zlib.crc32(key.encode("utf-8")) % len(self._paths)
        guard = self._guards[stripe]
        if not guard.acquire(blocking=wait):
            return None
        try:
            while True:
                fd = self._fds[stripe]
                if fd is None:
                    fd = self._fds[stripe] = self._open(self._paths[stripe])
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    guard.release()
                    return None
                if os.fstat(fd).st_nlink:
                    return stripe
                # Someone removed the lock file: others now lock a new one at that path.
                self._fds[stripe] = None
                os.close(fd)
        except BaseException:
            guard.release()
            raise

    def release(self, stripe: int) -> None:
        fd = self._fds[stripe]
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._guards[stripe].release()

    def close(self) -> None:
        for stripe, fd in enumerate(self._fds):
            if fd is not None:
                self._fds[stripe] = None
                os.close(fd)
