"""Test servers that are one process on one loopback port: moto, s3rver and Azurite.

Each is started on a free port, waited for until its port answers HTTP, and stopped with
SIGTERM (SIGKILL after 5 s). The S3 ones take a signed CreateBucket like any S3 server.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.servers.seaweedfs import sign_v4

NPM_BIN = Path(__file__).parent / "npm" / "node_modules" / ".bin"
"""Where ``make test-servers`` installs s3rver and Azurite (tests/servers/npm)."""

_running: set[LoopbackServer] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    for server in list(_running):
        server.stop()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(eq=False)
class LoopbackServer:
    """A running server process; ``endpoint`` is its ``http://127.0.0.1:PORT``."""

    name: str
    process: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path
    access_key: str
    secret_key: str

    @classmethod
    def start(
        cls,
        name: str,
        args: list[str],
        port: int,
        workdir: Path,
        *,
        access_key: str,
        secret_key: str,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> LoopbackServer:
        workdir.mkdir(parents=True, exist_ok=True)
        log_path = workdir / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                args,
                cwd=workdir,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(name, process, f"http://127.0.0.1:{port}", log_path, access_key, secret_key)
        _running.add(server)
        try:
            server._wait_ready(time.monotonic() + timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, deadline: float) -> None:
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready in time:\n{self.log_tail()}")
            time.sleep(0.1)  # nothing to wait on but the port itself

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2) as response:
                return bool(response.status < 500)
        except urllib.error.HTTPError as exc:
            return exc.code < 500
        except OSError:
            return False

    def create_bucket(self, bucket: str) -> None:
        host = self.endpoint.removeprefix("http://")
        headers = sign_v4("PUT", f"/{bucket}", host, self.access_key, self.secret_key)
        request = urllib.request.Request(
            f"{self.endpoint}/{bucket}", method="PUT", data=b"", headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            raise RuntimeError(f"create bucket {bucket!r}: HTTP {exc.code}: {body}") from None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        _running.discard(self)


def _npm_binary(name: str) -> str:
    path = NPM_BIN / name
    if not path.exists():
        raise RuntimeError(f"{path} not found: run `make test-servers` (npm install)")
    return str(path)


def start_moto(workdir: Path) -> LoopbackServer:
    """moto's server: AWS's documented S3 answers (any credentials)."""
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    args = [str(moto), "-H", "127.0.0.1", "-p", str(port)]
    return LoopbackServer.start(
        "moto", args, port, workdir, access_key="moto-key", secret_key="moto-secret"
    )


def start_s3rver(workdir: Path) -> LoopbackServer:
    """s3rver (npm): honours no conditional header at all."""
    port = free_port()
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    args = [_npm_binary("s3rver"), "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "-s"]
    # Its continuation tokens are DES-encrypted, which OpenSSL 3 (Node 17+) only offers
    # with the legacy provider: without it every listing past 1,000 keys answers 500.
    env = {"NODE_OPTIONS": "--openssl-legacy-provider"}
    return LoopbackServer.start(
        "s3rver", args, port, workdir, access_key="S3RVER", secret_key="S3RVER", env=env
    )
