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
    # Where the next page starts, if not after the page's last key: past the rest of a
    # priority band whose keys are beyond every possible due time.
    resume_after: str | None = None

    def next_start(self, page: list[ObjectMeta]) -> str:
        """The ``start_after`` of the page after ``page`` (not empty)."""
        return self.resume_after or page[-1].key


def scan_page(
    page: list[ObjectMeta], now: datetime, skew_margin: timedelta, groups_seen: set[str]
) -> ScannedPage:
    """The messages of a listing page deliverable at ``now`` (see
    :func:`layout.visible_from`). Keys sort by band (priority 9 first, priority 0 last),
    then by timestamp: the first key beyond ``now + skew_margin`` ends its band, and the
    listing if it is priority 0's; delayed messages before it that are not due are skipped.
    Of a group, only the oldest message is deliverable, and a group whose oldest message is
    not due waits for it (``groups_seen`` carries the groups already met over the pages of
    one listing)."""
    found: list[tuple[layout.PendingKey, ObjectMeta]] = []
    next_due: datetime | None = None
    ended = None  # the band mark of a band ended in this page
    for meta in page:
        pending = layout.parse_pending_key(meta.key)
        if pending is None:
            continue
        if ended is not None and layout.band_of(meta.key) == ended:
            continue
        visible = layout.visible_from(meta.key, skew_margin)
        if visible is not None and visible > now:
            next_due = visible if next_due is None else min(next_due, visible)
            if visible > now + skew_margin or not layout.is_delayed_key(meta.key):
                # Its timestamp is past now + margin: so are those of every key after it
                # in its band. Priority 0's comes last: it ends the listing.
                ended = layout.band_of(meta.key)
                if not ended:
                    return ScannedPage(found, next_due, ends=True)
                continue
        group_head = pending.kind != "group" or pending.shared_id not in groups_seen
        groups_seen.add(pending.shared_id)
        if group_head and (visible is None or visible <= now):
            found.append((pending, meta))
    resume = None
    if ended is not None and layout.band_of(page[-1].key) == ended:
        resume = layout.after_band(page[-1].key)
    return ScannedPage(found, next_due, ends=False, resume_after=resume)
