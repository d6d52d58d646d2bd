"""What the dashboard is told at start: where it listens, who may use it, how often it reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pawn_queue.exceptions import ArgumentError

TOKEN_ENV_VAR = "PAWNQUEUE_DASHBOARD_TOKEN"  # noqa: S105 - a variable name, not a secret
"""The environment variable ``pawn-queue dashboard`` takes its token from (``--token`` wins)."""

MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    """How the dashboard listens, reads and acts. Checked when built (ArgumentError).

    ``refresh``: seconds between looks at the change signals (one HEAD), the shortest time
    between two reads of a topic, and the oldest the counts an open page shows may be (they
    are read again once that old). ``full_refresh``: seconds between reads of everything
    (topics, counts, settings, registry) even without a signal or an open page; acks and
    lease writes send none. ``max_age``: a topic whose oldest pending message is older is a
    problem.
    ``metrics_urls``: Prometheus exporters whose message counters add exact flow to the
    topic pages. ``token``: required from every client when set (always, off loopback).
    ``allow_actions``: redrive and purge from the page.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = field(default=None, repr=False)
    allow_actions: bool = False
    refresh: float = 2.0
    full_refresh: float = 60.0
    max_age: float = 300.0
    metrics_urls: tuple[str, ...] = field(default=(), repr=False)
    history_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("refresh", "full_refresh", "max_age", "history_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ArgumentError(f"{name}: got {value!r}, must be a number > 0")
        if self.full_refresh < self.refresh:
            raise ArgumentError(
                f"full_refresh: got {self.full_refresh:g}, must be >= refresh ({self.refresh:g})"
            )
        if not (isinstance(self.port, int) and 0 <= self.port <= 65535):
            raise ArgumentError(f"port: got {self.port!r}, must be 0-65535")
        if self.token is not None and len(self.token) < MIN_TOKEN_LENGTH:
            # The token's value is never shown: it is a secret, even a short one.
            raise ArgumentError(f"token: must be at least {MIN_TOKEN_LENGTH} characters long")
        for url in self.metrics_urls:
            if not url.startswith(("http://", "https://")):
                raise ArgumentError("metrics url: must start with http:// or https://")
