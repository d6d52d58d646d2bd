"""An event loop in a daemon thread, running coroutines for other threads: what the blocking
API (:mod:`pawn_queue.sync`) is built on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, Generic, TypeVar

from pawn_queue.exceptions import PawnQueueError

T = TypeVar("T")

CLOSED = "this PawnQueue is closed; create a new one"


class Call(Generic[T]):
    """One coroutine submitted to the loop: its task (set on the loop) and its outcome."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.task: asyncio.Task[T] | None = None
        self._stop_asked = False  # touched on the loop thread only

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def cancel_once(self) -> None:
        """Cancel, unless this was asked before: a graceful stop asked twice (by a handler
        that sets its listener's stop event, and by the thread that waits on that event) is
        one cancel, where a second would cut the listener's grace short."""
        if not self._stop_asked:
            self._stop_asked = True
            self.cancel()


class LoopThread:
    """An event loop in a daemon thread, started on first use, running other threads' calls."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._calls: set[asyncio.Task[Any]] = set()  # touched on the loop thread only
        self.closed = False

    def check_thread(self) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise PawnQueueError(
                "blocking pawn-queue call on its own event-loop thread would deadlock; "
                "use the async API (pawn_queue.PawnQueue) in coroutines"
            )

    def submit(self, coro: Coroutine[Any, Any, T], *, on_close: bool = True) -> Call[T]:
        """Start ``coro`` on the loop (``on_close``: cancelled by close); raise once closed."""
        call: Call[T] = Call()
        with self._lock:
            try:
                if self.closed:
                    raise PawnQueueError(CLOSED)
                self.check_thread()
            except PawnQueueError:
                coro.close()
                raise
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._run, args=(self._loop,), name=self._name, daemon=True
                )
                self._thread.start()
            self._loop.call_soon_threadsafe(self._begin, call, coro, on_close)
        return call

    def call(self, coro: Coroutine[Any, Any, T], *, on_close: bool = True) -> T:
        """Run ``coro`` on the loop and return its result in this thread (or raise its error)."""
        call = self.submit(coro, on_close=on_close)
        try:
            return call.future.result()
        except BaseException:
            self.cancel(call)  # Ctrl-C: cancel on the loop and wait for the cleanup
            raise

    def cancel(self, call: Call[Any], *, once: bool = False) -> None:
        """Cancel ``call`` unless it is over, and wait until it is (its cleanup has run).
        With ``once``, a graceful stop: no cancel if one was asked with ``once`` before."""
        self.cancel_soon(call, once=once)
        concurrent.futures.wait([call.future])

    def cancel_soon(self, call: Call[Any], *, once: bool = False) -> None:
        """Ask the loop to cancel ``call`` (unless it is over), without waiting; ``once`` as
        for :meth:`cancel`."""
        if call.future.done():
            return
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # loop closed: every call is already over
            self._loop.call_soon_threadsafe(call.cancel_once if once else call.cancel)

    async def cancel_calls(self) -> None:
        """Cancel the running calls but this one (and settlements) and wait for them."""
        others = [task for task in self._calls if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def stop(self) -> None:
        """Refuse new calls, stop the loop (cancelling what is left) and join its thread."""
        with self._lock:
            self.closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            with contextlib.suppress(RuntimeError):  # already closed by an earlier stop()
                loop.call_soon_threadsafe(loop.stop)
            thread.join()

    def _begin(self, call: Call[T], coro: Coroutine[Any, Any, T], on_close: bool) -> None:
        assert self._loop is not None
        call.task = self._loop.create_task(coro)
        if on_close:
            self._calls.add(call.task)
        call.task.add_done_callback(functools.partial(self._finish, call))

    def _finish(self, call: Call[T], task: asyncio.Task[T]) -> None:
        self._calls.discard(task)
        if task.cancelled():
            call.future.set_exception(PawnQueueError("cancelled: the PawnQueue was closed"))
        elif (exc := task.exception()) is not None:
            call.future.set_exception(exc)
        else:
            call.future.set_result(task.result())

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                leftovers = asyncio.all_tasks(loop)
                for task in leftovers:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()


@contextlib.contextmanager
def blocking_context(
    runner: LoopThread, inner: contextlib.AbstractAsyncContextManager[T]
) -> Iterator[T]:
    """The async context manager ``inner`` as a plain one: entered and exited on the loop.
    Once the loop is closed (its queue torn down, which let go of what ``inner`` held),
    the exit is skipped."""
    value = runner.call(inner.__aenter__())
    try:
        yield value
    except BaseException as exc:
        if runner.closed or not runner.call(inner.__aexit__(type(exc), exc, exc.__traceback__)):
            raise
    else:
        if not runner.closed:
            runner.call(inner.__aexit__(None, None, None))


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """In the main thread, SIGTERM raises ``SystemExit(143)`` (as Ctrl-C raises
    KeyboardInterrupt) instead of killing the process, so a stop can release its leases."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
