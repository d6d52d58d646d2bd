"""Acking many delivered messages at once (``Consumer.ack_all``, a batch handler's acks):
the members of one object share one lease write, as rule 13 allows for what is settled
together."""

from __future__ import annotations

import asyncio

from pawn_queue._protocol.delivery import ClaimedObject, Message
from pawn_queue.exceptions import LeaseLostError


async def ack_together(messages: list[Message]) -> None:
    """Ack ``messages`` (distinct) at once, as ``ack()`` each would, in as few writes as the
    store allows: the members of one batch object share one lease write (or its delete), and
    no task, lock wait or future is spent per message. A message being settled meanwhile is
    acked on its own. Raises the first error once all are tried; the others stay acked."""
    groups: dict[ClaimedObject, _Group] = {}
    alone: list[Message] = []
    try:
        for message in messages:
            if message._settled:
                continue
            lock = message._lock
            if lock is not None:
                if lock.locked():
                    alone.append(message)
                    continue
                await lock.acquire()  # free: returns at once
                if message._settled:
                    lock.release()
                    continue
            group = groups.get(message._claimed)
            if group is None:
                group = groups[message._claimed] = _Group()
            await group.add(message, lock)
    except BaseException:  # cancelled while a lock had waiters: give back what was taken
        for group in groups.values():
            group.release()
        raise
    work = [_ack_members(claimed, group) for claimed, group in groups.items()]
    work += [m.ack() for m in alone]
    if len(work) == 1:
        await work[0]
        return
    for result in await asyncio.gather(*work, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


class _Group:
    """Members of one object that ack_together settles, and the locks it holds for them: a
    message's own lock if it had one (taken), else one lock the group makes and shares."""

    __slots__ = ("locks", "members", "shared")

    def __init__(self) -> None:
        self.members: list[Message] = []
        self.locks: list[asyncio.Lock] = []
        self.shared: asyncio.Lock | None = None

    async def add(self, message: Message, lock: asyncio.Lock | None) -> None:
        if lock is None:
            lock = self.shared
            if lock is None:
                lock = self.shared = asyncio.Lock()
                await lock.acquire()  # free: returns at once
                self.locks.append(lock)
            message._lock = lock
        else:
            self.locks.append(lock)
        self.members.append(message)

    def release(self) -> None:
        for lock in self.locks:
            lock.release()


async def _ack_members(claimed: ClaimedObject, group: _Group) -> None:
    """Ack the members of ``claimed`` in ``group``, then release the group's locks. Each
    group releases its own as soon as its write is over, so two calls that share messages
    never wait on each other."""
    members = group.members
    try:
        await claimed.ensure_held()
        await claimed.settle_acked([m._index for m in members])
    except BaseException as exc:
        for message in members:  # as _Settling does after a failed settlement
            claimed.abandon(message._index)
            if isinstance(exc, LeaseLostError) and claimed.observers:
                claimed.observers.lease_lost(message)
        raise
    else:
        for message in members:
            message._settled = True
    finally:
        group.release()
    observers = claimed.observers
    if observers:
        for message in members:
            observers.settled(message, "ack", None)
