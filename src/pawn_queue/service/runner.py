"""One worker process: run an app until a signal, then stop cleanly.

The first SIGTERM or SIGINT stops claiming, lets running handlers finish within the grace
period, gives every other message back at once (no receive counted) and exits 0. A second
one cuts the grace short: unfinished handlers are cancelled, their messages given back, and
the exit code is 3. A ``kill -9`` loses nothing either: the leases of its messages expire.

Beside the handlers the process runs the queue's schedules (unless ``--no-schedules``): each
tick fires once across every process that runs them, with no leader; a signal stops the
runner at once, and a crash of it is logged and it starts again while the handlers go on
(:mod:`pawn_queue.app._schedules`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pawn_queue.app import App, Subscriber
from pawn_queue.exceptions import PawnQueueError
from pawn_queue.service.health import HealthServer, StoreHealth
from pawn_queue.service.logs import LogFormat, MessageLog, setup_logging
from pawn_queue.store.base import Store

if TYPE_CHECKING:
    from pawn_queue.metrics import QueueMetrics

logger = logging.getLogger("pawn_queue.worker")

EXIT_STOPPED = 0  # stopped by a signal, handlers finished or given back
EXIT_FAILED = 1  # could not start, or a subscriber failed
EXIT_FORCED = 3  # a second signal cut the grace short (nothing lost: messages given back)

_PARENT_CHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How ``pawn-queue worker`` runs one process."""

    grace: float | None = None  # default: polling.shutdown_grace_seconds
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no HTTP endpoints
    log_format: LogFormat = "text"
    log_level: str = "info"
    supervised: bool = False  # a child of --processes: stop when the supervisor is gone
    schedules: bool = True  # run the queue's schedules beside the handlers (--no-schedules)


def run_worker(app: App, options: WorkerOptions) -> int:
    """Run ``app`` in this process until stopped; return the exit code."""
    setup_logging(options.log_format, options.log_level)
    return asyncio.run(run_app(app, options))


async def run_app(app: App, options: WorkerOptions) -> int:
    """What :func:`run_worker` runs on its event loop (signal handlers included)."""
    signals = 0

    def stop(reason: str) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            logger.info("stopping (%s): running handlers may finish", reason)
        else:
            logger.warning("stopping now (%s): running handlers are cancelled", reason)
        app.stop_consuming()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signal.Signals(signum).name)
    metrics = _metrics() if options.metrics_port is not None else None
    health = _observe(app, metrics)
    try:
        await app.start()
    except (PawnQueueError, OSError, ValueError) as exc:
        logger.error("worker failed to start: %s", exc)
        return EXIT_FAILED
    server = None
    watch = asyncio.create_task(_watch_parent(stop)) if options.supervised else None
    code = EXIT_STOPPED
    try:
        if options.metrics_port is not None:
            server = HealthServer(
                app, health(), metrics, options.metrics_host, options.metrics_port
            )
            await server.start()
        logger.info(
            "worker started app=%s subscribers=%s schedules=%s pid=%d",
            app.name,
            ",".join(f"{s.name}:{_reads(s)}" for s in app.subscribers),
            "on" if options.schedules else "off",
            os.getpid(),
        )
        for sub in app.subscribers:
            logger.info("subscriber %s receives %s", sub.name, sub.binding.describe())
        if not signals:
            await app.serve(grace=options.grace, schedules=options.schedules)
        if not signals:
            code = EXIT_FAILED  # serve() returns only when stopped
    except Exception:
        logger.exception("worker failed app=%s", app.name)
        code = EXIT_FAILED
    finally:
        if watch is not None:
            watch.cancel()
        if server is not None:
            await server.close()
        await app.stop()
    if code == EXIT_STOPPED and signals > 1:
        code = EXIT_FORCED
    logger.info("worker stopped app=%s exit=%d", app.name, code)
    return code


def _reads(sub: Subscriber) -> str:
    """``orders+returns``, or ``orders+returns@billing`` for a subscription's messages."""
    topics = "+".join(sub.topics)
    return topics if sub.subscription is None else f"{topics}@{sub.subscription}"


def _observe(app: App, metrics: QueueMetrics | None) -> StoreHealthRef:
    """Add the message log, the metrics (when exported) and the store's health."""
    app.add_observer(MessageLog())
    if metrics is not None:
        app.add_observer(metrics.observer)
        app.wrap_store(metrics.wrap_store)
    ref = StoreHealthRef()
    app.wrap_store(ref.wrap)
    return ref


class StoreHealthRef:
    """The app's store wrapped in :class:`StoreHealth`, once the app opened it."""

    def __init__(self) -> None:
        self._store: StoreHealth | None = None

    def wrap(self, store: Store) -> Store:
        self._store = StoreHealth(store)
        return self._store

    def __call__(self) -> StoreHealth:
        if self._store is None:
            raise PawnQueueError("the app's store is not open")
        return self._store


def _metrics() -> QueueMetrics | None:
    """The process' metrics (prometheus' global registry), or None without the extra."""
    try:
        from pawn_queue.metrics import default_metrics
    except ImportError:  # pragma: no cover - the CLI checks the extra first
        return None
    return default_metrics()


async def _watch_parent(stop: Callable[[str], None]) -> None:
    """Stop once the supervisor that started this process is gone (then reparented)."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - no event tells a parent's death
        await asyncio.sleep(_PARENT_CHECK_SECONDS)
    stop("the supervisor is gone")
