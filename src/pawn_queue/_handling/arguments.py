"""What ``listen()`` (async or blocking) and ``@app.subscriber`` take, checked before
anything is claimed."""

from __future__ import annotations

import inspect
import reprlib

from pawn_queue._handling.batching import check_batch
from pawn_queue._internal.durations import seconds_argument
from pawn_queue.exceptions import ArgumentError
from pawn_queue.retry import Retry


def check_concurrency(concurrency: object) -> None:
    """Refuse a ``concurrency`` that is not a positive integer."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ArgumentError(f"concurrency must be a positive integer, got {concurrency!r}")


def check_listen(
    handler: object,
    *,
    retry: object,
    grace: object,
    concurrency: object = None,
    batch: object = None,
    batch_wait: object = None,
) -> None:
    """Refuse what ``listen()`` (async or blocking) cannot use, before it claims anything."""
    check_handler(handler)
    if retry is not None and not isinstance(retry, Retry):
        raise ArgumentError(f"retry: got {reprlib.repr(retry)}, must be a pawn_queue.Retry or None")
    if grace is not None:
        seconds_argument("grace", grace, zero=True)
    if concurrency is not None:
        check_concurrency(concurrency)
    if batch is not None or batch_wait is not None:
        check_batch(batch, batch_wait)


def check_handler(handler: object) -> None:
    """Refuse a ``handler`` that cannot be called with one argument (a message, or a batch's
    list of them): it would fail on every message and dead-letter them all."""
    if not callable(handler):
        raise ArgumentError(f"handler: got {reprlib.repr(handler)}, must be a function")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # a builtin without a readable signature: its call will tell
    try:
        signature.bind(None)
    except TypeError as exc:
        name = getattr(handler, "__qualname__", repr(handler))
        raise ArgumentError(f"handler: {name} cannot take a message: {exc}") from None
