"""Where every object lives.

Every storage key is built here. The layout is compatible with pawn-queue 0.1.x::

    {topic}/.topic                              topic marker (JSON: settings)
    {topic}/messages/{ts}-{uuid}.json           pending message, FIFO by key
    {topic}/messages/{ts}d-{uuid}.json          delayed message: {ts} is its due time
    {topic}/messages/!{9-p}{ts}-{uuid}.json     message of priority p (1-9): listed before
                                                priority 0, highest first (any kind but a
                                                group's; :mod:`.message_names`)
    {topic}/messages/{ts}-{uuid}.batch          batch object: many messages, one lease
    {topic}/messages/{ts}-{uuid}.run            message of a run: one lease for its second
    {topic}/messages/{ts}-{uuid}.{g}.group      message of group g (sha256 of its name)
    {topic}/leases/g{g}.lease                   the lease of group g: one message at a time
    {topic}/leases/s{second}.lease              the lease of a run: the .run messages of a
                                                second (band and delay mark included)
    {topic}/leases/{uuid}.lease                 claim of the message {uuid}
    {topic}/dead-letter/{uuid}.json             dead letter
    {topic}/dedup/{sha256(dedup_id)}.json       a dedup_id seen recently, and its message
    {topic}/.subscriptions                      the topic's subscriptions (JSON: name -> filter)
    {topic}/subscriptions/{name}/...            a subscription's queue: .topic, messages/,
                                                leases/, dead-letter/ as a topic's own
    {topic}/retained/messages/...               the replay log: every message, as published,
                                                for the topic's replay window
    _registry/{producers|consumers}/{uuid}.json registry entry
    _registry/names/{producers|consumers}/{name}.json  name -> uuid index (create-only)
    _registry/instances/{uuid}.json             a process: host, pid, heartbeat, members
    _probe/{uuid}.probe                         strategy probe, deleted at once
    _probe/result.json                          the last probe's answer, kept a day
    _notify/r00 .. r15; 000 .. 999, _          change signals: the ring; 0.2.0's slots, root
    _spark/{query}/batches/{n}.json             a streaming query's micro-batch manifest
    _spark/{query}/sink/{n}.json                a streaming write's micro-batch marker
    _schedules/{name}.json                      a schedule's definition (JSON)
    _schedule_ticks/{name}/{tick}               a fired tick of a schedule (create-only, once)
    _limits/{name}/{slot}.lease                 a slot of a concurrency limit: a lease
    _rates/{name}/{k}.json                      key k (0-15) of a rate limit's ring of chunks
    _limits|_rates/_topics/{topic}/...          a subscriber's limits (subscriber_limit_name)
    _pauses/_topics/{topic}.json                a subscriber's pause (RateLimited): until when

Names (of topics, producers, consumers, limits...) are checked by :mod:`pawn_queue._protocol.names`.

A *queue* is where messages wait for consumers: a topic's own (named as the topic), or a
subscription's, named ``{topic}/subscriptions/{name}`` (:func:`subscription_queue`). Every
``{topic}`` above is a queue; the key functions take either.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from pawn_queue._protocol.message_names import BATCH_SUFFIX as BATCH_SUFFIX
from pawn_queue._protocol.message_names import (
    DELAYED_MARK,
    STAMP_LENGTH,
    band,
    pending_of_name,
    run_suffix,
    stamp,
    unbanded,
)
from pawn_queue._protocol.message_names import GROUP_SUFFIX as GROUP_SUFFIX
from pawn_queue._protocol.message_names import MESSAGE_SUFFIX as MESSAGE_SUFFIX
from pawn_queue._protocol.message_names import PRIORITIES as PRIORITIES
from pawn_queue._protocol.message_names import RUN_SUFFIX as RUN_SUFFIX
from pawn_queue._protocol.message_names import PendingKey as PendingKey
from pawn_queue._protocol.message_names import RunNumbers as RunNumbers
from pawn_queue._protocol.message_names import band_of as band_of
from pawn_queue._protocol.message_names import due_from_key as due_from_key
from pawn_queue._protocol.message_names import is_delayed_key as is_delayed_key
from pawn_queue._protocol.message_names import priority_of as priority_of
from pawn_queue._protocol.message_names import run_end as run_end
from pawn_queue._protocol.names import RESERVED_PREFIXES as RESERVED_PREFIXES
from pawn_queue._protocol.names import is_uuid as is_uuid
from pawn_queue._protocol.names import validate_name as validate_name
from pawn_queue.store.base import LIST_PAGE as LIST_PAGE  # the page of listings and deletes

Role = Literal["producers", "consumers"]
ROLES: tuple[Role, ...] = ("producers", "consumers")

TOPIC_MARKER = ".topic"
MESSAGES = "messages/"
LEASES = "leases/"
LEASE_SUFFIX = ".lease"
DEAD_LETTER = "dead-letter/"
DEDUP = "dedup/"
REGISTRY = "_registry/"
PROBE = "_probe/"


def topic_prefix(topic: str) -> str:
    return f"{topic}/"


def topic_of(key: str) -> str:
    """The topic a key under ``{topic}/`` belongs to: its first segment."""
    return key.partition("/")[0]


SUBSCRIPTIONS = "subscriptions/"
SUBSCRIPTION_INDEX = ".subscriptions"


def subscription_queue(topic: str, subscription: str) -> str:
    """The queue of a subscription: its keys lie under ``{topic}/subscriptions/{name}/``."""
    return f"{topic}/{SUBSCRIPTIONS}{subscription}"


def queue(topic: str, subscription: str | None) -> str:
    """The queue a public call names: the topic's own, or one of its subscriptions' (each
    name validated)."""
    validate_name(topic, "topic name")
    if subscription is None:
        return topic
    return subscription_queue(topic, validate_name(subscription, "subscription name"))


def subscription_index_key(topic: str) -> str:
    """The topic's subscriptions and their filters, read by every producer of the topic."""
    return f"{topic}/{SUBSCRIPTION_INDEX}"


