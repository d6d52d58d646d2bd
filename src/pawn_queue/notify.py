"""Change signals: how an idle consumer learns that a topic has new messages.

Within one process, a publish wakes the idle consumers of its topic at once (no request).
A periodic poll (``polling.interval_seconds``) covers everything else, so correctness never
depends on a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


class LocalSignals:
    """Wakes consumers of this process that wait on a topic when a producer here publishes."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def changed(self, topic: str) -> None:
        for event in self._waiters.get(topic, ()):
            event.set()

    async def wait(self, topics: Iterable[str], within: float) -> bool:
        """Wait until one of ``topics`` changes or ``within`` seconds pass; True if it changed."""
        event = asyncio.Event()
        names = list(topics)
        for name in names:
            self._waiters.setdefault(name, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), within)
            return event.is_set()
        finally:
            for name in names:
                waiters = self._waiters.get(name)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[name]
