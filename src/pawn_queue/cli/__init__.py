"""The ``pawn-queue`` command line (Typer + Rich, the ``cli`` extra), and the demos.

- ``root.py``: the Typer ``app`` (global options anywhere, one-line usage errors) and
  ``main``, the console script; both are importable from this package.
- ``common.py``: options, connecting, errors and output, shared by the commands.
- ``messages.py``: ``publish``, ``consume``, ``peek``.
- ``admin.py``: ``topics``, ``consumers``, ``producers``.
- ``subscriptions.py``: ``subscriptions`` (a topic's subscriptions).
- ``dlq.py``: ``dlq`` (dead letters of a topic or of one of its subscriptions).
- ``schedules.py``: ``schedules`` (messages published on a cron expression or an
  interval, and ``schedules run``, which fires them).
- ``worker.py``: ``worker`` (an app's handlers as a service).
- ``doctor.py``: ``doctor``, ``metrics`` and ``demo``.
- ``demo.py``: the demo job (``make demo``, ``pawn-queue demo``); ``demo_dirs.py``: the
  directories demos may clear (also used by ``examples/orders_pipeline.py``).

Importing this package imports nothing else: ``app`` and ``main`` load Typer when first
used, so ``demo_dirs`` works without the ``cli`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pawn_queue.cli.root import app, main

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pawn_queue.cli import root

        return getattr(root, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