def subscriptions_prefix(topic: str) -> str:
    return f"{topic}/{SUBSCRIPTIONS}"


def split_queue(queue: str) -> tuple[str, str | None]:
    """``(topic, subscription)`` of a queue; the subscription is None for a topic's own."""
    topic, sep, rest = queue.partition(f"/{SUBSCRIPTIONS}")
    return (topic, rest) if sep else (queue, None)


def validate_queue(queue: object, what: str = "topic name") -> str:
    """Return ``queue`` if it is a topic name or a subscription's queue, else raise."""
    if isinstance(queue, str) and f"/{SUBSCRIPTIONS}" in queue:
        topic, subscription = split_queue(queue)
        validate_name(topic, what)
        validate_name(subscription, "subscription name")
        return queue
    return validate_name(queue, what)


RETAINED = "retained"


def retained_log(topic: str) -> str:
    """The replay log of a topic, written like a queue (``{topic}/retained/messages/``) and
    never consumed: ``seek`` copies from it."""
    return f"{topic}/{RETAINED}"


def is_retained_log(queue: str) -> bool:
    return queue.endswith(f"/{RETAINED}") and "/" not in queue[: -len(RETAINED) - 1]


def replayed_key(
    key: str, queue: str, at: datetime, *, delayed: bool, object_id: str, priority: int = 0
) -> str:
    """The key in ``queue`` of a copy of the replay log's object at ``key``: the same kind,
    named ``object_id`` (a message keeps its id; a batch object gets a new one), visible
    from ``at``, in the band of ``priority`` (not a group's). Never the key a copy had
    before, so no lease or settlement of an earlier copy applies to it."""
    name = unbanded(key.rsplit("/", 1)[-1])
    tail = name[STAMP_LENGTH:].removeprefix(DELAYED_MARK)  # "-{id}.json", "-{id}.{g}.group"
    old_id = tail[1:37]
    mark = "" if name.endswith(GROUP_SUFFIX) else band(priority)
    return (
        f"{messages_prefix(queue)}{mark}{stamp(at, delayed)}-{object_id}{tail[1 + len(old_id) :]}"
    )


def messages_from(queue: str, since: datetime, priority: int = 9) -> str:
    """A ``start_after`` for ``queue``'s messages that lists those of ``priority``'s band
    due from ``since`` on (then the lower bands', from their start)."""
    return f"{messages_prefix(queue)}{band(priority)}{stamp(since, False)}"


