"""The session's test servers, started once by pytest-xdist's controller and shared by its
workers (``make pytest PYTEST_WORKERS=N``).

Without this each worker starts its own: five servers and, for Ceph, three daemons and about
15 s, per worker. The controller starts them all at once, in threads, before any worker
starts; hands their addresses to each worker in its ``workerinput``; and stops them when the
run ends. Sharing is safe: tests make a bucket (or container) of their own and never stop a
session server. A server that failed to start fails only the tests that ask for it, with
its error.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from tests.servers.ceph import CephRGW
from tests.servers.process import Azurite, LoopbackServer, start_azurite, start_moto, start_s3rver
from tests.servers.seaweedfs import SeaweedFS

WORKERINPUT_KEY = "pawnqueue_servers"
"""The key of the servers' addresses in a worker's ``config.workerinput``."""


class Server(Protocol):
    def address(self) -> Any: ...
    def stop(self) -> None: ...


# Each session server by its fixture's name: how to start one, how to reach a running one.
KINDS: dict[str, tuple[Callable[[Path], Server], Callable[[Any], Any]]] = {
    "seaweedfs": (SeaweedFS.start, SeaweedFS.attach),
    "ceph_rgw": (CephRGW.start, CephRGW.attach),
    "moto": (start_moto, LoopbackServer.attach),
    "s3rver": (start_s3rver, LoopbackServer.attach),
    "azurite": (start_azurite, Azurite.attach),
}


class SharedServers:
    """Every kind in :data:`KINDS`, started in one temporary directory."""

    def __init__(self, root: Path, servers: dict[str, Server], errors: dict[str, str]) -> None:
        self.root = root
        self.servers = servers
        self.errors = errors

    @classmethod
    def start(cls) -> SharedServers:
        root = Path(tempfile.mkdtemp(prefix="pawnqueue-servers-"))
        with ThreadPoolExecutor(len(KINDS)) as pool:
            started = {name: pool.submit(start, root / name) for name, (start, _) in KINDS.items()}
        servers: dict[str, Server] = {}
        errors: dict[str, str] = {}
        for name, future in started.items():
            try:
                servers[name] = future.result()
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
        return cls(root, servers, errors)

    def workerinput(self) -> str:
        """The addresses (and start errors) as a worker's :func:`attach` reads them."""
        addresses = {name: server.address() for name, server in self.servers.items()}
        return json.dumps({"servers": addresses, "errors": self.errors})

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def attach(name: str, workerinput: str) -> Any:
    """The controller's server ``name``, as its class (``stop`` does nothing); its start
    error if it failed."""
    shared = json.loads(workerinput)
    if name in shared["errors"]:
        raise RuntimeError(f"{name} did not start: {shared['errors'][name]}")
    return KINDS[name][1](shared["servers"][name])
