"""A schedule runner for ``tests/test_schedules.py``, which runs three of them at once.

Run as ``python tests/workers/schedule_worker.py URL``: opens the queue at URL, prints
``ready`` and runs every schedule until it is terminated.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # run as a script: the repository's root

from pawn_queue import PawnQueue


async def main(url: str) -> None:
    async with PawnQueue.from_url(url) as pq:
        print("ready", flush=True)
        await pq.run_schedules()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
