"""Helpers shared by test modules."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from pawn_queue import Consumer, Message, PawnQueue
from pawn_queue._protocol.signal_log import SignalLog
from pawn_queue._protocol.signal_ring import SignalRing
from pawn_queue.exceptions import StoreUnavailableError
from pawn_queue.store.base import Store

ACK_ATTEMPTS = 3


async def settled(pq: PawnQueue) -> None:
    """Wait for the deletes that follow acks (leases; a finished batch object): they run
    after ``ack()`` returned. The leases kept as tombstones (S3) are deleted now. Then for
    the change signals still to be written (a nack's dead letter signals its queue)."""
    await pq.runtime.leases.flush_tombstones()  # with the rest of the background work
    await pq.runtime.signals.marked()


@contextlib.asynccontextmanager
async def acking(*consumers: Consumer) -> AsyncIterator[asyncio.Queue[str]]:
    """``consumers`` listening, their handler acking each message: the ids acked, in order.
    The listeners must still run at the end (they raised nothing)."""
    acked: asyncio.Queue[str] = asyncio.Queue()

    async def handler(message: Message) -> None:
        await message.ack()
        await acked.put(message.id)

    listening = [asyncio.create_task(c.listen(handler)) for c in consumers]
    try:
        yield acked
        assert not any(task.done() for task in listening)
    finally:
        for task in listening:
            task.cancel()
        await asyncio.gather(*listening, return_exceptions=True)


async def latest_signal_log(store: Store) -> SignalLog | None:
    """The latest version of the signal log in the store's ring (None: none yet)."""
    latest, _ = await SignalRing(store).discover()
    return latest.log


async def keys_under(pq: PawnQueue, prefix: str) -> list[str]:
    """The keys under ``prefix`` once the deletes that follow past acks landed."""
    await settled(pq)
    return [m.key for m in await pq.store.list(prefix)]


async def poll_count(consumer: Consumer, count: int) -> list[Message]:
    """Poll until at least ``count`` messages came (TimeoutError after 60 s). One poll may
    return fewer than are there: on a loaded machine a lease it could not check in time
    waits in the consumer for its next poll (docs/protocol.md, rule 11)."""
    messages: list[Message] = []
    async with asyncio.timeout(60):
        while len(messages) < count:
            messages += await consumer.poll(wait=1)
    return messages


async def ack_patiently(message: Message) -> None:
    """``ack()``, again after a StoreUnavailableError, as a consumer does when the store was
    slow to answer (a lease write is given up at its bound, its outcome unknown; ack is
    idempotent). A loaded test machine makes a server that slow now and then."""
    for attempt in range(1, ACK_ATTEMPTS + 1):
        try:
            await message.ack()
            return
        except StoreUnavailableError:
            if attempt == ACK_ATTEMPTS:
                raise


def sigkill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL an asyncio child without reaping it. ``Process.kill()`` first polls the child,
    which reaps one that just exited on its own (a worker that kills itself): asyncio's
    watcher then finds it gone and reports exit code 255."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)


async def start_schedule_runner(config: str) -> asyncio.subprocess.Process:
    """``tests/workers/schedule_worker.py`` on the queue ``config`` (JSON) describes, once it
    said it is ready."""
    worker = Path(__file__).parents[1] / "workers" / "schedule_worker.py"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(worker), config, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
    return process


def leftover_temp_files(root: Path) -> list[Path]:
    """The filesystem store's temp files under ``root`` (none once writes are over)."""
    return list((root / ".pawnqueue" / "tmp").iterdir())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)
