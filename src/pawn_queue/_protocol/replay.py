"""The replay log: every message of a topic with a replay window, kept for ``seek``.

A topic with ``replay_window_seconds`` > 0 gets one more copy of each message, written by
its producers like any copy (group commit included) into ``{topic}/retained/messages/``,
which nobody consumes. :func:`copy_retained` copies from it into a subscription's queue:
the messages due from a time on, as its filter takes them, under new keys (the leases and
settlements of their earlier copies, kept a while, must not apply to them). What is older
than the window is deleted by :mod:`pawn_queue._protocol.retained`. docs/protocol.md,
"Replay".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Literal

from pawn_queue._internal.aio import IO_CONCURRENCY, gather_limited
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import CorruptObject, Envelope, decode_batch, encode_batch
from pawn_queue._protocol.filters import Filter, parse_filter
from pawn_queue._protocol.landing import write_new
from pawn_queue._protocol.runtime import Runtime
from pawn_queue._protocol.subscriptions import Subscription
from pawn_queue.exceptions import NotFound, ReplayUnavailableError
from pawn_queue.store.base import LIST_PAGE, ObjectMeta

logger = logging.getLogger(__name__)


async def seek(
    runtime: Runtime,
    topic: str,
    name: str,
    since: datetime | Literal["earliest", "latest"],
    *,
    drop: bool,
) -> None:
    """``PawnQueue.seek``: drop what waits in the subscription, then copy what the replay
    log holds from ``since`` on; refused first (:func:`check_replayable`) unless ``drop``."""
    subscription = await runtime.subscriptions.get(topic, name)
    if since != "latest" and not drop:
        await check_replayable(runtime, subscription, since)
    # What the purge could delete was published before it ended: it is copied again.
    await runtime.topics.purge(subscription.queue)
    runtime.leases.forget_queue(subscription.queue)
    if since != "latest":
        await replay(runtime, subscription, since)


async def check_replayable(
    runtime: Runtime, subscription: Subscription, since: datetime | Literal["earliest"]
) -> None:
    """Raise ReplayUnavailableError if seeking ``subscription`` to ``since`` would drop a
    message that waits in it and that the replay log cannot bring back: the topic keeps no
    log, ``since`` is before its window, or a message due from ``since`` on is older than
    the log's oldest entry (published before the window was given, or past it). Two LISTs
    of one key each, besides the topic's settings."""
    topic, queue = subscription.topic, subscription.queue
    window = (await runtime.topics.settings(topic, fresh=True)).replay_window_seconds
    how = (
        "drop=True (or --drop) drops what waits all the same; update_topic(..., "
        "replay_window_seconds=...) keeps the messages published from then on"
    )
    if not window:
        raise ReplayUnavailableError(
            f"topic {topic!r} keeps no history (replay_window_seconds=0): seeking "
            f"subscription {subscription.name!r} to {since} would drop what waits in it and "
            f"bring nothing back; {how}"
        )
    kept_from = runtime.clock() - timedelta(seconds=window)
    if since != "earliest" and since < kept_from:
        raise ReplayUnavailableError(
            f"topic {topic!r} keeps messages {window:g} s (replay_window_seconds): "
            f"{since.isoformat()} is before {kept_from.isoformat()}; seek to 'earliest' for "
            f"what it keeps, or {how}"
        )
    waiting = await _first_waiting(runtime, queue, None if since == "earliest" else since)
    if waiting is None:
        return
    log = layout.messages_prefix(layout.retained_log(topic))
    logged = _first_due(await runtime.store.list(log, limit=1))
    if logged is None or waiting < logged:
        older = await _count_due_before(runtime, queue, since, logged)
        plural = "message" if older == 1 else "messages"
        raise ReplayUnavailableError(
            f"subscription {subscription.name!r} of topic {topic!r} holds {older} {plural} "
            f"published before the oldest one its replay log keeps: seeking to {since} would "
            f"drop them; seek to a later time, or {how}"
        )


def _first_due(page: list[ObjectMeta]) -> datetime | None:
    return layout.due_from_key(page[0].key) if page else None


async def _due_from(
    runtime: Runtime,
    queue: str,
    since: datetime | None,
    *,
    before: datetime | None = None,
    heads: bool = False,
) -> AsyncIterator[tuple[ObjectMeta, datetime]]:
    """The messages of ``queue`` due from ``since`` on (all: None) and before ``before``
    (if given), with their due times: band by band (priority 9 first), in key order within
    each; with ``heads``, the first of each band only. A band's keys before ``since`` or
    from ``before`` on are skipped with one LIST more (a ``start_after`` past them)."""
    prefix = layout.messages_prefix(queue)
    cursor = None if since is None else layout.messages_from(queue, since)
    limit = 1 if heads else LIST_PAGE
    while page := await runtime.store.list(prefix, start_after=cursor, limit=limit):
        cursor = page[-1].key
        for meta in page:
            due = layout.due_from_key(meta.key)
            if due is None:
                continue
            start = None if since is None else layout.band_from(meta.key, since)
            if start is not None and meta.key < start:
                cursor = start  # due before ``since``: so are the band's keys up to there
                break
            late = before is not None and due >= before
            if late or heads:
                if not late:
                    yield meta, due
                after = layout.after_band(meta.key)
                if after is None:
                    return  # priority 0's band is listed last
                cursor = after
                break
            yield meta, due


