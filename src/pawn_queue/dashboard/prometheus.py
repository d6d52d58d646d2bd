"""Exact message flow from Prometheus exporters (``pawn_queue.metrics``), when given.

The dashboard scrapes each ``/metrics`` URL and turns the per-topic message counters into
differences per scrape. Only the text format's plain samples are read; a counter that went
down (its process restarted) counts from zero.
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.request
from collections import defaultdict

logger = logging.getLogger(__name__)

PUBLISHED = "pawnqueue_messages_published_total"
ACKED = "pawnqueue_messages_acked_total"
DEAD_LETTERED = "pawnqueue_messages_dead_lettered_total"
_COUNTERS = (PUBLISHED, ACKED, DEAD_LETTERED)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_TIMEOUT_SECONDS = 2.0
_MAX_BYTES = 8 * 1024 * 1024

Totals = dict[tuple[str, str], float]  # (counter, topic) -> value


def parse_counters(text: str) -> Totals:
    """The message counters per topic in a text exposition (other samples are skipped)."""
    totals: Totals = defaultdict(float)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in _COUNTERS:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(match.group(2) or "")}
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if "topic" in labels:
            totals[(match.group(1), labels["topic"])] += value
    return dict(totals)


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


class Scraper:
    """Scrapes the exporters and returns, per topic, what was published, acked and
    dead-lettered since the last scrape. The URLs are never shown: they may hold a secret."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        self._urls = urls
        self._last: list[Totals | None] = [None] * len(urls)
        self.error: str | None = None

    async def scrape(self) -> dict[str, tuple[float, float, float]]:
        deltas: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        errors = []
        for index, url in enumerate(self._urls):
            try:
                text = await asyncio.to_thread(_fetch, url)
            except Exception as exc:  # any failure of an outside endpoint
                errors.append(f"exporter {index + 1}: {type(exc).__name__}")
                continue
            totals = parse_counters(text)
            last = self._last[index]
            self._last[index] = totals
            if last is None:
                continue
            for (counter, topic), value in totals.items():
                before = last.get((counter, topic), 0.0)
                delta = value - before if value >= before else value
                deltas[topic][_COUNTERS.index(counter)] += delta
        error = ("metrics not read: " + ", ".join(errors)) if errors else None
        if error != self.error and error is not None:
            logger.warning("dashboard %s", error)
        self.error = error
        return {topic: (d[0], d[1], d[2]) for topic, d in deltas.items()}


def _fetch(url: str) -> str:
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS) as response:  # noqa: S310
        body: bytes = response.read(_MAX_BYTES)
    return body.decode("utf-8", "replace")
