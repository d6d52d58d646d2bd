"""The app ``tests/cli/test_worker.py`` runs with ``pawn-queue worker``.

Each handler prints ``start|done <id> <seq> <receive_count> <pid>`` on stdout (one short
line, flushed: the test reads them as they come) around ``job.sleep`` seconds of waiting
and ``job.spin`` seconds of pure-Python work, counted in ``job.counter``
(tests/workers/counter.py) if given. The store comes from the worker's ``--url``
or ``--config``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from pawn_queue import App, Message
from tests.workers.counter import count

app = App(name="svc")


class Job(BaseModel):
    seq: int
    sleep: float = 0.0
    spin: float = 0.0
    counter: str | None = None  # a file counting the handlers running in every process


def say(event: str, job: Job, message: Message) -> None:
    line = f"{event} {message.id} {job.seq} {message.receive_count} {os.getpid()}\n"
    sys.stdout.write(line)
    sys.stdout.flush()


@app.subscriber("jobs", retry=None)
async def work(job: Job, message: Message) -> None:
    say("start", job, message)
    if job.counter:
        count(Path(job.counter), +1)
    if job.sleep:
        await asyncio.sleep(job.sleep)
    deadline = time.perf_counter() + job.spin
    while time.perf_counter() < deadline:
        pass
    if job.counter:
        count(Path(job.counter), -1)
    say("done", job, message)


def noop(payload: object) -> None:
    """A handler run as ``module:function`` (the benchmark's)."""


def written_for_listen(msg):  # type: ignore[no-untyped-def]
    """A handler written for ``listen()``: unannotated, it gets the payload in a worker."""
    return msg.id
