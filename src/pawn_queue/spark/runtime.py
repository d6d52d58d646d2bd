"""The async core inside Spark's Python processes: one event loop per process.

Spark calls the data source synchronously, from processes it starts (the driver-side stream
reader, planners, executors' workers). Each process gets one event loop in a daemon thread;
:func:`run` waits for a coroutine on it, :func:`submit` does not. Stores are opened lazily in
the process that uses them and kept for its lifetime (Spark reuses its Python workers).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pawn_queue._protocol import layout
from pawn_queue._protocol.subscriptions import Subscriptions
from pawn_queue._protocol.topics import Topics
from pawn_queue.exceptions import SubscriptionNotFoundError
from pawn_queue.spark.options import SourceOptions
from pawn_queue.store import open_store
from pawn_queue.store.base import Store

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_stores: dict[str, Store] = {}


def _running_loop() -> asyncio.AbstractEventLoop:
    """This process's loop thread (a forked child starts its own)."""
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="pawn-queue-spark", daemon=True)
            thread.start()
            _loop, _loop_pid = loop, os.getpid()
            _stores.clear()
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on this process's loop and return its result (or raise its error)."""
    return asyncio.run_coroutine_threadsafe(coro, _running_loop()).result()


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on this process's loop; the caller collects the future later."""
    return asyncio.run_coroutine_threadsafe(coro, _running_loop())


async def shared_store(options: SourceOptions) -> Store:
    """The store ``options`` select, opened once per process on first use (call on the loop)."""
    key = f"{options.url}|{options.config_path}"
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = open_store(options.config())
    return store


async def check_store(
    store: Store, topics: tuple[str, ...], subscription: str | None = None
) -> None:
    """Fail now with the store's, the topic's or the subscription's error: access denied,
    no bucket, no topic, no such subscription of a topic (read with option
    ``subscription``)."""
    await store.list("", limit=1)
    registry = Topics(store)
    subscriptions = Subscriptions(store, registry)
    for topic in topics:
        await registry.settings(topic)
        if subscription is None:
            continue
        try:
            await subscriptions.get(topic, subscription)
        except SubscriptionNotFoundError as exc:
            names = [
                layout.split_queue(d.queue)[1] for d in await subscriptions.destinations(topic)
            ]
            has = ", ".join(repr(n) for n in names) if names else "none"
            raise SubscriptionNotFoundError(
                f"pawnqueue option 'subscription': {exc} (its subscriptions: {has}; create one "
                "with PawnQueue.create_subscription)"
            ) from None
