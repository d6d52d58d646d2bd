"""Expiry at claim time: a message past its topic's retention, or past its own deadline
(``publish(expires_in=)``), is settled as the topic's ``retention_action`` says instead of
being delivered (docs/protocol.md, "Operations")."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.delivery import Message

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
