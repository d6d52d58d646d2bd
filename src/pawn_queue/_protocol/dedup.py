"""Deduplication: a ``dedup_id`` published again within the window writes nothing new.

A marker per dedup id, written create-only, decides which publish is the first; it names
the message (id and key) and says whether the message was written. A repeat that finds a
marker within the window returns its message id. If the marker says the first publish had
not finished writing (it crashed, or is still in flight), the repeat writes the message
itself, under the same key, so a retry after a failed publish never loses the message.

Markers past their window are deleted by :class:`MarkerSweeper`, a bounded sweep that
publishes with a dedup id trigger (docs/protocol.md, Deduplication).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta

from pawn_queue._internal.aio import Background
from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import encode_json, now_utc, parse_time
from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed, StoreError
from pawn_queue.store.base import LIST_PAGE, IfMatch, PutMode, Store

logger = logging.getLogger(__name__)

SWEEP_MIN_SECONDS = 10.0
"""A process sweeps a topic's markers at most this often (or once per window, if longer)."""
SWEEP_MAX_PAGES = 10
"""Listing pages (1,000 markers each) one sweep reads at most."""
FIRST_SWEEP_CHANCE = 1 / 32
"""The chance that a process's first publish with a dedup id to a topic sweeps at once: a
one-shot publisher pays a LIST per 32 runs, and markers still go when no process lives
long enough to reach its next sweep."""


@dataclass(frozen=True, slots=True)
class Marker:
    dedup_id: str
    message_id: str
    message_key: str
    created_at: str
    written: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """What a publish with a dedup id must do: write (``etag`` is the marker's) or not."""

    marker: Marker
    write: bool
    etag: str | None


async def decide(store: Store, key: str, proposal: Marker, window_seconds: float) -> Decision:
    """Claim the dedup id with ``proposal``, or learn which message already holds it."""
    for _ in range(3):  # a marker replaced or deleted under us: look again
        try:
            etag = await store.put(key, encode_json(asdict(proposal)), "create")
            return Decision(proposal, True, etag)
        except AlreadyExists:
            pass
        try:
            current = await store.get(key)
        except NotFound:
            continue
        marker = decode_marker(current.data)
        fresh = marker is not None and now_utc() - parse_time(marker.created_at) < timedelta(
            seconds=window_seconds
        )
        if marker is not None and fresh:
            return Decision(marker, not marker.written, current.meta.etag)
        try:  # expired (or unreadable): the id is free again
            etag = await store.put(key, encode_json(asdict(proposal)), IfMatch(current.meta.etag))
            return Decision(proposal, True, etag)
        except PreconditionFailed:
            continue
    raise PreconditionFailed(f"dedup marker {key} kept changing")


async def mark_written(store: Store, key: str, decision: Decision) -> None:
    """Record that the message was written; losing this race only costs a rewrite later."""
    body = encode_json(asdict(replace(decision.marker, written=True)))
    mode: PutMode = IfMatch(decision.etag) if decision.etag else "overwrite"
    with contextlib.suppress(PreconditionFailed):
        await store.put(key, body, mode)


def decode_marker(data: bytes) -> Marker | None:
    """A stored marker, None if the bytes are not one."""
    try:
        raw = codec.loads(data)
        marker = Marker(
            dedup_id=str(raw["dedup_id"]),
            message_id=str(raw["message_id"]),
            message_key=str(raw["message_key"]),
            created_at=str(raw["created_at"]),
            written=bool(raw.get("written", False)),
        )
        parse_time(marker.created_at)
        return marker
    except (ValueError, KeyError, TypeError):
        return None


class MarkerSweeper:
    """Deletes a topic's dedup markers whose window is over, a bounded amount at a time.

    :meth:`published` (after each publish with a dedup id) starts a sweep in the background
    once per ``max(window, SWEEP_MIN_SECONDS)`` per topic (the first one by chance, see
    FIRST_SWEEP_CHANCE). A sweep lists ``{topic}/dedup/`` from where the last one stopped,
    up to SWEEP_MAX_PAGES pages, and deletes the markers not written for longer than the
    window plus the clock-skew margin. A failure is logged; the next sweep tries again.
    """

    def __init__(
        self,
        store: Store,
        background: Background,
        clock: Callable[[], datetime],
        margin: timedelta,
        first_chance: float = FIRST_SWEEP_CHANCE,
    ) -> None:
        self._store = store
        self._background = background
        self._clock = clock
        self._margin = margin
        self._first_chance = first_chance
        self._due: dict[str, datetime] = {}  # topic -> when to sweep next
        self._cursor: dict[str, str | None] = {}  # topic -> the last key the sweep listed

    def published(self, topic: str, window: float) -> None:
        now = self._clock()
        interval = timedelta(seconds=max(window, SWEEP_MIN_SECONDS))
        due = self._due.get(topic)
        if due is None:
            self._due[topic] = now + interval
            if random.random() >= self._first_chance:
                return
        elif now < due:
            return
        self._due[topic] = now + interval
        self._background.start(self._sweep(topic, window))

    async def _sweep(self, topic: str, window: float) -> None:
        prefix = layout.dedup_prefix(topic)
        cutoff = self._clock() - timedelta(seconds=window) - self._margin
        start = self._cursor.get(topic)
        try:
            for _ in range(SWEEP_MAX_PAGES):
                page = await self._store.list(prefix, start_after=start, limit=LIST_PAGE)
                expired = [meta.key for meta in page if meta.last_modified < cutoff]
                if expired:
                    await self._store.delete_many(expired)
                start = page[-1].key if len(page) == LIST_PAGE else None
                if start is None:
                    break
        except StoreError as exc:
            logger.warning("dedup marker sweep failed topic=%s error=%s", topic, exc)
        self._cursor[topic] = start
