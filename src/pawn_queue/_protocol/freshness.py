"""Freshness: when a consumer's poll can skip the LIST of a topic.

A listing of a topic shows every message a later one would, until something changes that
this process would know of: a change signal for the topic (a publish here or elsewhere, a
lease given back here, the sweep; :mod:`pawn_queue._protocol.notify`), a delayed message or
a lease held elsewhere coming due (the listing saw both), or a message it saw and left (a
poll's maximum reached, another lane's, a group's next message). So each consumer remembers,
per topic, the generation of change signals before its last listing began and when something
it saw comes due; a poll lists the topic again only if that generation moved, that time
came, or the listing left a message this process may claim. While the process watches the
signals (:meth:`~pawn_queue._protocol.notify.ChangeSignals.refresh`), an idle topic so costs
no LIST per poll: it answers from what the queue knows, as ``listen()`` does
(docs/protocol.md, rule 14).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.leases import LeaseManager
from pawn_queue._protocol.notify import ChangeSignals
from pawn_queue.store.base import ObjectMeta


class ListingMemory:
    """What one consumer's last listing of each of its topics showed."""

    def __init__(
        self, signals: ChangeSignals, leases: LeaseManager, clock: Callable[[], datetime]
    ) -> None:
        self._signals = signals
        self._leases = leases
        self._clock = clock
        self._seen: dict[str, int] = {}  # topic -> generation its last quiet listing began at
        self._due: dict[str, datetime] = {}  # topic -> when a message its listing saw is due
        # topic -> when messages signals named were first claimed since its last listing
        # (monotonic): a message whose signal never came is listed within the backfill.
        self._named_since: dict[str, float] = {}

    def may_skip(self, topic: str) -> bool:
        """Whether a LIST of ``topic`` could show nothing the last one did not (the caller
        made sure the signals are watched)."""
        seen = self._seen.get(topic)
        if seen is None or seen != self._signals.generation(topic):
            return False
        named = self._named_since.get(topic)
        if named is not None and time.monotonic() - named >= self._signals.backfill_seconds:
            return False
        due = self._due.get(topic)
        return due is None or due > self._clock()

    def came_due(self, topic: str) -> bool:
        """Whether something the last listing of ``topic`` saw came due since (a delayed
        message, maybe of a higher priority than what signals name: list before claiming
        those)."""
        due = self._due.get(topic)
        return due is not None and due <= self._clock()

    def next_due(self, topics: Iterable[str]) -> datetime | None:
        """When the first delayed message or lease held elsewhere that the last listings of
        ``topics`` saw comes due (it may have passed: then they are listed at once)."""
        return min((d for t in topics if (d := self._due.get(t)) is not None), default=None)

    def begin(self, topic: str) -> int:
        """A listing of ``topic`` begins: the generation it shows every change up to."""
        self._named_since.pop(topic, None)
        self._signals.listed(topic)
        return self._signals.generation(topic)

    def end(
        self,
        topic: str,
        generation: int,
        pages: list[list[ObjectMeta]],
        complete: bool,
        next_due: datetime | None,
    ) -> None:
        """The listing begun at ``generation`` is over; ``complete``: its ``pages`` hold every
        key of the topic's messages. After the claims, it is quiet if it left no message
        that this process could claim now and does not know to be leased; the first of those
        leases to expire (its claim just learned when) is due then, as is ``next_due``."""
        dues = [d for d in (next_due, self._leases.next_expiry(topic)) if d is not None]
        if dues:
            self._due[topic] = min(dues)
        else:
            self._due.pop(topic, None)
        if complete and self._quiet(topic, pages):
            self._seen[topic] = generation
        else:
            self._seen.pop(topic, None)

    def due_by(self, topic: str, when: datetime | None) -> None:
        """List ``topic`` again by ``when`` at the latest (a message named by a signal that
        this process may take only then: another's share, :mod:`pawn_queue._protocol.shares`)."""
        if when is not None:
            due = self._due.get(topic)
            self._due[topic] = when if due is None else min(due, when)

    def named(self, topic: str) -> None:
        """Messages of ``topic`` named by change signals were claimed with no listing. While
        they come so, the topic is still listed every ``notify.backfill_interval_seconds``:
        a message whose producer died before its signal is found then, not at the sweep."""
        self._named_since.setdefault(topic, time.monotonic())

    def forget(self, topic: str) -> None:
        """List ``topic`` at the next poll (a race lost there: more may be left)."""
        self._seen.pop(topic, None)

    def _quiet(self, topic: str, pages: list[list[ObjectMeta]]) -> bool:
        now = self._clock()
        for page in pages:
            for meta in page:
                pending = layout.parse_pending_key(meta.key)
                if pending is None:
                    continue
                if pending.kind == "group":
                    return False  # the next of a group shows up once its head is settled
                visible = layout.visible_from(meta.key, self._leases.margin)
                if visible is not None and visible > now:
                    continue  # its due time is remembered
                if self._leases.worth_claiming(topic, pending.lease_id(), meta.key):
                    return False
        return True


def hinted_candidates(
    keys: Iterable[str], now: datetime, margin: timedelta
) -> tuple[list[tuple[layout.PendingKey, str]], bool]:
    """The objects among ``keys`` (named by change signals) that a consumer may claim now,
    in key order; and whether any other needs a listing (a delayed message, a group's: the
    listing learns when it comes due, or which of a group is next)."""
    candidates: list[tuple[layout.PendingKey, str]] = []
    unsure = False
    for key in sorted(keys):
        pending = layout.parse_pending_key(key)
        visible = layout.visible_from(key, margin)
        if pending is None or pending.kind == "group" or (visible is not None and visible > now):
            unsure = True
        else:
            candidates.append((pending, key))
    return candidates, unsure