def band_from(key: str, since: datetime) -> str:
    """A ``start_after`` that lists the band of the message at ``key`` from ``since`` on."""
    return f"{messages_prefix(queue_of(key))}{band_of(key)}{stamp(since, False)}"


def after_band(key: str) -> str | None:
    """A ``start_after`` that skips the rest of the band of the message at ``key``; None
    for priority 0's, which is listed last."""
    mark = band_of(key)
    return f"{messages_prefix(queue_of(key))}!{int(mark[1]) + 1}" if mark else None


def retained_from(topic: str, since: datetime) -> str:
    """A ``start_after`` for the replay log that lists the messages due from ``since`` on
    (the log's keys have no band: it keeps publish order)."""
    return messages_from(retained_log(topic), since, 0)


def queue_of(key: str) -> str:
    """The queue a key under ``{queue}/`` belongs to (a message, lease, dead letter...)."""
    topic, _, rest = key.partition("/")
    if rest.startswith(SUBSCRIPTIONS):
        name = rest[len(SUBSCRIPTIONS) :].partition("/")[0]
        return subscription_queue(topic, name)
    if rest.startswith(f"{RETAINED}/"):
        return retained_log(topic)
    return topic


def in_queue(key: str, queue: str) -> str:
    """``key`` (a key of some queue) as the same object of ``queue``: a message's copy. In
    the replay log with no band: the log keeps publish order, whatever the priority."""
    rest = key[len(queue_of(key)) + 1 :]
    if is_retained_log(queue) and rest.startswith(MESSAGES):
        rest = MESSAGES + unbanded(rest[len(MESSAGES) :])
    return f"{queue}/{rest}"


def topic_marker_key(topic: str) -> str:
    return f"{topic}/{TOPIC_MARKER}"


def messages_prefix(topic: str) -> str:
    return f"{topic}/{MESSAGES}"


def message_key(
    topic: str,
    message_id: str,
    at: datetime,
    *,
    batch: bool = False,
    delayed: bool = False,
    priority: int = 0,
    run: int | None = None,
) -> str:
    """The key of a message (or of a batch object); the UTC timestamp first makes listing
    order FIFO, and a ``priority`` (1 to 9) puts it in its band, listed first. ``at`` is
    when the message becomes visible: publish time, or its due time for a ``delayed`` one,
    whose timestamp is marked so that no consumer takes it early (see
    :func:`visible_from`). Batch objects end in ``.batch``, messages of the second's run
    number ``run`` in ``.run`` (``.{run}.run`` past the first): pawn-queue 0.1.x and 0.2.0
    skip both. The replay log's keys have no band (:func:`in_queue`)."""
    suffix = BATCH_SUFFIX if batch else MESSAGE_SUFFIX if run is None else run_suffix(run)
    mark = "" if is_retained_log(topic) else band(priority)
    return f"{topic}/{MESSAGES}{mark}{stamp(at, delayed)}-{message_id}{suffix}"


def visible_from(key: str, skew_margin: timedelta) -> datetime | None:
    """When a consumer may take the message at ``key``: at its due time if it was delayed
    (never early: rule 9 of docs/protocol.md), else ``skew_margin`` before its timestamp, so
    a producer whose clock runs ahead does not hide its messages."""
    due = due_from_key(key)
    if due is None or is_delayed_key(key):
        return due
    return due - skew_margin


def parse_pending_key(key: str) -> PendingKey | None:
    """The message, batch, run or group message at ``key``; None for anything else
    (including keys nested deeper than ``{topic}/messages/``, which listings also return)."""
    parent, _, name = key.rpartition("/")
    if f"{parent}/" != messages_prefix(queue_of(key)) or not parent.partition("/")[0]:
        return None
    return pending_of_name(name)


def group_hash(group: str) -> str:
    """A fixed-length name for a message group (any string is a valid group)."""
    return hashlib.sha256(group.encode()).hexdigest()[:32]


def group_message_key(
    topic: str, message_id: str, at: datetime, group: str, *, delayed: bool = False
) -> str:
    """A message of a group: FIFO like any message, and the group in its name, so a
    listing tells the groups apart without reading bodies. No band, whatever its priority:
    the order inside a group wins (the first listed is the group's head). 0.1.x skips the
    suffix."""
    at_stamp = stamp(at, delayed)
    return f"{topic}/{MESSAGES}{at_stamp}-{message_id}.{group_hash(group)}{GROUP_SUFFIX}"


