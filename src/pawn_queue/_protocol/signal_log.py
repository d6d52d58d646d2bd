"""The body of the root signal ``_notify/_``: which topics changed lately.

Every write of the root replaces the version it read (if-match), so its versions form one
chain, and each write numbers itself: ``seq`` is the previous version's plus one. A write
adds an entry ``(seq, topic, at, busy, names_from, names)`` for each topic it signals,
replacing the topic's older entry, and drops entries older than ``KEEP_SECONDS`` (or past
``MAX_CHANGES``); ``kept_from`` says from which ``seq`` on every change is still named (by
its own entry or a later one of its topic). ``names`` are the names (under
``{topic}/messages/``) of the message objects written, each with the ``seq`` that added it:
the older entry's and this write's, the last ``MAX_NAMES``; ``names_from`` says from which
``seq`` on they are all there. A watcher that saw version ``s`` has its consumers claim the
names added after ``s`` without listing the topic; None (unknown) or ``names_from > s + 1``
means "list it". A watcher that last saw ``seq`` ``s`` wakes the topics of the entries after
``s``; if ``kept_from > s + 1`` (it looked too seldom) or the chain restarted, it cannot tell
and wakes every topic it watches (docs/protocol.md, "Change signals").

The body is JSON; one that is not this document (a 0.2.0 root holds a random token) tells
nothing, which a watcher also answers by waking every topic it watches.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

KEEP_SECONDS = 10.0
"""How long an entry stays in the root: well over a running watch's slowest check (1 s, or
the idle interval), so a watch that checks misses none."""
MAX_CHANGES = 512
"""Entries kept at most (one per topic): with more topics changing within ``KEEP_SECONDS``,
the oldest go and watchers that missed them wake every topic they watch."""
MAX_NAMES = 16
"""Object names one entry carries at most (the latest): a watcher that missed older ones
lists the topic."""
_FORMAT = "pawn-queue-signals/1"


@dataclass(frozen=True, slots=True)
class Change:
    """One topic's latest signal in the root: the version that wrote it, when (the writer's
    clock, epoch seconds), whether it came late (the topic is busy), and the objects
    written, each with the version that added it (None: unknown, list the topic), complete
    from version ``names_from`` on."""

    seq: int
    topic: str
    at: float
    busy: bool
    names: tuple[tuple[int, str], ...] | None = None
    names_from: int = 0

    def named_after(self, seen: int) -> list[str] | None:
        """The objects added after version ``seen``; None if some may be missing."""
        if self.names is None or self.names_from > seen + 1:
            return None
        return [name for added, name in self.names if added > seen]


@dataclass(frozen=True, slots=True)
class SignalLog:
    """One version of the root's body."""

    seq: int
    kept_from: int
    changes: tuple[Change, ...]

    def encode(self) -> bytes:
        # The nonce keeps every version's bytes, so its etag, distinct (an etag may be the
        # content's MD5).
        return json.dumps(
            {
                "format": _FORMAT,
                "seq": self.seq,
                "kept_from": self.kept_from,
                "nonce": secrets.token_hex(8),
                "changes": [
                    [c.seq, c.topic, round(c.at, 3), int(c.busy), c.names_from, c.names]
                    for c in self.changes
                ],
            },
            separators=(",", ":"),
        ).encode()

    def after(self, seen: int | None) -> list[Change] | None:
        """The changes a watcher that last saw version ``seen`` has not seen; None if it
        cannot tell (it saw none, the chain restarted, or some were dropped unseen)."""
        if seen is None or self.seq < seen or self.kept_from > seen + 1:
            return None
        return [change for change in self.changes if change.seq > seen]


def decode(data: bytes) -> SignalLog | None:
    """The root's body, or None if it is not a signal log (0.2.0's token, damage)."""
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            return None
        changes = tuple(_change(*entry) for entry in doc["changes"])
        return SignalLog(int(doc["seq"]), int(doc["kept_from"]), changes)
    except (ValueError, TypeError, KeyError):
        return None


def _change(
    seq: int,
    topic: str,
    at: float,
    busy: int,
    names_from: int = 0,
    names: list[tuple[int, str]] | None = None,
    *_: object,
) -> Change:
    named = None if names is None else tuple((int(s), str(name)) for s, name in names)
    return Change(int(seq), str(topic), float(at), bool(busy), named, int(names_from))


def merge_names(older: Iterable[str] | None, newer: Iterable[str] | None) -> frozenset[str] | None:
    """The names of two signals of one topic, or None if either is unknown or they are
    more than an entry carries."""
    if older is None or newer is None:
        return None
    names = frozenset([*older, *newer])
    return names if len(names) <= MAX_NAMES else None


def next_version(
    current: SignalLog | None,
    topics: dict[str, frozenset[str] | None],
    now: float,
    busy: bool = False,
) -> SignalLog:
    """The version a write of ``topics`` (topic -> the names signalled, None: unknown) over
    ``current`` puts: ``current`` or nothing readable starts a new chain."""
    older: dict[str, Change] = {}
    if current is None:
        seq, kept_from, kept = 1, 1, []
    else:
        seq, kept_from = current.seq + 1, current.kept_from
        older = {c.topic: c for c in current.changes if c.topic in topics}
        kept = [c for c in current.changes if c.topic not in topics]
    for topic, names in sorted(topics.items()):
        kept.append(_entry(older.get(topic), seq, topic, now, busy, names))
    fresh = [c for c in kept if now - c.at <= KEEP_SECONDS][-MAX_CHANGES:]
    still_named = {c.topic for c in fresh}
    for dropped in kept:
        if dropped.topic not in still_named:
            kept_from = max(kept_from, dropped.seq + 1)
    return SignalLog(seq, kept_from, tuple(fresh))


def _entry(
    before: Change | None,
    seq: int,
    topic: str,
    now: float,
    busy: bool,
    names: frozenset[str] | None,
) -> Change:
    """The topic's entry written by version ``seq``, over its entry ``before``."""
    if names is None:
        return Change(seq, topic, now, busy)
    added = tuple((seq, name) for name in sorted(names))
    if before is None:  # an older entry dropped unseen is kept_from's to tell
        return Change(seq, topic, now, busy, added[-MAX_NAMES:], _first_kept(added, 0))
    if before.names is None:  # what came before these is unknown
        return Change(seq, topic, now, busy, added[-MAX_NAMES:], _first_kept(added, seq))
    both = before.names + added
    return Change(seq, topic, now, busy, both[-MAX_NAMES:], _first_kept(both, before.names_from))


def _first_kept(names: tuple[tuple[int, str], ...], names_from: int) -> int:
    """``names_from`` once all but the last ``MAX_NAMES`` of ``names`` are dropped."""
    dropped = names[:-MAX_NAMES]
    return max(names_from, dropped[-1][0] + 1) if dropped else names_from
