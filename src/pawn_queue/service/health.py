"""The worker's HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` (liveness: the event
loop answers) and ``/readyz`` (readiness: the store answered lately and every subscriber
is consuming).

Served by the worker's own event loop (a blocked loop fails ``/healthz``, as it should), on
a minimal HTTP/1.1 server: one request per connection, GET only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from pawn_queue._protocol import layout
from pawn_queue.exceptions import AlreadyExists, NotFound, PreconditionFailed, StoreError
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

if TYPE_CHECKING:
    from pawn_queue.app import App
    from pawn_queue.metrics import QueueMetrics

logger = logging.getLogger(__name__)

T = TypeVar("T")

FRESH_SECONDS = 10.0  # a store answer younger than this needs no check request
READY_WAIT_SECONDS = 0.5  # /readyz answers within this (orchestrators' probes: 1 s)
_CHECK_TIMEOUT = 5.0
# Answers about a key, not failures of the store: it answered.
_ANSWERS = (NotFound, AlreadyExists, PreconditionFailed)


class StoreHealth(StoreWrapper):
    """Remembers when the store last answered and whether its latest request failed."""

    last_answer: float = float("-inf")  # time.monotonic()
    failing: str | None = None  # the latest failure, while no answer came after it

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await run()
        except _ANSWERS:
            self._answered()
            raise
        except StoreError as exc:
            self.failing = f"{type(exc).__name__}: {exc}"
            raise
        self._answered()
        return result

    def _answered(self) -> None:
        self.last_answer = time.monotonic()
        self.failing = None


class HealthServer:
    """Serves the endpoints for ``app`` on ``host:port`` (``port`` 0: a free one)."""

    def __init__(
        self, app: App, store: StoreHealth, metrics: QueueMetrics | None, host: str, port: int
    ) -> None:
        self._app = app
        self._store = store
        self._metrics = metrics
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._check: asyncio.Task[None] | None = None  # a store check, answered or not

    @property
    def port(self) -> int:
        """The port it listens on (once started)."""
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        logger.info("health endpoints on http://%s:%d", self._host, self.port)

    async def close(self) -> None:
        if self._check is not None:
            self._check.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def readiness(self) -> str | None:
        """None when ready, else why not (one line). Answers within READY_WAIT_SECONDS:
        a store that hangs makes it say so from what is known, not make probes time out."""
        if not self._app.consuming:
            return "not consuming"
        if time.monotonic() - self._store.last_answer > FRESH_SECONDS and not self._store.failing:
            # Nothing asked the store lately (an idle app on a quiet store): ask it, once at a
            # time, and wait a little for the answer (it usually takes milliseconds).
            if self._check is None or self._check.done():
                self._check = asyncio.create_task(self._check_store())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._check), READY_WAIT_SECONDS)
            if time.monotonic() - self._store.last_answer > FRESH_SECONDS:
                if self._store.failing:
                    return self._store.failing
                if not self._check.done():
                    return f"the store did not answer within {READY_WAIT_SECONDS:g} s"
                return "the store did not answer"
        return self._store.failing and f"store failing: {self._store.failing}"

    async def _check_store(self) -> None:
        subscribers = self._app.subscribers
        topic = subscribers[0].topics[0] if subscribers else self._app.schedules[0].topic
        with contextlib.suppress(StoreError, TimeoutError):
            async with asyncio.timeout(_CHECK_TIMEOUT):
                await self._store.head(layout.topic_marker_key(topic))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_CHECK_TIMEOUT * 2):
                request = await reader.readline()
                while (await reader.readline()).strip():  # headers: ignored
                    pass
                status, content_type, body = await self._answer(request)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, request: bytes) -> tuple[str, str, bytes]:
        parts = request.decode("latin-1").split()
        method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
        text = "text/plain; charset=utf-8"
        if method != "GET":
            return "405 Method Not Allowed", text, b"GET only\n"
        if path == "/healthz":
            return "200 OK", text, b"ok\n"
        if path == "/readyz":
            problem = await self.readiness()
            if problem is None:
                return "200 OK", text, b"ready\n"
            return "503 Service Unavailable", text, f"not ready: {problem}\n".encode()
        if path == "/metrics" and self._metrics is not None:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            from pawn_queue.metrics import only_sampled

            exported = only_sampled(self._metrics.registry)
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(exported)
        return "404 Not Found", text, b"not found\n"
