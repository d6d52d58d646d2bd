"""The worker's /readyz in process: it answers within a second whatever the store does."""

from __future__ import annotations

import asyncio
import time
import uuid

from pawn_queue import App, PawnQueue
from pawn_queue.service.health import READY_WAIT_SECONDS, HealthServer
from pawn_queue.service.runner import StoreHealthRef
from tests.helpers.faults import FaultyStore


async def get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = (await reader.read()).decode()
    writer.close()
    head, _, body = answer.partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_readyz_answers_within_a_second_while_the_store_hangs() -> None:
    """It waited for its store check up to 5 s; probes time out after 1 s by default."""
    url = f"memory://health-{uuid.uuid4().hex}"
    async with PawnQueue.from_url(url) as pq:
        await pq.create_topic("t")
    app = App(url)

    @app.subscriber("t")
    async def handle(payload: object) -> None:
        pass

    hanging = asyncio.Event()
    released = asyncio.Event()

    async def hang(operation: str, key: str) -> None:
        if hanging.is_set():  # every request, the listener's too
            await released.wait()

    app.wrap_store(lambda store: FaultyStore(store, hooks=[hang]))
    health = StoreHealthRef()
    app.wrap_store(health.wrap)
    await app.start()
    serving = asyncio.create_task(app.serve())
    server = HealthServer(app, health(), None, "127.0.0.1", 0)
    await server.start()
    try:
        await asyncio.sleep(0)  # serve() starts its listeners before it first waits
        assert app.consuming
        assert await get(server.port, "/readyz") == (200, "ready\n")
        health().last_answer = float("-inf")  # as after a quiet spell: readiness asks
        hanging.set()
        started = time.monotonic()
        status, body = await get(server.port, "/readyz")
        assert time.monotonic() - started < READY_WAIT_SECONDS + 0.4
        assert status == 503
        assert body == f"not ready: the store did not answer within {READY_WAIT_SECONDS:g} s\n"
        released.set()  # the check in flight answers: ready again, without a new request
        assert await get(server.port, "/readyz") == (200, "ready\n")
    finally:
        released.set()
        await server.close()
        app.stop_consuming()
        await serving
        await app.stop()
