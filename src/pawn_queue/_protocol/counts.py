"""A queue's counts in messages, with the objects beside them (the dashboard and the
command line show them).

A listing tells objects, and a batch object holds many messages; how many, and which of them
a consumer already settled (its lease lists them), only the bodies tell. So a read lists the
topic's messages, leases and dead letters (three LISTs per 1,000 objects, as ``topic_stats``)
and then GETs only what it cannot know yet: each batch object it has not seen before (at
most :data:`NEW_BATCHES_PER_READ` per read) and each batch lease whose etag changed since
the last read. A batch's member count never changes (it is written once; a member requeued
alone moves to an object of its own), so it is kept by key for as long as the object is
listed. A single message, a group's message and a dead letter are one object each.

Asked to (the dashboard does), a read also counts the dead letters by reason: a dead letter
is written once, so its reason is read with one GET the first time it is listed (at most
:data:`NEW_DEAD_LETTERS_PER_READ` per read) and kept by key and etag.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from pawn_queue._internal.aio import gather_limited
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import LeaseBody, dead_letter_reason, decode_batch
from pawn_queue._protocol.topics import Listed, MessageState, classify
from pawn_queue.exceptions import NotFound
from pawn_queue.store.base import ObjectMeta, Store

NEW_BATCHES_PER_READ = 1000  # bounds one read's GETs (and time) on a large backlog
NEW_DEAD_LETTERS_PER_READ = 1000  # the same for the dead letters whose reason is read
_GET_CONCURRENCY = 8

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Counts:
    """A topic's messages by state, and the objects that hold them."""

    pending: int  # messages due and not leased
    in_flight: int  # messages under a lease written within the visibility timeout
    delayed: int  # messages not due yet
    dead_letter: int  # dead letters (one message each)
    oldest_age_seconds: float | None  # age of the oldest pending object, from its due time
    pending_objects: int  # what topic_stats counts (a batch object counts once)
    in_flight_objects: int
    delayed_objects: int
    uncounted_batches: int = 0  # batch objects not read yet: one message each, for now


@dataclass(slots=True)
class BatchSizes:
    """What the reads of one topic learnt of its batch objects, by key and etag."""

    members: dict[str, tuple[str, int]] = field(default_factory=dict)  # object key
    settled: dict[str, tuple[str, int]] = field(default_factory=dict)  # lease key


@dataclass(slots=True)
class DeadReasons:
    """What the reads of one queue learnt of its dead letters: each one's reason, by key
    (with the etag it was read at: a message dead-lettered again after a redrive is written
    again under the same key)."""

    known: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (etag, reason)


@dataclass(frozen=True, slots=True)
class Reading:
    """One read of a topic."""

    counts: Counts
    at: datetime
    sizes: dict[str, int]  # messages left in each message object listed
    dead_keys: frozenset[str]
    groups: dict[str, int]  # group hash -> messages
    next_due: datetime | None  # when the first delayed message comes due
    dead_reasons: dict[str, int] = field(default_factory=dict)  # reason -> dead letters
    dead_unread: int = 0  # dead letters whose reason is not read yet (none when not asked)


async def read_topic(
    store: Store,
    name: str,
    visibility_seconds: float,
    clock: Callable[[], datetime],
    cache: BatchSizes,
    new_batches: int = NEW_BATCHES_PER_READ,
    reasons: DeadReasons | None = None,
) -> Reading:
    """Read topic ``name``'s counts (or a subscription's: ``name`` is then its queue),
    learning what ``cache`` does not know yet of its batch objects, at most ``new_batches``
    of them; with ``reasons``, its dead letters by reason too. States are those at
    ``clock()`` once the listings returned."""
    messages = await store.list(layout.messages_prefix(name))
    leases = await store.list(layout.leases_prefix(name))
    dead = await store.list(layout.dead_letter_prefix(name))
    now = clock()
    listed = list(classify(name, messages, leases, now, visibility_seconds))
    lease_metas = {m.key: m for m in leases}
    batches = [item for item in listed if item.pending.kind == "batch"]
    uncounted = await _learn(store, name, batches, lease_metas, cache, new_batches)
    by_reason: dict[str, int] = {}
    if reasons is not None:
        by_reason = await _learn_reasons(store, dead, reasons)
    objects: Counter[MessageState] = Counter()
    held: Counter[MessageState] = Counter()
    sizes: dict[str, int] = {}
    groups: Counter[str] = Counter()
    oldest: datetime | None = None
    next_due: datetime | None = None
    for item in listed:
        size = _size(name, item, cache)
        sizes[item.meta.key] = size
        objects[item.state] += 1
        held[item.state] += size
        if item.pending.kind == "group":
            groups[item.pending.shared_id] += size
        if item.state == "pending":
            oldest = item.due if oldest is None else min(oldest, item.due)
        elif item.state == "delayed":
            next_due = item.due if next_due is None else min(next_due, item.due)
    age = (now - oldest).total_seconds() if oldest is not None else None
    counts = Counts(
        held["pending"],
        held["in_flight"],
        held["delayed"],
        len(dead),
        age,
        objects["pending"],
        objects["in_flight"],
        objects["delayed"],
        uncounted,
    )
    dead_keys = frozenset(m.key for m in dead)
    unread = len(dead) - sum(by_reason.values()) if reasons is not None else 0
    return Reading(counts, now, sizes, dead_keys, dict(groups), next_due, by_reason, unread)


