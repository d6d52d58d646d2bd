"""Calling handlers: how a handler's signature is bound to a message (``binding``), how it is
called, in the loop or a thread (``handlers``), and batch handlers (``batching``). Internal,
no stable API. May call ``pawn_queue._protocol`` and below (docs/development/layout.md)."""
