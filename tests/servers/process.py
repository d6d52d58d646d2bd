"""Test servers that are one process on one loopback port: moto, s3rver and Azurite.

Each is started on a free port, waited for until its port answers HTTP, and stopped with
SIGTERM (SIGKILL after 5 s). The S3 ones take a signed CreateBucket like any S3 server,
Azurite a Create Container signed with the account's shared key.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import hmac
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Self

from tests.servers.seaweedfs import http_answers, put_bucket

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
    """A running server process; ``endpoint`` is its ``http://127.0.0.1:PORT``. Without a
    ``process``, a server another process started and stops (see :meth:`attach`)."""

    name: str
    process: subprocess.Popen[bytes] | None
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
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready in time:\n{self.log_tail()}")
            time.sleep(0.1)  # nothing to wait on but the port itself

    def _answers(self) -> bool:
        return http_answers(self.endpoint)

    def create_bucket(self, bucket: str) -> None:
        put_bucket(self.endpoint, bucket, self.access_key, self.secret_key)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def address(self) -> dict[str, str]:
        """What :meth:`attach` needs to reach this server from another process."""
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "log_path": str(self.log_path),
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }

    @classmethod
    def attach(cls, address: dict[str, str]) -> Self:
        """The server at ``address``, run by another process: :meth:`stop` leaves it be."""
        return cls(
            address["name"],
            None,
            address["endpoint"],
            Path(address["log_path"]),
            address["access_key"],
            address["secret_key"],
        )

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        _running.discard(self)


def _npm_binary(name: str) -> str:
    path = NPM_BIN / name
    if not path.exists():
        raise RuntimeError(f"{path} not found: run `make test-servers` (npm install)")
    return str(path)


def start_moto(workdir: Path) -> LoopbackServer:
    """moto's server: AWS's documented S3 answers (any credentials), one request at a time
    (:mod:`tests.servers.moto_serialized`: its conditional writes are atomic only so)."""
    port = free_port()
    launcher = Path(__file__).with_name("moto_serialized.py")
    args = [sys.executable, str(launcher), "127.0.0.1", str(port)]
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
    # s3rver-fixes.js closes a PUT/DELETE race in its store that makes the server exit.
    fixes = NPM_BIN.parent.parent / "s3rver-fixes.js"
    env = {"NODE_OPTIONS": f'--openssl-legacy-provider --require "{fixes}"'}
    return LoopbackServer.start(
        "s3rver", args, port, workdir, access_key="S3RVER", secret_key="S3RVER", env=env
    )


AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (  # Microsoft's published development key
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass(eq=False)
class Azurite(LoopbackServer):
    """Azurite's blob service: ``access_key`` is the account name, ``secret_key`` its key,
    ``blob_endpoint`` the URL with the account in its path, as Azurite serves it."""

    @property
    def blob_endpoint(self) -> str:
        return f"{self.endpoint}/{self.access_key}"

    def create_container(self, name: str) -> None:
        """Create Container: obstore creates none."""
        self._put(f"/{name}", {"restype": "container"}, {})

    def lease_blob(self, container: str, blob: str) -> None:
        """Take an infinite lease on a blob: deleting it without the lease id fails (412)."""
        lease = {"x-ms-lease-action": "acquire", "x-ms-lease-duration": "-1"}
        self._put(f"/{container}/{blob}", {"comp": "lease"}, lease)

    def _put(self, path: str, query: dict[str, str], ms_headers: dict[str, str]) -> None:
        """A PUT without a body, signed with the account's shared key."""
        account, path = self.access_key, f"/{self.access_key}{path}"
        headers = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        headers |= ms_headers
        content_type = "application/octet-stream"  # urllib adds one to a PUT with a body
        # The string to sign: the verb, eleven standard headers (only Content-Type set;
        # a zero Content-Length is signed empty), then the x-ms- headers and the resource.
        standard = ["", "", "", "", content_type, "", "", "", "", "", ""]
        canonical = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        resource = f"/{account}{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
        to_sign = "\n".join(["PUT", *standard, canonical + resource])
        digest = hmac.new(base64.b64decode(self.secret_key), to_sign.encode(), hashlib.sha256)
        signature = base64.b64encode(digest.digest()).decode()
        headers |= {
            "Authorization": f"SharedKey {account}:{signature}",
            "Content-Type": content_type,
        }
        url = f"{self.endpoint}{urllib.parse.quote(path)}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, method="PUT", data=b"", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            raise RuntimeError(f"PUT {path}?{query}: HTTP {exc.code}: {body}") from None

    def create_bucket(self, bucket: str) -> None:
        self.create_container(bucket)


def start_azurite(
    workdir: Path, *, account: str = AZURITE_ACCOUNT, key: str = AZURITE_KEY
) -> Azurite:
    """Azurite (npm), Microsoft's Blob Storage emulator, with one account."""
    port = free_port()
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    args = [
        _npm_binary("azurite-blob"),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data)),
        "--skipApiVersionCheck",  # obstore's x-ms-version may be newer than this Azurite
        "--silent",
    ]
    # The only account: none of the environment's, and the default one only if asked for.
    env = {"AZURITE_ACCOUNTS": f"{account}:{key}"}
    server = Azurite.start(
        "azurite", args, port, workdir, access_key=account, secret_key=key, env=env
    )
    assert isinstance(server, Azurite)
    return server