def _size(name: str, item: Listed, cache: BatchSizes) -> int:
    """Messages still in the object: one, or a batch's members not settled yet."""
    if item.pending.kind != "batch":
        return 1
    known = cache.members.get(item.meta.key)
    if known is None:
        return 1  # not read yet (over this read's budget)
    settled = cache.settled.get(layout.lease_key(name, item.pending.lease_id()))
    return max(0, known[1] - (settled[1] if settled else 0))


async def _learn(
    store: Store,
    name: str,
    batches: list[Listed],
    leases: dict[str, ObjectMeta],
    cache: BatchSizes,
    budget: int,
) -> int:
    """Read the batch objects and batch leases ``cache`` does not know (in their current
    version); forget those no longer listed. Returns the batch objects left unread."""
    new = [
        b.meta
        for b in batches
        if (known := cache.members.get(b.meta.key)) is None or known[0] != b.meta.etag
    ]
    unread = max(0, len(new) - budget)
    new = new[:budget]
    lease_keys = [layout.lease_key(name, b.pending.lease_id()) for b in batches]
    changed = [
        leases[key]
        for key in lease_keys
        if key in leases
        and ((seen := cache.settled.get(key)) is None or seen[0] != leases[key].etag)
    ]
    members = await gather_limited(_GET_CONCURRENCY, (_members(store, m) for m in new))
    settled = await gather_limited(_GET_CONCURRENCY, (_settled(store, m) for m in changed))
    listed = {b.meta.key for b in batches}
    cache.members = {k: v for k, v in cache.members.items() if k in listed}
    cache.settled = {k: v for k, v in cache.settled.items() if k in leases}
    _keep(cache.members, new, members)
    _keep(cache.settled, changed, settled)
    return unread


def _keep(
    known: dict[str, tuple[str, T]],
    metas: Sequence[ObjectMeta],
    results: Sequence[T | BaseException | None],
) -> None:
    """Note each result by its object's key and etag (None: the object is gone)."""
    for meta, result in zip(metas, results, strict=True):
        if isinstance(result, BaseException):
            raise result
        if result is not None:
            known[meta.key] = (meta.etag, result)


async def _members(store: Store, meta: ObjectMeta) -> int | None:
    """A batch object's member count; None once it is gone (settled since the listing)."""
    try:
        data = (await store.get(meta.key)).data
    except NotFound:
        return None
    try:
        return len(decode_batch(data))
    except ValueError:  # corrupt: a consumer moves it to dead letter as one object
        return 1


async def _settled(store: Store, meta: ObjectMeta) -> int:
    """The members a batch lease lists as settled (none once it is gone or unreadable)."""
    try:
        data = (await store.get(meta.key)).data
    except NotFound:
        return 0
    try:
        return len(set(LeaseBody.decode(data).settled))
    except ValueError:  # unreadable: no member is known settled
        return 0


async def _learn_reasons(
    store: Store, dead: list[ObjectMeta], cache: DeadReasons
) -> dict[str, int]:
    """The listed dead letters by reason, reading those ``cache`` does not know (in their
    current version; at most :data:`NEW_DEAD_LETTERS_PER_READ`) and forgetting those no
    longer listed. A dead letter not read yet is in no reason's count."""
    new = [m for m in dead if (known := cache.known.get(m.key)) is None or known[0] != m.etag]
    new = new[:NEW_DEAD_LETTERS_PER_READ]
    reasons = await gather_limited(_GET_CONCURRENCY, (_reason(store, m) for m in new))
    listed = {m.key for m in dead}
    cache.known = {k: v for k, v in cache.known.items() if k in listed}
    _keep(cache.known, new, reasons)
    counts = Counter(
        known[1] for m in dead if (known := cache.known.get(m.key)) and known[0] == m.etag
    )
    return dict(sorted(counts.items()))


async def _reason(store: Store, meta: ObjectMeta) -> str | None:
    """A dead letter's reason; None once it is gone (redriven or purged since the listing)."""
    try:
        return dead_letter_reason((await store.get(meta.key)).data)
    except NotFound:
        return None
