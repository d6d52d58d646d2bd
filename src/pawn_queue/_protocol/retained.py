"""Deleting what a topic's replay log (:mod:`pawn_queue._protocol.replay`) holds past the
topic's replay window."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

from pawn_queue._internal.aio import Background
from pawn_queue._protocol import layout
from pawn_queue.exceptions import StoreError
from pawn_queue.store.base import LIST_PAGE, Store

logger = logging.getLogger(__name__)

SWEEP_MIN_SECONDS = 60.0  # a log is swept at most this often per process and topic
SWEEP_MAX_PAGES = 10
FIRST_SWEEP_CHANCE = 1 / 32
"""The chance that a process's first publish to a topic sweeps its log at once: a one-shot
publisher pays a LIST per 32 runs, and the log still shrinks when no process lives long
enough to reach its next sweep."""


class RetainedSweeper:
    """Deletes what a topic's replay log holds past its window, in the background of its
    producers: at most once per ``max(window / 10, SWEEP_MIN_SECONDS)`` per topic and
    process, and at its first publish with :data:`FIRST_SWEEP_CHANCE`. Keys sort by due
    time, so a sweep lists from the oldest and stops at the first key still within the
    window (at most SWEEP_MAX_PAGES pages)."""

    def __init__(
        self,
        store: Store,
        background: Background,
        clock: Callable[[], datetime],
        margin: timedelta,
    ) -> None:
        self._store = store
        self._background = background
        self._clock = clock
        self._margin = margin
        self._first_chance = FIRST_SWEEP_CHANCE
        self._due: dict[str, datetime] = {}

    def published(self, topic: str, window: float) -> None:
        now = self._clock()
        due = self._due.get(topic)
        if due is not None and now < due:
            return
        interval = max(window / 10, SWEEP_MIN_SECONDS)
        # The first sweep of a process at a random point of the interval: processes that
        # start together do not all sweep together.
        wait = interval if due is not None else random.uniform(0, interval)
        self._due[topic] = now + timedelta(seconds=wait)
        if due is not None or random.random() < self._first_chance:
            self._background.start(self.sweep(topic, window))

    async def sweep(self, topic: str, window: float) -> None:
        """Delete what the log of ``topic`` holds past ``window`` seconds (and the clock
        margin), now; a store error is logged (the next sweep tries again)."""
        prefix = layout.messages_prefix(layout.retained_log(topic))
        # Never early: a producer whose clock runs behind stamps its keys in the past.
        cutoff = self._clock() - timedelta(seconds=window) - self._margin
        try:
            for _ in range(SWEEP_MAX_PAGES):
                page = await self._store.list(prefix, limit=LIST_PAGE)
                expired = []
                for meta in page:
                    due = layout.due_from_key(meta.key)
                    if due is not None and due >= cutoff:
                        break
                    expired.append(meta.key)
                if expired:
                    await self._store.delete_many(expired)
                if len(expired) < len(page) or len(page) < LIST_PAGE:
                    return
        except StoreError as exc:
            logger.warning("replay log sweep failed topic=%s error=%s", topic, exc)
