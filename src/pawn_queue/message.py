"""Message: one delivered message and how it is settled (``ack``, ``nack``, ``extend``,
``dead_letter``). Delivery is :mod:`pawn_queue._protocol.delivery`."""

from pawn_queue._protocol.delivery import Message

__all__ = ["Message"]

Message.__module__ = __name__