def dedup_key(topic: str, dedup_id: str) -> str:
    """Where a ``dedup_id`` is remembered (hashed: any string is a valid id)."""
    digest = hashlib.sha256(dedup_id.encode()).hexdigest()[:40]
    return f"{topic}/{DEDUP}{digest}.json"


def leases_prefix(topic: str) -> str:
    return f"{topic}/{LEASES}"


def dedup_prefix(topic: str) -> str:
    return f"{topic}/{DEDUP}"


def lease_key(topic: str, message_id: str) -> str:
    return f"{topic}/{LEASES}{message_id}{LEASE_SUFFIX}"


def lease_id_of(key: str) -> str:
    """The lease id (a message id, or ``g`` and a group hash) of a key under ``{topic}/leases/``."""
    return key.rsplit("/", 1)[-1].removesuffix(LEASE_SUFFIX)


def dead_letter_prefix(topic: str) -> str:
    return f"{topic}/{DEAD_LETTER}"


def dead_letter_key(topic: str, message_id: str) -> str:
    return f"{topic}/{DEAD_LETTER}{message_id}.json"


def registry_prefix(role: Role) -> str:
    return f"{REGISTRY}{role}/"


def registry_key(role: Role, entity_id: str) -> str:
    return f"{REGISTRY}{role}/{entity_id}.json"


def registry_name_key(role: Role, name: str) -> str:
    return f"{REGISTRY}names/{role}/{name}.json"


INSTANCES = f"{REGISTRY}instances/"


def instance_key(instance_id: str) -> str:
    """A process's record: its host, pid, start, last heartbeat and what it registered."""
    return f"{INSTANCES}{instance_id}.json"


NOTIFY = "_notify/"
NOTIFY_ROOT = "_notify/_"  # 0.2.0's root signal (written with notify.slot_signals only)
NOTIFY_RING_SIZE = 16  # keys of the signal ring (signal_ring.py), fixed by the protocol


def notify_ring_key(seq: int) -> str:
    """The key that holds version ``seq`` of the signal log."""
    return f"{NOTIFY}r{seq % NOTIFY_RING_SIZE:02d}"


def is_notify_ring_key(key: str) -> bool:
    return key.startswith(f"{NOTIFY}r") and key[len(NOTIFY) + 1 :].isdigit()


LISTENERS_CHANGED = "_listeners"
"""Not a topic (topic names never start with ``_``): a change signal for it says that a
``listen()`` started or ended somewhere, so the shares' views are read again."""
PAUSES_CHANGED = "_pauses"
"""Not a topic either: a change signal for it says that a subscriber was paused somewhere
(``RateLimited``), so the pauses known are read again."""
NOTIFY_SLOTS = 1000  # fixed by the protocol; one LIST page (LIST_PAGE) holds every slot


def notify_slot_key(topic: str) -> str:
    """The change-signal slot of a topic: a fixed keyspace, so one LIST sees every topic."""
    digest = hashlib.blake2b(topic.encode(), digest_size=8).digest()
    return f"{NOTIFY}{int.from_bytes(digest, 'little') % NOTIFY_SLOTS:03d}"


PROBE_RESULT = f"{PROBE}result.json"
"""The last probe's answer: the processes that start within a day read it, not probe."""


def probe_key(probe_id: str) -> str:
    return f"{PROBE}{probe_id}.probe"


def topic_from_marker_key(key: str) -> str | None:
    """The topic a marker key belongs to, or None."""
    topic, sep, rest = key.partition("/")
    return (
        topic if sep and rest == TOPIC_MARKER and not topic.startswith(RESERVED_PREFIXES) else None
    )


def after_subtree(segment: str) -> str:
    """A ``start_after`` value that skips every key under ``segment/``: ``0`` is the character
    right after ``/``, so ``segment0`` sorts after all of ``segment/...``."""
    return f"{segment}0"


# -- Spark (pawn_queue.spark) ---------------------------------------------------------------

SPARK = "_spark/"


