"""``pawn-queue worker --processes N``: N worker processes, each restarted if it dies.

The supervisor runs no handler. Each child is ``pawn-queue worker`` with ``--processes 1``
in its own session (a terminal's Ctrl-C reaches the supervisor only, which passes it on
once). A signal to the supervisor is passed to every child: the first stops them cleanly,
a second cuts their grace short. A child that dies otherwise (``kill -9``, a crash) is
started again after a backoff; its messages come back when their leases expire. A child
that keeps dying within seconds of its start makes the supervisor give up (exit code 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable

from pawn_queue.service.runner import EXIT_FAILED, EXIT_FORCED, EXIT_STOPPED

logger = logging.getLogger("pawn_queue.worker")

_BACKOFF_FIRST = 0.5  # seconds before restarting a child that died
_BACKOFF_MAX = 30.0
_STABLE_SECONDS = 30.0  # a child that lived this long starts its backoff afresh
_QUICK_DEATHS = 5  # deaths in a row, each before _STABLE_SECONDS, before giving up


def supervise(command_of: Callable[[int], list[str]], processes: int) -> int:
    """Run ``processes`` children (``command_of(index)`` is child ``index``'s command line)
    until a signal; return the exit code."""
    return asyncio.run(_Supervisor(command_of, processes).run())


class _Supervisor:
    def __init__(self, command_of: Callable[[int], list[str]], processes: int) -> None:
        self._command_of = command_of
        self._processes = processes
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()
        self._signals = 0
        self._gave_up = False

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signal.Signals(signum).name)
        logger.info("supervisor started processes=%d", self._processes)
        codes = await asyncio.gather(*(self._keep(i) for i in range(self._processes)))
        if self._gave_up or any(code not in (EXIT_STOPPED, EXIT_FORCED) for code in codes):
            code = EXIT_FAILED
        elif self._signals > 1 or EXIT_FORCED in codes:
            code = EXIT_FORCED
        else:
            code = EXIT_STOPPED
        logger.info("supervisor stopped exit=%d children=%s", code, codes)
        return code

    def _on_signal(self, name: str) -> None:
        self._signals += 1
        logger.info("supervisor got %s: stopping %d children", name, len(self._children))
        self._stop_all()

    def _stop_all(self) -> None:
        self._stopping.set()
        for child in self._children.values():
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)

    async def _keep(self, index: int) -> int:
        """Keep child ``index`` running until stopped; its last exit code."""
        deaths = 0
        while True:
            started = time.monotonic()
            child = await asyncio.create_subprocess_exec(
                *self._command_of(index), start_new_session=True
            )
            self._children[index] = child
            if self._stopping.is_set():  # a signal came while it started
                child.send_signal(signal.SIGTERM)
            code = await child.wait()
            if self._stopping.is_set():
                return code
            lived = time.monotonic() - started
            deaths = 1 if lived >= _STABLE_SECONDS else deaths + 1
            if deaths >= _QUICK_DEATHS:
                logger.error(
                    "child %d keeps dying (exit %d, %d times in a row): giving up",
                    index,
                    code,
                    deaths,
                )
                self._gave_up = True
                self._stop_all()
                return code
            delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** (deaths - 1))
            logger.warning(
                "child %d (pid %d) exited with %d after %.1f s: restarting in %.1f s",
                index,
                child.pid,
                code,
                lived,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return EXIT_STOPPED
