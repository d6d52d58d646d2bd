"""A worker process for ``tests/test_concurrency_limit_processes.py``.

``python tests/workers/limit_worker.py work CONFIG NAME LIMIT TASKS ITEMS COUNTER``: opens the
queue of CONFIG (JSON), runs TASKS tasks that each run ITEMS blocks under
``concurrency_limit(NAME, LIMIT)``, counting the blocks running in every process in the
COUNTER file (tests/workers/counter.py), and exits 0.

``python tests/workers/limit_worker.py hold CONFIG NAME LIMIT``: takes a slot, prints
``holding {slot}`` and keeps it until killed.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # run as a script: the repository's root

from pawn_queue import PawnQueue
from tests.workers.counter import count


async def work(pq: PawnQueue, name: str, limit: int, items: int, counter: Path) -> None:
    for _ in range(items):
        async with pq.concurrency_limit(name, limit, timeout=120):
            count(counter, +1)
            await asyncio.sleep(random.uniform(0.05, 0.15))  # the work
            count(counter, -1)


async def main(argv: list[str]) -> None:
    mode, config, name, limit = argv[0], json.loads(argv[1]), argv[2], int(argv[3])
    async with PawnQueue.from_config(config) as pq:
        if mode == "hold":
            async with pq.concurrency_limit(name, limit) as slot:
                print("holding", slot.slot, flush=True)
                await asyncio.Event().wait()
        tasks, items, counter = int(argv[4]), int(argv[5]), Path(argv[6])
        await asyncio.gather(*(work(pq, name, limit, items, counter) for _ in range(tasks)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
