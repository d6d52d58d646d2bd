"""The handlers' thread pool: results and errors as an executor's, and daemon threads."""

from __future__ import annotations

import threading

import pytest

from pawn_queue._internal.daemon_pool import DaemonThreadPool


def test_results_errors_and_a_bounded_number_of_daemon_threads() -> None:
    pool = DaemonThreadPool(2, "test-pool")
    release = threading.Event()
    blocked = [pool.submit(release.wait) for _ in range(2)]
    queued = pool.submit(lambda: threading.current_thread())
    failing = pool.submit(int, "not a number")
    assert not queued.done()  # two threads at most, both busy
    release.set()
    assert all(future.result(timeout=10) for future in blocked)
    thread = queued.result(timeout=10)
    assert thread.daemon and thread.name.startswith("test-pool_")
    with pytest.raises(ValueError):
        failing.result(timeout=10)
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        pool.submit(print)


def test_shutdown_cancels_queued_work_and_does_not_wait_for_a_stuck_call() -> None:
    pool = DaemonThreadPool(1, "test-pool")
    stuck = threading.Event()
    running = pool.submit(stuck.wait)
    queued = pool.submit(print, "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled() and not running.done()
    stuck.set()
    assert running.result(timeout=10) is True
