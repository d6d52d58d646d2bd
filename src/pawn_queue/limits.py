"""The slot ``concurrency_limit`` holds (docs/concepts/flow-control.md). Slots are won, kept
and given back by :mod:`pawn_queue._protocol.limits`."""

from pawn_queue._protocol.limits import LimitSlot

__all__ = ["LimitSlot"]

LimitSlot.__module__ = __name__
