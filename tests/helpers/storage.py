"""What a queue leaves in its store, as the protocol lays it out (docs/protocol.md, "Bucket
layout"): the one place the tests of the public API take keys and object formats from, so
that they import no internals. Each function is named for what a test checks or plants.

They read and write the store as it is now: to wait first for the deletes that follow acks,
see ``tests.helpers.support`` (``settled``, ``keys_under``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import Envelope, LeaseBody
from pawn_queue.exceptions import NotFound
from pawn_queue.store.base import Store


async def _keys(store: Store, prefix: str) -> list[str]:
    return [meta.key for meta in await store.list(prefix)]


# -- messages -------------------------------------------------------------------------------


async def message_keys(store: Store, topic: str) -> list[str]:
    """The keys of the topic's pending objects: messages, batch objects, group messages."""
    return await _keys(store, layout.messages_prefix(topic))


def _message_key(
    topic: str, message_id: str, at: datetime, *, delayed: bool, group: str | None
) -> str:
    if group is None:
        return layout.message_key(topic, message_id, at, delayed=delayed)
    return layout.group_message_key(topic, message_id, at, group, delayed=delayed)


async def write_message(
    store: Store,
    topic: str,
    payload: Any,
    *,
    at: datetime | None = None,
    delayed: bool = False,
    group: str | None = None,
    message_id: str | None = None,
) -> str:
    """Write a message as a producer whose clock reads ``at`` (now by default) would: its key
    says when it is due (``delayed``: not before then), ``group`` is its message group.
    Returns its id."""
    at = datetime.now(UTC) if at is None else at
    envelope = Envelope(
        id=str(uuid.uuid4()) if message_id is None else message_id,
        topic=topic,
        producer_id=str(uuid.uuid4()),
        created_at=at.isoformat(),
        payload=payload,
        group=group,
    )
    key = _message_key(topic, envelope.id, at, delayed=delayed, group=group)
    await store.put(key, envelope.encode())
    return envelope.id


async def write_unreadable_message(store: Store, topic: str, data: bytes) -> str:
    """Write ``data``, which is not a message, where a message published now would be (so
    a consumer finds it and quarantines it). Returns the id its key gives it."""
    message_id = str(uuid.uuid4())
    key = _message_key(topic, message_id, datetime.now(UTC), delayed=False, group=None)
    await store.put(key, data)
    return message_id


# -- leases ---------------------------------------------------------------------------------


def lease_key(topic: str, message_id: str) -> str:
    """The key of the lease on a message or batch object (by the object's id): what a fault
    hook waits for, and what a consumer's ``held_leases`` are keyed by."""
    return layout.lease_key(topic, message_id)


def group_lease_key(topic: str, group: str) -> str:
    """The key of the lease a message group shares (one message of a group at a time)."""
    return layout.lease_key(topic, f"g{layout.group_hash(group)}")


async def lease_keys(store: Store, topic: str) -> list[str]:
    """The keys of the topic's leases."""
    return await _keys(store, layout.leases_prefix(topic))


async def lease_of(store: Store, topic: str, message_id: str) -> LeaseBody:
    """The lease on a message or batch object as stored: ``consumer_id``, ``expires`` (a
    datetime), ``settled`` (the batch members acked or dead-lettered), ``receive_count``."""
    return LeaseBody.decode((await store.get(lease_key(topic, message_id))).data)


async def leases_of(store: Store, topic: str) -> list[LeaseBody]:
    """Every lease of the topic as stored (see :func:`lease_of`), in key order."""
    return [LeaseBody.decode((await store.get(key)).data) for key in await lease_keys(store, topic)]


# -- dead letters ---------------------------------------------------------------------------


async def dead_letter_ids(store: Store, topic: str) -> list[str]:
    """The ids of the topic's dead letters, read from their keys (a LIST, no GET: unlike
    ``PawnQueue.dead_letters``, whatever the objects hold)."""
    found = []
    for key in await _keys(store, layout.dead_letter_prefix(topic)):
        message_id = key.rsplit("/", 1)[-1].removesuffix(layout.MESSAGE_SUFFIX)
        found.append(message_id if layout.dead_letter_key(topic, message_id) == key else key)
    return found


# -- the registry ---------------------------------------------------------------------------


async def write_instance_record(store: Store, record: dict[str, Any]) -> str:
    """Write the registry record of a process (``record["instance_id"]``) as that process
    would. Returns its key."""
    key = layout.instance_key(record["instance_id"])
    await store.put(key, json.dumps(record).encode())
    return key


async def instance_record_keys(store: Store) -> list[str]:
    """The keys of the registry's process records."""
    return await _keys(store, layout.INSTANCES)


# -- schedules ------------------------------------------------------------------------------


async def schedule_tick_keys(store: Store, name: str) -> list[str]:
    """The keys of a schedule's tick markers, oldest tick first."""
    return await _keys(store, layout.schedule_ticks_prefix(name))


def schedule_key(name: str) -> str:
    """Where a schedule's definition is stored."""
    return layout.schedule_key(name)


# -- concurrency limits ---------------------------------------------------------------------


def limit_slot_key(name: str, slot: int) -> str:
    """Where slot ``slot`` of the concurrency limit ``name`` is stored."""
    return layout.limit_slot_key(name, slot)


async def limit_slots(store: Store, name: str, limit: int) -> dict[int, LeaseBody]:
    """The stored slots of the concurrency limit ``name`` (its lease bodies), by slot; the
    slots never written are left out."""
    found: dict[int, LeaseBody] = {}
    for slot in range(limit):
        with contextlib.suppress(NotFound):
            stored = await store.get(layout.limit_slot_key(name, slot))
            found[slot] = LeaseBody.decode(stored.data)
    return found
