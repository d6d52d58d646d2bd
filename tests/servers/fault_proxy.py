"""A fault-injecting HTTP/1.1 proxy between the S3 client and SeaweedFS, on loopback only.

Point ``s3.endpoint_url`` at :attr:`FaultProxy.endpoint`. Requests and their ``Host`` header
are forwarded unchanged, so the client's signature (which covers ``host``) still verifies.
Each client connection gets a thread and one keep-alive upstream connection; bodies are
read whole (``Content-Length`` or chunked) and answered with a ``Content-Length``.

Faults (at most one per request; the first matching rule that fires wins):

* ``error_500`` / ``slowdown_503``: an S3 error answer, nothing forwarded.
* ``conflict_409``: AWS's answer to concurrent conditional writes (409
  ``ConditionalRequestConflict``), nothing forwarded; only PUTs with ``If-Match`` or
  ``If-None-Match`` are eligible.
* ``reset``: the client connection is reset (RST), nothing forwarded.
* ``stall``: nothing forwarded; the connection is held ``delay_seconds``, then closed.
* ``drop_response``: forwarded (the server applies it), then the client connection is reset.
* ``slow``: forwarded, the answer held back ``delay_seconds``.

Operations: ``get``, ``head``, ``put``, ``list`` (a GET on the bucket; its key is the
``prefix`` parameter) and ``delete`` (DELETE, or POST ``?delete``, whose key is the keys in
its body, one per line). The proxy stops itself after ``max_lifetime_seconds``.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Literal
from urllib.parse import parse_qs, unquote, urlsplit

FaultKind = Literal[
    "error_500", "slowdown_503", "conflict_409", "reset", "stall", "drop_response", "slow"
]
Operation = Literal["get", "head", "put", "list", "delete"]
ALL_OPERATIONS: frozenset[str] = frozenset({"get", "head", "put", "list", "delete"})

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}
)
_ERRORS = {  # status line, S3 error code
    "error_500": ("500 Internal Server Error", "InternalError"),
    "slowdown_503": ("503 Service Unavailable", "SlowDown"),
    "conflict_409": ("409 Conflict", "ConditionalRequestConflict"),
}


@dataclass(frozen=True)
class FaultRule:
    """Inject ``kind`` into a share ``rate`` of the requests it matches."""

    kind: FaultKind
    rate: float
    operations: frozenset[str] = ALL_OPERATIONS
    key_pattern: str = ""  # searched in the URL-decoded key; "" matches every request
    delay_seconds: float = 0.0  # "slow": before answering; "stall": before closing
    limit: int | None = None  # at most this many injections by this rule


@dataclass(frozen=True)
class Injection:
    kind: str
    operation: str
    method: str
    key: str
    time: float  # time.monotonic()


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    operation: str
    key: str
    close: bool

    @property
    def conditional(self) -> bool:
        """A PUT with If-Match or If-None-Match (a create-only or compare-and-swap write)."""
        names = {name.lower() for name, _ in self.headers}
        return self.method == "PUT" and bool(names & {"if-match", "if-none-match"})


class FaultProxy:
    """Forwards to ``upstream`` (``http://host:port``), injecting faults by rule."""

    def __init__(self, upstream: str, *, seed: int = 0, max_lifetime_seconds: float = 900.0):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self._upstream = (parts.hostname, parts.port)
        self._random = random.Random(seed)
        self._lifetime = max_lifetime_seconds
        self._lock = threading.Lock()
        self._rules: list[tuple[FaultRule, re.Pattern[str]]] = []
        self._fired: list[int] = []
        self._stats: Counter[str] = Counter()
        self._log: list[Injection] = []
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._timer: threading.Timer | None = None
        self.endpoint = ""

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.2)  # how often the accept loop looks at the stop flag
        self.endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        self._spawn(self._accept_loop, listener)
        self._timer = threading.Timer(self._lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def set_rules(self, rules: Sequence[FaultRule]) -> None:
        compiled = [(rule, re.compile(rule.key_pattern)) for rule in rules]
        with self._lock:
            self._rules, self._fired = compiled, [0] * len(compiled)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def injected(self) -> list[Injection]:
        with self._lock:
            return list(self._log)

    def stop(self) -> None:
        self._stopping.set()
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _close(sock)  # wakes the threads blocked on it
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving ----------------------------------------------------------------------------

    def _spawn(self, target: Callable[[socket.socket], None], sock: socket.socket) -> None:
        thread = threading.Thread(target=target, args=(sock,), daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        self._track(sock)
        thread.start()

    def _track(self, sock: socket.socket, add: bool = True) -> None:
        with self._lock:
            (self._sockets.add if add else self._sockets.discard)(sock)
        if add and self._stopping.is_set():
            _close(sock)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self._spawn(self._serve, client)
        _close(listener)

    def _serve(self, client: socket.socket) -> None:
        upstream: list[http.client.HTTPConnection] = []  # at most one, opened on first use
        reader = client.makefile("rb")
        try:
            while not self._stopping.is_set():
                if not self._answer(client, upstream, _read_request(reader)):
                    return
        except (EOFError, OSError, http.client.HTTPException, ValueError):
            return
        finally:
            reader.close()
            _close(client)
            self._track(client, add=False)
            for conn in upstream:
                self._drop(conn)

    def _answer(
        self,
        client: socket.socket,
        upstream: list[http.client.HTTPConnection],
        request: _Request,
    ) -> bool:
        """Answer ``request`` (a fault, or the server's answer); False to end the connection."""
        rule = self._decide(request)
        kind = rule.kind if rule is not None else None
        delay = rule.delay_seconds if rule is not None else 0.0
        if kind == "reset":
            _reset(client)
            return False
        if kind == "stall":
            self._stopping.wait(delay)
            return False
        if kind in _ERRORS:
            client.sendall(_error_response(kind, request.method == "HEAD"))
            return True
        answer = self._forward(upstream, request)
        if kind == "drop_response":
            _reset(client)
            return False
        if kind == "slow":
            self._stopping.wait(delay)
        client.sendall(answer)
        return not request.close

    def _decide(self, request: _Request) -> FaultRule | None:
        with self._lock:
            self._stats["requests"] += 1
            self._stats[f"requests:{request.operation}"] += 1
            for index, (rule, pattern) in enumerate(self._rules):
                if request.operation not in rule.operations or not pattern.search(request.key):
                    continue
                if rule.limit is not None and self._fired[index] >= rule.limit:
                    continue
                if rule.kind == "conflict_409" and not request.conditional:
                    continue
                if self._random.random() >= rule.rate:
                    continue
                self._fired[index] += 1
                self._stats[rule.kind] += 1
                self._stats[f"{rule.kind}:{request.operation}"] += 1
                now = time.monotonic()
                op, method, key = request.operation, request.method, request.key
                self._log.append(Injection(rule.kind, op, method, key, now))
                return rule
        return None

    def _forward(self, upstream: list[http.client.HTTPConnection], request: _Request) -> bytes:
        """The server's whole answer, ready for the client. A kept-alive connection that the
        server closed while idle fails before the request was read: then a new one is used."""
        reused = bool(upstream)
        try:
            return self._exchange(upstream, request)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
        self._drop(upstream.pop())
        return self._exchange(upstream, request)

    def _exchange(self, upstream: list[http.client.HTTPConnection], request: _Request) -> bytes:
        if not upstream:
            conn = http.client.HTTPConnection(*self._upstream, timeout=120)
            conn.connect()
            assert conn.sock is not None
            self._track(conn.sock)
            upstream.append(conn)
        conn = upstream[0]
        conn.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
        for name, value in request.headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                conn.putheader(name, value)
        if request.body or request.method in ("PUT", "POST"):
            conn.putheader("Content-Length", str(len(request.body)))
        conn.endheaders(request.body or None)
        response = conn.getresponse()
        body = response.read()  # undoes chunking; a HEAD answer has none
        head = request.method == "HEAD"
        lines = [f"HTTP/1.1 {response.status} {response.reason}"]
        for name, value in response.getheaders():
            lowered = name.lower()
            if lowered not in _HOP_BY_HOP and (lowered != "content-length" or head):
                lines.append(f"{name}: {value}")
        if not head:
            lines.append(f"Content-Length: {len(body)}")
        if response.will_close:
            self._drop(upstream.pop())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        if conn.sock is not None:
            self._track(conn.sock, add=False)
        conn.close()


def _read_request(reader: BinaryIO) -> _Request:
    line = reader.readline(65537)
    if not line:
        raise EOFError
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while (raw := reader.readline(65537)) not in (b"\r\n", b"\n"):
        if not raw:
            raise EOFError
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    fields = {name.lower(): value for name, value in headers}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = _read_chunked(reader)
    else:
        body = _read_exactly(reader, int(fields.get("content-length", "0")))
    operation, key = _classify(method, target, body)
    close = fields.get("connection", "").lower() == "close"
    return _Request(method, target, headers, body, operation, key, close)


def _read_exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size) if size else b""
    if len(data) < size:
        raise EOFError
    return data


def _read_chunked(reader: BinaryIO) -> bytes:
    parts = []
    while size := int(reader.readline(1024).split(b";", 1)[0].strip() or b"0", 16):
        parts.append(_read_exactly(reader, size))
        reader.readline(16)  # the CRLF after the chunk
    while reader.readline(65537) not in (b"\r\n", b"\n", b""):
        pass  # trailers
    return b"".join(parts)


def _classify(method: str, target: str, body: bytes) -> tuple[str, str]:
    """The operation and the key a rule's pattern is searched in."""
    parts = urlsplit(target)
    key = unquote(parts.path.lstrip("/").partition("/")[2])
    query = parse_qs(parts.query, keep_blank_values=True)
    if method == "POST" and "delete" in query:
        keys = re.findall(rb"<Key>([^<]*)</Key>", body)
        return "delete", "\n".join(k.decode("utf-8", "replace") for k in keys)
    if method in ("DELETE", "HEAD"):
        return method.lower(), key
    if method in ("PUT", "POST"):
        return "put", key
    if not key:
        return "list", query.get("prefix", [""])[0]
    return "get", key


def _error_response(kind: str, head: bool) -> bytes:
    """An S3 error answer (a HEAD answer has headers only)."""
    status, code = _ERRORS[kind]
    body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{kind}</Message></Error>"
    head_part = f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
    head_part += f"Content-Length: {len(body)}\r\n\r\n"
    return (head_part + ("" if head else body)).encode()


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer sees a connection reset, not an orderly close."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
