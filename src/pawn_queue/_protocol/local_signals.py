"""Change signals within one process: a publish, or a lease given back, wakes the consumers
of this process that wait on its topic at once, with no request
(:mod:`pawn_queue._protocol.notify` brings other processes' signals here)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


class LocalSignals:
    """Wakes consumers of this process that wait on a topic.

    Each topic has a generation that every change bumps, so a consumer that snapshots it
    before polling does not miss a change that lands between its poll and its wait.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._generation: dict[str, int] = {}
        self._hinted: dict[str, int] = {}

    def changed(self, topic: str) -> None:
        self._generation[topic] = self._generation.get(topic, 0) + 1
        self._wake(topic)

    def hinted(self, topic: str) -> None:
        """New objects of ``topic`` were named to its consumers: wake its waiters, and move
        its snapshot but not its generation (what its last listing showed still holds)."""
        self._hinted[topic] = self._hinted.get(topic, 0) + 1
        self._wake(topic)

    def _wake(self, topic: str) -> None:
        for event in self._waiters.get(topic, ()):
            event.set()

    def generation(self, topic: str) -> int:
        """The count of the topic's changes that call for a listing."""
        return self._generation.get(topic, 0)

    def snapshot(self, topics: Iterable[str]) -> dict[str, int]:
        """Per topic, a count that every change and every hint moves."""
        return {t: self._generation.get(t, 0) + self._hinted.get(t, 0) for t in topics}

    def waited_on(self) -> set[str]:
        """The topics somebody waits on now."""
        return set(self._waiters)

    async def wait(
        self, topics: Iterable[str], within: float, since: dict[str, int] | None = None
    ) -> bool:
        """Wait until one of ``topics`` changes (after ``since``, if given) or ``within``
        seconds pass; True if it changed."""
        names = list(topics)
        if since is not None and self.snapshot(names) != since:
            return True
        event = asyncio.Event()
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
