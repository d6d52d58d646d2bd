"""Deduplication: a ``dedup_id`` published again within the window writes nothing new.

A marker per dedup id, written create-only, decides which publish is the first; it names
the message (id and key) and says whether the message was written. A repeat that finds a
marker within the window returns its message id. If the marker says the first publish had
not finished writing (it crashed, or is still in flight), the repeat writes the message
itself, under the same key, so a retry after a failed publish never loses the message.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from datetime import timedelta

from pawn_queue import codec
from pawn_queue.envelope import encode_json, now_utc, parse_time
from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed
from pawn_queue.store.base import IfMatch, PutMode, Store


@dataclass(frozen=True, slots=True)
class Marker:
    dedup_id: str
    message_id: str
    message_key: str
    created_at: str
    written: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """What a publish with a dedup id must do: write (``etag`` is the marker's) or not."""

    marker: Marker
    write: bool
    etag: str | None


async def decide(store: Store, key: str, proposal: Marker, window_seconds: float) -> Decision:
    """Claim the dedup id with ``proposal``, or learn which message already holds it."""
    for _ in range(3):  # a marker replaced or deleted under us: look again
        try:
            etag = await store.put(key, encode_json(asdict(proposal)), "create")
            return Decision(proposal, True, etag)
        except AlreadyExists:
            pass
        try:
            current = await store.get(key)
        except NotFound:
            continue
        marker = _decode(current.data)
        fresh = marker is not None and now_utc() - parse_time(marker.created_at) < timedelta(
            seconds=window_seconds
        )
        if marker is not None and fresh:
            return Decision(marker, not marker.written, current.meta.etag)
        try:  # expired (or unreadable): the id is free again
            etag = await store.put(key, encode_json(asdict(proposal)), IfMatch(current.meta.etag))
            return Decision(proposal, True, etag)
        except PreconditionFailed:
            continue
    raise PreconditionFailed(f"dedup marker {key} kept changing")


async def mark_written(store: Store, key: str, decision: Decision) -> None:
    """Record that the message was written; losing this race only costs a rewrite later."""
    body = encode_json(asdict(replace(decision.marker, written=True)))
    mode: PutMode = IfMatch(decision.etag) if decision.etag else "overwrite"
    with contextlib.suppress(PreconditionFailed):
        await store.put(key, body, mode)


def _decode(data: bytes) -> Marker | None:
    try:
        raw = codec.loads(data)
        marker = Marker(
            dedup_id=str(raw["dedup_id"]),
            message_id=str(raw["message_id"]),
            message_key=str(raw["message_key"]),
            created_at=str(raw["created_at"]),
            written=bool(raw.get("written", False)),
        )
        parse_time(marker.created_at)
        return marker
    except (ValueError, KeyError, TypeError):
        return None
