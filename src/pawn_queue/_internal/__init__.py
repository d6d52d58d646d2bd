"""Plumbing shared by the library: internal, no stable API.

Asyncio helpers, the background event-loop thread behind the blocking API, daemon thread
pools, duration arguments, the configuration model's sections and sources, and how
handlers are called and their signatures bound (for the consumer and the ``App``).

May call: :mod:`pawn_queue.exceptions`, :mod:`pawn_queue.message` (handlers take
messages) and each other; never the protocol, the client or anything above them
(``tests/test_package_layout.py`` checks it).
"""
