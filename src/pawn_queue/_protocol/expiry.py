"""Expiry: a message past its topic's retention, or past its own deadline
(``publish(expires_in=)``), is settled as the topic's ``retention_action`` says instead of
being delivered (docs/protocol.md, "Operations"). Both are judged at claim time, and its own
deadline again just before a handler would get it: a message claimed in time may have
waited since (a pause of its subscriber, a limit, a full buffer)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from pawn_queue._protocol import layout
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.envelope import Envelope, parse_time
from pawn_queue._protocol.runtime import Runtime

logger = logging.getLogger(__name__)


def past_retention(
    key: str, envelopes: Iterable[Envelope], retention_seconds: float, now: datetime
) -> bool:
    """Whether the messages at ``key`` became due more than ``retention_seconds`` ago: when
    its key says, or, for a message that moved (a requeued member), when it was first due."""
    dues = [due] if (due := layout.due_from_key(key)) is not None else []
    for envelope in envelopes:
        if envelope.first_due is not None:
            with contextlib.suppress(ValueError):  # a garbled field must not drop it
                dues.append(parse_time(envelope.first_due))
    return bool(dues) and now - min(dues) > timedelta(seconds=retention_seconds)


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
