"""A throwaway single-node Ceph cluster with the RADOS gateway (S3) on loopback, for tests.

One monitor, one OSD on memstore (data in memory, nothing on disk but logs) and ``radosgw``
with the beast frontend, from Debian's ``ceph-mon``, ``ceph-osd`` and ``radosgw`` packages
(``make ceph`` installs them). Authentication between the daemons is off and the messenger
runs in ``crc`` mode (without it radosgw loops on "get_initial_auth_request returned -13");
the gateway itself checks S3 signatures against one user made with ``radosgw-admin``.
Ready in about 15 s; the three daemons idle at about 110 MB.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.servers.process import free_port
from tests.servers.seaweedfs import http_answers, put_bucket

ACCESS_KEY = "ceph-test-access"
SECRET_KEY = "ceph-test-secret"  # a loopback-only test server's key, not a credential
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "monmaptool", "ceph", "radosgw-admin")

_running: set[CephRGW] = set()


def _kill_all_at_exit() -> None:
    for server in list(_running):
        server.stop()


atexit.register(_kill_all_at_exit)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _config(root: Path, mon_port: int, rgw_port: int, fsid: str) -> str:
    return f"""[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms client mode = crc
ms bind msgr1 = false
ms bind ipv4 = true
public addr = 127.0.0.1
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon max pg per osd = 1000
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon data avail warn = 1
mon data avail crit = 1
run dir = {root}/run
admin socket = {root}/run/$name.asok
log file = {root}/log/$name.log
pid file = {root}/run/$name.pid
keyring = {root}/keyring
log to stderr = false
err to stderr = false

[mon]
mon data = {root}/mon/$cluster-$id

[osd]
osd data = {root}/osd/$cluster-$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd max object name len = 460
osd max object namespace len = 64

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw data = {root}/rgw
rgw dns name = 127.0.0.1
rgw enable usage log = false
"""


class CephRGW:
    """A running monitor, OSD and radosgw; :meth:`stop` ends all three (those this process
    started)."""

    access_key = ACCESS_KEY
    secret_key = SECRET_KEY

    def __init__(self, root: Path, rgw_port: int) -> None:
        self.root = root
        self.conf = root / "ceph.conf"
        self.endpoint = f"http://127.0.0.1:{rgw_port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    @classmethod
    def start(cls, root: Path, *, timeout: float = 90.0) -> CephRGW:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(
                f"Ceph binaries not found ({', '.join(missing)}): run `make ceph` "
                "(apt-get install ceph-mon ceph-osd radosgw)"
            )
        root.mkdir(parents=True, exist_ok=True)
        for sub in ("run", "log", "mon/ceph-a", "osd/ceph-0", "rgw"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        server = cls(root, free_port())
        mon_port = free_port()
        fsid = str(uuid.uuid4())
        server.conf.write_text(
            _config(root, mon_port, int(server.endpoint.rsplit(":", 1)[1]), fsid)
        )
        _running.add(server)
        try:
            server._boot(mon_port, fsid, time.monotonic() + timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def _boot(self, mon_port: int, fsid: str, deadline: float) -> None:
        monmap = self.root / "monmap"
        self._run(
            "monmaptool", "--create", "--fsid", fsid,
            "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", str(monmap),
        )  # fmt: skip
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap))
        self._daemon("ceph-mon", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", "osd", "new", osd_uuid, timeout=deadline - time.monotonic())
        self._run("ceph-osd", "-i", osd_id.strip(), "--mkfs", "--osd-uuid", osd_uuid)
        self._daemon("ceph-osd", "-i", osd_id.strip())
        self._run(
            "radosgw-admin", "user", "create", "--uid=test", "--display-name=test",
            f"--access-key={ACCESS_KEY}", f"--secret={SECRET_KEY}",
            timeout=deadline - time.monotonic(),
        )  # fmt: skip
        self._daemon("radosgw", "-n", "client.rgw.a")
        while not self._answers():
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[0]} exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"radosgw not ready in time:\n{self.log_tail()}")
            time.sleep(0.2)  # nothing to wait on but the port itself

    def _run(self, *args: str, timeout: float = 60.0) -> str:
        result = subprocess.run(
            [*args, "-c", str(self.conf)],
            capture_output=True,
            text=True,
            timeout=max(timeout, 1.0),
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr[-2000:]}")
        return result.stdout

    def _daemon(self, *args: str) -> None:
        log = (self.root / "log" / f"{args[0]}.out").open("ab")
        with log:
            self.processes.append(
                subprocess.Popen(
                    [*args, "-c", str(self.conf), "-f"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _answers(self) -> bool:
        return http_answers(self.endpoint)

    def create_bucket(self, name: str) -> None:
        put_bucket(self.endpoint, name, ACCESS_KEY, SECRET_KEY)

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(parts) or "(no log)"

    def stop(self) -> None:
        """SIGTERM each daemon (gateway first), SIGKILL what is still running after 5 s."""
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        _running.discard(self)

    def address(self) -> dict[str, str]:
        """What :meth:`attach` needs to reach this server from another process."""
        return {"root": str(self.root), "endpoint": self.endpoint}

    @classmethod
    def attach(cls, address: dict[str, str]) -> CephRGW:
        """The gateway at ``address``, run by another process (no daemons: :meth:`stop`
        leaves it be)."""
        return cls(Path(address["root"]), int(address["endpoint"].rsplit(":", 1)[1]))

    def __repr__(self) -> str:
        return f"CephRGW(endpoint={self.endpoint!r})"
