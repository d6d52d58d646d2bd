"""The on-store protocol and the engines built on it: internal, no stable API.

How messages, leases, claims, change signals, dedup markers, the registry's records and
group commits are laid out as objects and raced for with conditional writes (the numbered
rules of ``docs/protocol.md``); the topics, subscriptions and registry kept that way, and a
delivered message's settlement. Every storage key is built in
:mod:`~pawn_queue._protocol.layout`.

May call :mod:`pawn_queue.store`, :mod:`pawn_queue.config`, :mod:`pawn_queue._internal` and
:mod:`pawn_queue.exceptions`; never anything above (the public modules re-export its
records). The contract in pyproject.toml says so, and ``lint-imports`` checks it.
"""
