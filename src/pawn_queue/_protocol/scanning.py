"""Scanning a listing page of a queue's messages: which are deliverable now, and when the
next one becomes so (consumers, and the Spark source's planning)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue.store.base import ObjectMeta


@dataclass(frozen=True, slots=True)
class ScannedPage:
    """What a listing page holds for a consumer at one moment."""

    found: list[tuple[layout.PendingKey, ObjectMeta]]  # deliverable now, in key order
    next_due: datetime | None  # when the first message not deliverable yet becomes so
    ends: bool  # a key past every possible due time ends the listing: stop paging


def scan_page(
    page: list[ObjectMeta], now: datetime, skew_margin: timedelta, groups_seen: set[str]
) -> ScannedPage:
    """The messages of a listing page deliverable at ``now`` (see
    :func:`layout.visible_from`). Keys sort by timestamp, so the first key beyond
    ``now + skew_margin`` ends the listing; delayed messages before it that are not due are
    skipped. Of a group, only the oldest message is deliverable, and a group whose oldest
    message is not due waits for it (``groups_seen`` carries the groups already met over the
    pages of one listing)."""
    found: list[tuple[layout.PendingKey, ObjectMeta]] = []
    next_due: datetime | None = None
    for meta in page:
        pending = layout.parse_pending_key(meta.key)
        if pending is None:
            continue
        visible = layout.visible_from(meta.key, skew_margin)
        if visible is not None and visible > now:
            next_due = visible if next_due is None else min(next_due, visible)
            if visible > now + skew_margin or not layout.is_delayed_key(meta.key):
                # Its timestamp is past now + margin: so are those of every key after it.
                return ScannedPage(found, next_due, ends=True)
        group_head = pending.kind != "group" or pending.group_hash not in groups_seen
        groups_seen.add(pending.group_hash)
        if group_head and (visible is None or visible <= now):
            found.append((pending, meta))
    return ScannedPage(found, next_due, ends=False)