async def _first_waiting(runtime: Runtime, queue: str, since: datetime | None) -> datetime | None:
    """When the first message waiting in ``queue`` due from ``since`` on is due: the first
    of each band's (one LIST per band that holds any, two where some are older)."""
    dues = [due async for _, due in _due_from(runtime, queue, since, heads=True)]
    return min(dues, default=None)


async def _count_due_before(
    runtime: Runtime,
    queue: str,
    since: datetime | Literal["earliest"],
    before: datetime | None,
) -> int:
    """How many messages of ``queue`` due from ``since`` on are due before ``before``."""
    start = None if since == "earliest" else since
    return len([m async for m, _ in _due_from(runtime, queue, start, before=before)])


async def replay(
    runtime: Runtime, subscription: Subscription, since: datetime | Literal["earliest"]
) -> None:
    """Deliver to ``subscription`` again what the replay log holds from ``since`` on."""
    # Later publishes (by clocks in agreement) reached the subscription themselves.
    until = runtime.clock() + runtime.leases.margin
    topic, queue = subscription.topic, subscription.queue
    start = None if since == "earliest" else since
    wanted = parse_filter(subscription.filter)
    copied = await copy_retained(runtime, topic, queue, wanted, start, until)
    logger.info(
        "replayed topic=%s subscription=%s since=%s objects=%d",
        topic,
        subscription.name,
        since,
        copied,
    )


async def copy_retained(
    runtime: Runtime,
    topic: str,
    queue: str,
    wanted: Filter,
    since: datetime | None,
    until: datetime,
) -> int:
    """Copy into ``queue`` what the replay log holds from ``since`` on (all of it: None)
    up to ``until`` (and every delayed message not due yet), as ``wanted`` takes it, oldest
    first; return the objects written. Copies get new keys, in the log's order from now on
    (a delayed one keeps its due time); each page's copies are signalled as they land, so
    consumers start at once."""
    log = layout.retained_log(topic)
    prefix = layout.messages_prefix(log)
    cursor = None if since is None else layout.retained_from(topic, since)
    base = runtime.clock()
    copied = position = 0
    landed = False

    def signal() -> None:
        # The first copy wakes the consumers at once; the rest of a page, when it is over.
        nonlocal landed
        if not landed:
            landed = True
            runtime.signals.published(queue)

    while page := await runtime.store.list(prefix, start_after=cursor, limit=LIST_PAGE):
        copies = []
        for meta in page:
            due = layout.due_from_key(meta.key)
            delayed = layout.is_delayed_key(meta.key)
            if due is None or (due > until and not delayed):
                continue
            if delayed and due > base:
                at = due  # never before it is due (rule 9)
            else:
                at, delayed = base + timedelta(microseconds=position), False
                position += 1
            copies.append(_copy(runtime, meta.key, queue, wanted, at, delayed, signal))
        for result in await gather_limited(IO_CONCURRENCY, copies):
            if isinstance(result, BaseException):
                raise result
            copied += result
        if copies:
            runtime.signals.published(queue)
        cursor = page[-1].key
    return copied


async def _copy(
    runtime: Runtime,
    key: str,
    queue: str,
    wanted: Filter,
    at: datetime,
    delayed: bool,
    landed: Callable[[], None],
) -> int:
    pending = layout.parse_pending_key(key)
    if pending is None:
        return 0
    try:
        data = (await runtime.store.get(key)).data
    except NotFound:
        return 0  # past the window, swept meanwhile
    object_id = pending.object_id
    body: bytes | None = data
    priority = 0  # the log's keys have no band: its messages say theirs
    try:
        if pending.kind == "batch":
            object_id = str(uuid.uuid4())
            members = [e for e in decode_batch(data) if wanted.matches(e.attributes)]
            body = encode_batch(object_id, members) if members else None
            priority = members[0].priority if members else 0
        else:
            envelope = Envelope.decode(data)
            priority = envelope.priority
            if wanted.conditions and not wanted.matches(envelope.attributes):
                body = None
    except CorruptObject as exc:
        logger.warning("replay log object unreadable, not copied key=%s error=%s", key, exc)
        return 0
    if body is None:
        return 0
    target = layout.replayed_key(
        key, queue, at, delayed=delayed, object_id=object_id, priority=priority
    )
    await write_new(runtime, target, body)
    landed()
    return 1
