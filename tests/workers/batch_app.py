"""A batch subscriber ``tests/cli/test_worker_batch.py`` runs with ``pawn-queue worker``.

Each call prints ``batch <pid> <id> <id> ...`` on stdout (one flushed line per batch: the
test reads them as they come) and returns one result per job, published to ``done``. The
store comes from the worker's ``--url``.
"""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel

from pawn_queue import App, Message

app = App(name="batches")


class Job(BaseModel):
    seq: int


@app.subscriber("jobs", batch=50, batch_wait=0.2, retry=None, publish_to="done")
async def work(jobs: list[Job], messages: list[Message]) -> list[dict[str, int]]:
    sys.stdout.write(f"batch {os.getpid()} {' '.join(m.id for m in messages)}\n")
    sys.stdout.flush()
    return [{"seq": job.seq} for job in jobs]


def plain(payloads: list[dict[str, int]]) -> None:
    """A module:function batch handler (``--batch``), run in a thread."""
    sys.stdout.write(f"plain {os.getpid()} {' '.join(str(p['seq']) for p in payloads)}\n")
    sys.stdout.flush()
