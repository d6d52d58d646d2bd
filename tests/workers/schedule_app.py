"""The app ``tests/cli/test_worker_schedules.py`` runs with ``pawn-queue worker``.

It declares the schedule ``every-second`` (``every=1`` to the topic ``ticks``), and its
handler of that topic prints ``tick <schedule_time> <pid>`` on stdout for each tick (one
line, flushed: the test reads them as they come). The store comes from the worker's
``--url``.
"""

from __future__ import annotations

import os
import sys

from pawn_queue import App, Message

app = App(name="clock")


@app.schedule("every-second", topic="ticks", every=1)
async def tick(payload: object, message: Message) -> None:
    sys.stdout.write(f"tick {message.attributes['schedule_time']} {os.getpid()}\n")
    sys.stdout.flush()
