"""Serving the dashboard with uvicorn on a socket bound beforehand (so a taken port or a
refused bind is a one-line error before anything starts)."""

from __future__ import annotations

import socket

import uvicorn
from starlette.applications import Starlette

from pawn_queue.dashboard.security import check_bind
from pawn_queue.dashboard.snapshots import Monitor


def listen(host: str, port: int, token: str | None) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one). Refuses a non-loopback
    ``host`` without ``token`` (ArgumentError); OSError when the address cannot be bound."""
    check_bind(host, token)
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class DashboardServer:
    """uvicorn serving ``app`` on ``sock``; :meth:`run` opens the queue first and closes it
    after. Access logs are off: a first visit's URL carries the token."""

    def __init__(self, app: Starlette, sock: socket.socket) -> None:
        self.app = app
        self.sock = sock
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
        )
        self._server = uvicorn.Server(config)

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    async def run(self) -> None:
        monitor: Monitor = self.app.state.monitor
        await monitor.start()
        try:
            await self._server.serve(sockets=[self.sock])
        finally:
            await monitor.stop()

    def stop(self) -> None:
        """Ask the server to stop (from any thread); :meth:`run` returns once it did."""
        self._server.should_exit = True


async def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until interrupted."""
    await DashboardServer(app, sock).run()
