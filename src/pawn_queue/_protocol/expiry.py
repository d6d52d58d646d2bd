"""Expiry: a message past its topic's retention, or past its own deadline
(``publish(expires_in=)``), is settled as the topic's ``retention_action`` says instead of
being delivered (docs/protocol.md, "Operations"). Both are judged at claim time, and its own
deadline again just before a handler would get it: a message claimed in time may have
waited since (a pause of its subscriber, a limit, a full buffer)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.runtime import Runtime

logger = logging.getLogger(__name__)


def past_retention(key: str, retention_seconds: float, now: datetime) -> bool:
    """Whether the message at ``key`` became due more than ``retention_seconds`` ago."""
    due = layout.due_from_key(key)
    return due is not None and now - due > timedelta(seconds=retention_seconds)


async def settle_expired(message: Message, action: str) -> None:
    """Settle a message past its own deadline as its topic's ``retention_action`` says:
    removed undelivered, or dead-lettered with reason ``expired``."""
    if action == "dead_letter":
        await message.dead_letter("expired", f"not delivered by its expiry {message.expires_at}")
    else:
        await message._drop_expired()
        logger.info("expired message id=%s expires_at=%s", message.id, message.expires_at)


async def settled_if_expired(message: Message, runtime: Runtime) -> bool:
    """Whether ``message``, not settled yet, is past its own deadline now: then it is settled
    as at claim time (:func:`settle_expired`), and never handed to a handler."""
    envelope = message._envelope
    if envelope.expires_at is None or message.settled or not envelope.expired(runtime.clock()):
        return False
    settings = await runtime.topics.settings(envelope.topic)
    await settle_expired(message, settings.retention_action)
    return True


async def unexpired(messages: list[Message], runtime: Runtime) -> list[Message]:
    """``messages`` but those :func:`settled_if_expired` settled."""
    return [m for m in messages if not await settled_if_expired(m, runtime)]
