"""Key rules and byte-order listing for the S3 store.

S3 lists keys in UTF-8 byte order. SeaweedFS walks its directory tree instead: a directory's
keys come before siblings that extend its name with a character below ``/``, so ``a/b``
precedes ``a-c`` (bytes say ``a-c`` < ``a/b``). It also treats ``start-after=a`` as "after
directory ``a``", skipping everything under ``a/``. :func:`tree_walk` turns such a listing
back into byte order: it defers each directory until the siblings that sort before
``name/`` are out, using that very skip to jump over the directory's keys.
"""

from __future__ import annotations

import bisect
import contextlib
import re
from collections.abc import AsyncGenerator, Callable

from pawn_queue.store.base import ObjectMeta

_CONTROL = re.compile("[\x00-\x1f\x7f]")
MAX_CHAR = "\U0010ffff"  # sorts after every other code point, valid in XML and UTF-8

Source = Callable[[str, str | None], AsyncGenerator[ObjectMeta, None]]
"""``source(directory, offset)``: the keys under ``directory/`` (every key when it is
``""``) after ``offset``, in the server's order."""


class ServerSortsBytes(Exception):
    """The server did not skip a directory named by ``start-after``: it lists in byte order."""


class ServerUnsorted(Exception):
    """A plain listing came out of byte order: the server sorts neither bytes nor a tree."""


def key_problem(key: str) -> str | None:
    """Why obstore cannot store ``key`` unchanged (or SeaweedFS would alter it), or None."""
    if not key:
        return "empty key"
    if key.startswith("/") or key.endswith("/"):
        return "leading or trailing '/'"
    for segment in key.split("/"):
        if not segment:
            return "empty path segment ('//')"
        if segment in (".", ".."):
            return "'.' or '..' path segment"
    if _CONTROL.search(key):
        return "ASCII control character"
    if "\\" in key:
        return "backslash (SeaweedFS stores it as '/')"
    try:
        key.encode()
    except UnicodeEncodeError:
        return "not encodable as UTF-8"
    return None


def offset_below(bound: str) -> str | None:
    """A list offset just below ``bound``, with no storable key between the two, or None.

    Never ``bound`` itself (it may be a directory SeaweedFS would skip, and an inclusive bound
    must not be excluded): the last character is decremented and the largest code point
    appended, which lands right below ``bound`` in byte order and in tree order alike.
    """
    if not bound or bound.endswith("/"):
        return None  # the smallest segment (" ") has no storable string below it
    head, last = bound[:-1], bound[-1]
    if last == "0":
        # "/" sits right below "0": the end of head's directory, or "." with no head.
        middle = "/" if head and not head.endswith("/") else "."
    else:
        below = ord(last) - 1
        if below < 0x20:
            return None
        if below == 0x7F:
            below = 0x7E
        elif 0xD800 <= below <= 0xDFFF:
            below = 0xD7FF
        middle = chr(below)
    candidate = head + middle + MAX_CHAR
    return candidate if key_problem(candidate) is None else None


def _after(key: str, bound: str | None, inclusive: bool) -> bool:
    return bound is None or key > bound or (inclusive and key == bound)


def _first_name(base: str, bound: str | None) -> str | None:
    """The smallest entry name under ``base`` that can hold keys from ``bound`` on."""
    if bound is None or not bound.startswith(base) or len(bound) == len(base):
        return None
    segment = bound[len(base) :].split("/", 1)[0]
    # Directory "a" holds keys after "a-c" ("a/" > "a-c"): start at the shortest such name.
    for i, char in enumerate(segment):
        if char < "/" and i > 0:
            return segment[:i]
    return segment


async def tree_walk(
    source: Source, directory: str, bound: str | None, inclusive: bool
) -> AsyncGenerator[ObjectMeta, None]:
    """Keys under ``directory`` after ``bound`` (or equal, if ``inclusive``), in byte order,
    from a server that lists in tree order and skips a directory named by its offset.

    Raises ServerSortsBytes when the server turns out to list in byte order, ServerUnsorted
    when a directory's files come out of order.
    """
    base = f"{directory}/" if directory else ""
    first = _first_name(base, bound)
    stream = source(directory, offset_below(base + first) if first else None)
    deferred: list[str] = []  # directory names, sorted as name + "/"
    skipped: set[str] = set()
    last_file = ""  # of this stream: a tree and bytes alike list a directory's files in order
    try:
        while (meta := await anext(stream, None)) is not None:
            name, slash, _ = meta.key[len(base) :].partition("/")
            if slash and name in skipped:
                raise ServerSortsBytes(meta.key)
            if not slash:
                if name < last_file:
                    raise ServerUnsorted(meta.key)
                last_file = name
            entry = name + slash
            while deferred and deferred[0] + "/" < entry:
                async for inner in _subtree(source, base + deferred.pop(0), bound, inclusive):
                    yield inner
            if not slash:
                if _after(meta.key, bound, inclusive):
                    yield meta
                continue
            prefix = base + name + "/"
            if bound is None or prefix > bound or bound.startswith(prefix):
                bisect.insort(deferred, name, key=lambda n: n + "/")
            # Jump past the directory: SeaweedFS skips it when named by start-after.
            skipped.add(name)
            await stream.aclose()
            stream = source(directory, base + name)
            last_file = ""
        for name in deferred:
            async for inner in _subtree(source, base + name, bound, inclusive):
                yield inner
    finally:
        await stream.aclose()


async def _subtree(
    source: Source, directory: str, bound: str | None, inclusive: bool
) -> AsyncGenerator[ObjectMeta, None]:
    async with contextlib.aclosing(tree_walk(source, directory, bound, inclusive)) as walk:
        async for meta in walk:
            yield meta