def spark_manifests_prefix(query: str) -> str:
    """Where a streaming query keeps the manifest of each micro-batch it claimed."""
    return f"{SPARK}{query}/batches/"


def spark_manifest_key(query: str, batch: int) -> str:
    """The manifest of micro-batch ``batch``: the objects it owns (JSON)."""
    return f"{SPARK}{query}/batches/{batch}.json"


def spark_manifest_batch(key: str) -> int | None:
    """The micro-batch number of a manifest key, None for anything else."""
    name = key.rsplit("/", 1)[-1]
    stem = name.removesuffix(MESSAGE_SUFFIX)
    return int(stem) if stem != name and stem.isdigit() else None


def spark_sink_key(query: str, batch: int) -> str:
    """A streaming write's micro-batch marker: its message time, and whether it committed."""
    return f"{SPARK}{query}/sink/{batch}.json"


# -- schedules (pawn_queue.schedules) -------------------------------------------------------

SCHEDULES = "_schedules/"
# Ticks lie apart from the definitions: the runners' frequent LIST of definitions never
# pages through tick markers.
SCHEDULE_TICKS = "_schedule_ticks/"


def schedule_key(name: str) -> str:
    return f"{SCHEDULES}{name}{MESSAGE_SUFFIX}"


def schedule_ticks_prefix(name: str) -> str:
    return f"{SCHEDULE_TICKS}{name}/"


def schedule_tick_key(name: str, tick: datetime) -> str:
    """A tick's marker, named by its scheduled UTC time (``20261202T010000_000000Z``)."""
    return f"{SCHEDULE_TICKS}{name}/{stamp(tick, False)}Z"


def tick_of(key: str) -> datetime | None:
    """The tick a marker key names, None for any other key."""
    return due_from_key(key) if key.endswith("Z") else None


LIMITS = "_limits/"
RATES = "_rates/"
PAUSES = "_pauses/"


def limit_slot_key(name: str, slot: int) -> str:
    """Slot ``slot`` (0 to limit - 1) of the concurrency limit ``name`` (pawn_queue.limits)."""
    return f"{LIMITS}{name}/{slot}{LEASE_SUFFIX}"


def limit_slot_of(key: str) -> tuple[str, int] | None:
    """The concurrency limit and slot a ``_limits/`` key is of; None for another key."""
    name, _, last = key.removeprefix(LIMITS).rpartition("/")
    slot = last.removesuffix(LEASE_SUFFIX)
    if not key.startswith(LIMITS) or not name or not last.endswith(LEASE_SUFFIX):
        return None
    return (name, int(slot)) if slot.isdigit() else None


def rate_name_of(key: str) -> str | None:
    """The rate limit a ``_rates/`` ring key is of; None for another key."""
    name, _, last = key.removeprefix(RATES).rpartition("/")
    ring = last.removesuffix(MESSAGE_SUFFIX)
    ok = key.startswith(RATES) and name and last.endswith(MESSAGE_SUFFIX) and ring.isdigit()
    return name if ok else None


def pause_name_of(key: str) -> str | None:
    """The subscriber a ``_pauses/`` key pauses; None for another key."""
    name = key.removeprefix(PAUSES).removesuffix(MESSAGE_SUFFIX)
    return name if key.startswith(PAUSES) and key.endswith(MESSAGE_SUFFIX) and name else None


def rate_chunk_key(name: str, ring: int) -> str:
    """Key ``ring`` of the rate limit ``name``'s ring of chunks (pawn_queue._protocol.rates)."""
    return f"{RATES}{name}/{ring}{MESSAGE_SUFFIX}"


def pause_key(name: str) -> str:
    """The pause of the subscriber ``name`` names (pawn_queue._protocol.pauses)."""
    return f"{PAUSES}{name}{MESSAGE_SUFFIX}"


def subscriber_limit_name(topics: Sequence[str], subscription: str | None) -> str:
    """The name of the limits a subscriber's ``max_in_flight`` and ``rate_limit`` set: one
    per topic set or subscription, shared by every process that reads it; reserved (``_``),
    so no name of ``concurrency_limit`` or ``rate_limit`` meets it."""
    if subscription is not None:
        return f"_subscription/{topics[0]}/{subscription}"
    return "_topics/" + "/".join(sorted(set(topics)))
