"""Key-ordered listing of a directory tree, with an index that keeps large directories cheap.

A directory's entries sort by ``name`` for files and ``name + "/"`` for directories, which
is the order of the full key strings (``a-c`` before ``a/b``).

Scanning a directory of 100,000 files costs about half a second, so a poll over a long
backlog would grow with the backlog. Directories with many entries therefore get a sorted
in-memory index, shared by every store on the same root in this process. This process's own
writes and deletes update it in place (an insertion or removal in a sorted list, under the
index's lock, never a copy). It is trusted only while the directory's mtime is the one it
last saw and for at most ``_MAX_AGE_SECONDS``: a change by another process is seen at the
next mtime check, or, if it landed within the same timestamp tick as one of ours, at the
next rescan. A listing in progress copies the index a small window at a time under the lock
and resumes after the last name it yielded, so it never sees a list half-changed and never
copies more than it reads. Listing is only a way to find candidates (claims and reads
decide), so a briefly stale index delays a message and never loses one.
"""

from __future__ import annotations

import bisect
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator

from pawn_queue.store._fs_support import RESERVED, meta_of, segment_problem, translate
from pawn_queue.store.base import ObjectMeta

_INDEX_MIN_ENTRIES = 512
_MAX_AGE_SECONDS = 2.0
_FIRST_CHUNK = 32  # a poll reads a few names; a full listing doubles up to _MAX_CHUNK
_MAX_CHUNK = 4096


class _Index:
    __slots__ = ("checked", "keys", "lock", "mtime_ns")

    def __init__(self, keys: list[str], mtime_ns: int) -> None:
        self.keys = keys  # sorted sort-keys: "name" or "name/"; changed in place, under lock
        self.mtime_ns = mtime_ns
        self.checked = time.monotonic()
        self.lock = threading.Lock()


_indexes: dict[str, _Index] = {}
_indexes_lock = threading.Lock()


def entries(
    directory: str, accept: Callable[[str], bool], partial: str, start_after: str | None
) -> Iterator[str]:
    """The directory's sort keys (``name`` or ``name/``) that start with ``partial`` and may
    hold keys after ``start_after`` (relative to the directory), in order.

    ``accept(name)`` filters out entries no key could name. Raises FileNotFoundError or
    NotADirectoryError, at the call, when ``directory`` is not a directory.
    """
    mtime_ns = os.stat(directory).st_mtime_ns
    with _indexes_lock:
        index = _indexes.get(directory)
    if index is not None:
        with index.lock:
            fresh = time.monotonic() - index.checked < _MAX_AGE_SECONDS
            if fresh and index.mtime_ns == mtime_ns:
                return _indexed(index, partial, start_after)
    keys = []
    with os.scandir(directory) as it:
        for entry in it:
            if accept(entry.name):
                keys.append(entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name)
    keys.sort()
    if len(keys) < _INDEX_MIN_ENTRIES:
        with _indexes_lock:
            _indexes.pop(directory, None)
        return window(keys, partial, start_after)  # this list is ours alone
    index = _Index(keys, mtime_ns)
    with _indexes_lock:
        _indexes[directory] = index
    return _indexed(index, partial, start_after)


def _start(keys: list[str], partial: str, start_after: str | None) -> int:
    lo = bisect.bisect_left(keys, partial)
    if start_after is not None:
        after = bisect.bisect_right(keys, start_after)
        # A directory sorting at or before start_after still holds keys after it when
        # start_after lies inside it.
        if after > 0 and keys[after - 1].endswith("/") and start_after.startswith(keys[after - 1]):
            after -= 1
        lo = max(lo, after)
    return lo


def window(keys: list[str], partial: str, start_after: str | None) -> Iterator[str]:
    """The sort keys of a list nobody changes that start with ``partial`` and may hold keys
    after ``start_after`` (relative to the directory), in order."""
    for position in range(_start(keys, partial, start_after), len(keys)):  # no slice copy
        key = keys[position]
        if not key.startswith(partial):
            return
        yield key


def _indexed(index: _Index, partial: str, start_after: str | None) -> Iterator[str]:
    """Like :func:`window` over an index that this process changes while we iterate."""
    last: str | None = None
    size = _FIRST_CHUNK
    while True:
        with index.lock:
            keys = index.keys
            lo = (
                _start(keys, partial, start_after)
                if last is None
                else bisect.bisect_right(keys, last)
            )
            chunk = keys[lo : lo + size]
        for key in chunk:
            if not key.startswith(partial):
                return
            yield key
            last = key
        if len(chunk) < size:
            return
        size = min(size * 2, _MAX_CHUNK)


def before_change(directory: str) -> int | None:
    """Call under the key's lock before adding or removing a file in ``directory``: the
    directory's mtime if this process indexes it (pass it to :func:`changed`), else None."""
    if directory not in _indexes:  # a dict lookup; an index made meanwhile checks the mtime
        return None
    try:
        return os.stat(directory).st_mtime_ns
    except OSError:
        return -1


def changed(directory: str, name: str, *, added: bool, before_ns: int) -> None:
    """Record this process's own add or removal of file ``name`` in ``directory``.

    ``before_ns`` is the directory's mtime just before the change: the index follows the
    change only if it was current then; otherwise the next listing rescans.
    """
    with _indexes_lock:
        index = _indexes.get(directory)
    if index is None:
        return
    with index.lock:
        if index.mtime_ns != before_ns:
            return
        keys = index.keys
        position = bisect.bisect_left(keys, name)
        present = position < len(keys) and keys[position] == name
        if added and not present:
            keys.insert(position, name)
        elif not added and present:
            del keys[position]
        try:
            index.mtime_ns = os.stat(directory).st_mtime_ns
        except OSError:
            index.mtime_ns = -1


def walk(directory: str, base: str, partial: str, start_after: str | None) -> Iterator[ObjectMeta]:
    """Yield the objects under ``directory`` (whose keys start with ``base``) in key order,
    skipping subtrees entirely at or before ``start_after``."""
    relative: str | None = None
    if start_after is not None and start_after >= base:
        if not start_after.startswith(base):
            return  # every key here sorts before start_after
        relative = start_after[len(base) :]
    try:
        names = entries(directory, _nameable, partial, relative)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise translate(exc, "list", directory) from exc
    for name in names:
        path = os.path.join(directory, name.rstrip("/"))
        if name.endswith("/"):
            if base or name != RESERVED + "/":
                yield from walk(path, base + name, "", start_after)
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # deleted since the scan
        except OSError as exc:
            raise translate(exc, "stat", path) from exc
        if stat.S_ISREG(st.st_mode):
            yield meta_of(base + name, st)


def _nameable(name: str) -> bool:
    """Whether some key could name this entry (stray files are not objects)."""
    return segment_problem(name) is None
