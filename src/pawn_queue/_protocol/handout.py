"""Handout: how a listener hands out a batch object's members, and when their acks are written.

A batch member's ``ack()`` returns once a lease write lists it (rule 13), and the acks made
while a write is in flight share the next one. ``listen()`` hands out a poll at a time, so
without more, an object of 32 members costs three lease writes at 10 messages per poll.

Two things let the acks of one object share a write, or need none:

- A listener moves on to its next poll once every handler of the current one returned or
  waits only for such a write (:meth:`Handout.until_settling`), rather than for the writes
  themselves; with ``concurrency``, such a handler frees its slot.
- A write for an object whose other members are still unsettled (kept for the next polls,
  or handed out and not yet handled) waits for the rounds that settle them,
  :data:`LINGER_SECONDS` at most. When the last member is settled meanwhile, the object's
  delete makes every ack durable and no lease write is made.
- A poll that hands out kept members claims nothing more: the claim (a request, slow on a
  busy store) waits for the poll after, so it does not outlast that wait.

With :meth:`~pawn_queue.consumer.Consumer.poll` (the caller decides when to poll again), or
no member left to settle, a write starts a loop turn after it is asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

LINGER_SECONDS = 0.02  # the longest a member-ack write waits for its object's other acks


class Handout:
    """One consumer's listener, as the member-ack writes of its objects see it."""

    def __init__(self) -> None:
        self._listening = False
        self._round = asyncio.Event()  # set when a round settles or the listener stops
        # Done when a handler finishes or begins waiting for a write (the listener waits).
        self._progress: asyncio.Future[None] | None = None

    def start(self) -> None:
        """A listener hands out polls from now on."""
        self._listening = True

    def stop(self) -> None:
        """The listener stopped: writes held for it go out now."""
        self._listening = False
        self.round_settled()

    def round_settled(self) -> None:
        """Every message of the poll handed out last is settling or done."""
        self._round.set()
        self._round = asyncio.Event()

    def progressed(self) -> None:
        """A handler finished, or now waits only for a member-ack write."""
        progress, self._progress = self._progress, None
        if progress is not None and not progress.done():
            progress.set_result(None)

    async def hold(self, pending: Callable[[], bool]) -> None:
        """Before a member-ack write: while members of the same object are still to be
        settled (``pending``), wait for the rounds that settle them, :data:`LINGER_SECONDS`
        at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER_SECONDS
        while self._listening and pending():
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._round.wait(), left)
            except TimeoutError:
                return

    async def until_settling(
        self,
        tasks: Sequence[asyncio.Task[None]],
        settling: Sequence[Callable[[], bool]],
        free: int | None = None,
    ) -> None:
        """Return once each of ``tasks`` (or ``free`` of them) is done or its ``settling``
        check is true: its message waits only for the write that makes its ack durable. The
        listener's own: it hears of each change through :meth:`progressed`."""
        wanted = len(tasks) if free is None else free
        while True:
            busy = sum(
                1 for t, check in zip(tasks, settling, strict=True) if not (t.done() or check())
            )
            if len(tasks) - busy >= wanted:
                return
            if self._progress is None or self._progress.done():
                self._progress = asyncio.get_running_loop().create_future()
            await self._progress
