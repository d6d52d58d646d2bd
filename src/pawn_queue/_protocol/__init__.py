"""The on-store protocol: internal, no stable API.

How messages, leases, claims, change signals, dedup markers, the registry's records and
group commits are laid out as objects and raced for with conditional writes (the numbered
rules of ``docs/protocol.md``). Every storage key is built in
:mod:`~pawn_queue._protocol.layout`.

May call: :mod:`pawn_queue.exceptions`, :mod:`pawn_queue.config`, :mod:`pawn_queue.store`,
:mod:`pawn_queue._internal`, and the public records it reads and writes
(:mod:`pawn_queue.message`, :mod:`pawn_queue.topics`, :mod:`pawn_queue.registry`);
never the client, the consumer, the producer or anything above them
(``tests/test_package_layout.py`` checks it).
"""
