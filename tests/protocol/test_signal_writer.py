"""How producers of several processes share the signal log (docs/protocol.md, "Request
rates"): a writer that waited on another process's version reads on along the ring before
it writes, so a version written meanwhile that signals its topics spares it a refused
PUT."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pawn_queue._protocol import layout
from pawn_queue._protocol.signal_ring import SignalRing
from pawn_queue._protocol.signal_writer import SignalWriter
from pawn_queue.store.counting import CountingStore
from pawn_queue.store.memory import MemoryStore
from pawn_queue.store.wrapper import StoreCall
from tests.helpers.support import latest_signal_log

T = TypeVar("T")
INTERVAL = 0.1  # the default: not "late" (below two check intervals), no busy re-read


class Reads(CountingStore):
    """Counts requests, and says when the first GET returned."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.read = asyncio.Event()

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        result = await super().around(call, run)
        if call.operation == "get":
            self.read.set()
        return result


async def test_a_writer_waiting_on_another_s_version_reads_before_it_writes() -> None:
    shared = MemoryStore()
    a_store, b_store = CountingStore(shared), Reads(shared)
    a = SignalWriter(a_store, SignalRing(a_store), INTERVAL, 0.1, slots=False)
    b = SignalWriter(b_store, SignalRing(b_store), INTERVAL, 0.1, slots=False)
    await a.signal({"orders": None})  # version 1, A's
    b_store.reset()
    # B's messages landed: it reads version 1 (A's, just written) and waits for it to be
    # an interval old. Meanwhile A signals the same topic again (a closing process).
    waiting = asyncio.create_task(b.signal({"orders": frozenset({"b.json"})}))
    async with asyncio.timeout(5):
        await b_store.read.wait()
    await a.signal({"orders": None}, at_once=True)  # version 2, written after B's read
    await waiting
    # Version 2 signals B's topic (written after B's messages landed): B read on along the
    # ring to it (the first later version: no read beyond) and wrote nothing; without that
    # read, B's PUT of version 2 is refused, then B reads. Before: the ring's 16 keys.
    assert b_store.counts == {"GET": layout.NOTIFY_RING_SIZE + 1}
    root = await latest_signal_log(shared)
    assert root is not None and root.seq == 2
