"""A schedule runner for the tests that run several of them at once (tests/helpers/support.py
``start_schedule_runner``).

Run as ``python tests/workers/schedule_worker.py CONFIG``: opens the queue CONFIG (JSON)
describes, prints ``ready`` and runs every schedule until it is terminated.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # run as a script: the repository's root

from pawn_queue import PawnQueue


async def main(config: str) -> None:
    async with PawnQueue.from_config(json.loads(config)) as pq:
        print("ready", flush=True)
        await pq.run_schedules()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
