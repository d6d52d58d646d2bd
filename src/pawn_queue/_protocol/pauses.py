"""Pauses of a subscriber in every process: a handler raised ``RateLimited(retry_after=)``
(docs/concepts/flow-control.md, "Pausing a subscriber").

A pause is one small object, ``_pauses/{name}.json`` (``{"until": ...}``, UTC), named after
what the subscriber reads. The process that pauses writes it, stops at once and signals
``layout.PAUSES_CHANGED`` through the change signals; the others, hearing it, read the
pauses they know again before their next handler call (a HEAD, and a GET when it changed).
Otherwise a process reads a pause before its first handler call and then at most once per
``recheck_seconds`` while it has handlers to start (the backfill interval with signals on,
in case a signal was lost; :data:`CHECK_SECONDS` without them), never while idle. A pause
written later replaces an earlier one (the longest of two written at once may be lost to
the other: each process that paused still waits for its own).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.lease_protocol import bounded
from pawn_queue.exceptions import NotFound, StoreError
from pawn_queue.store.base import Store

logger = logging.getLogger(__name__)

CHECK_SECONDS = 1.0
"""How often a busy process reads a subscriber's pause where no signal says it changed."""
FORMAT = "pawn-queue-pause/1"


@dataclass
class _Known:
    until: datetime | None = None  # the pause in force, by this process's knowledge
    etag: str | None = None  # of the pause object last read
    checked: float = float("-inf")  # time.monotonic() of the last read


class Pauses:
    """The pauses of one queue's subscribers: written, read, waited out."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        request_seconds: float,
        recheck_seconds: float = CHECK_SECONDS,
    ) -> None:
        self._store = store
        self._clock = clock
        self._request_seconds = request_seconds
        self._recheck_seconds = recheck_seconds
        self._known: dict[str, _Known] = {}
        self.on_paused: Callable[[], None] = lambda: None
        """Called once this process wrote a pause (the change signals tell the others)."""

    def stale(self) -> None:
        """A pause was written somewhere: read each one known before the next handler."""
        for known in self._known.values():
            known.checked = float("-inf")

    async def pause(self, name: str, seconds: float) -> None:
        """Pause ``name`` for ``seconds`` here at once, and in the other processes through
        the store (a failure to write it is logged: the others then go on)."""
        until = self._clock() + timedelta(seconds=seconds)
        known = self._known.setdefault(name, _Known())
        if known.until is not None and known.until >= until:
            return
        known.until = until
        key = layout.pause_key(name)
        body = json.dumps({"format": FORMAT, "until": until.isoformat()}).encode()
        try:
            known.etag = await bounded(self._request_seconds, key, self._store.put(key, body))
        except StoreError as exc:
            logger.warning("pause not written name=%s error=%s", name, exc)
            return
        self.on_paused()

    def paused(self, name: str) -> bool:
        """Whether ``name`` is paused, as this process knows."""
        known = self._known.get(name)
        return known is not None and known.until is not None and known.until > self._clock()

    def clear(self, name: str) -> bool:
        """Whether ``name`` may go on with no request: read since the last signal of a
        pause and within ``recheck_seconds``, and not paused."""
        known = self._known.get(name)
        return (
            known is not None
            and time.monotonic() - known.checked < self._recheck_seconds
            and not self.paused(name)
        )

    async def wait(self, name: str) -> None:
        """Return once ``name`` is not paused, reading its pause when it is due (see
        :meth:`clear`; a signal may say it was extended meanwhile)."""
        known = self._known.setdefault(name, _Known())
        while True:
            if time.monotonic() - known.checked >= self._recheck_seconds:
                await self._check(name, known)
            left = 0.0 if known.until is None else (known.until - self._clock()).total_seconds()
            if left <= 0:
                return
            await asyncio.sleep(min(left, CHECK_SECONDS))  # due again? It may be extended

    async def _check(self, name: str, known: _Known) -> None:
        key = layout.pause_key(name)
        known.checked = time.monotonic()
        try:
            meta = await bounded(self._request_seconds, key, self._store.head(key))
            if meta.etag == known.etag:
                return
            current = await bounded(self._request_seconds, key, self._store.get(key))
        except NotFound:
            known.etag = None
            return
        except StoreError as exc:  # the handler's own requests will say more
            logger.info("pause not read name=%s error=%s", name, exc)
            return
        known.etag = current.meta.etag
        until = decode_until(current.data)
        if until is not None and (known.until is None or until > known.until):
            known.until = until


def decode_until(data: bytes) -> datetime | None:
    """Until when the pause object ``data`` pauses; None if it is not one (written by
    something else, or without a time zone)."""
    try:
        until = datetime.fromisoformat(json.loads(data)["until"])
    except (ValueError, TypeError, KeyError):
        return None
    return until if until.tzinfo is not None else None
