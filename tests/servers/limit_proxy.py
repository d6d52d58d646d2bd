"""An S3 proxy that answers like a provider's request limits, on loopback only.

:class:`LimitProxy` forwards as :class:`~tests.servers.fault_proxy.FaultProxy` does (same
reading, forwarding and lifetime; its fault rules are not consulted) and applies
:class:`Limits`:

* ``per_key_write_interval_seconds``: about one write a second to one key (Google Cloud
  Storage, Cloudflare R2, Storj). A write is a PUT (conditional or not), a DELETE, or a POST
  ``?delete`` (each key in its body is written; one key in its window refuses the whole
  request). Every forwarded write starts its key's window, whatever the server answers (a
  412 or 409 included); a write within the window is answered ``429 Too Many Requests``,
  S3 code ``SlowDown``, with ``Retry-After``, and not forwarded.
* ``bucket_requests_per_second``: a token bucket per bucket (Hetzner: 750 a second) holding
  one second's worth; a request finding it empty is answered ``503 Service Unavailable``,
  code ``SlowDown``, with ``Retry-After``, and not forwarded. A request beyond both limits
  gets the 503 (every request takes a token, a refused one too).
* ``enforce=False``: count only. Nothing is refused, and every write starts its key's
  window. Either way, ``over_key_interval`` and ``over_bucket_rate`` count the requests
  beyond each limit (refused or not; one beyond both counts in both).

Counters (thread-safe, readable while it runs and after, :meth:`LimitProxy.report`):
requests arrived, forwarded and refused (``per_key_429``, ``bucket_503``); requests per
wall-clock second (arrived, forwarded); per key, the forwarded writes and the most of them in
one wall-clock second, so the hottest key is known (in count-only mode that is what the
store saw); per key, the writes beyond its limit. :meth:`LimitProxy.reset_counts` starts the
counters again (key windows and token buckets are kept). Keys are ``bucket/key``
(path-style addressing).
"""

from __future__ import annotations

import http.client
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.servers.fault_proxy import FaultProxy, _Request

__all__ = ["KeyWrites", "LimitProxy", "LimitReport", "Limits"]


@dataclass(frozen=True)
class Limits:
    """What the proxy refuses; ``None`` turns a limit off."""

    per_key_write_interval_seconds: float | None = None
    bucket_requests_per_second: float | None = None
    retry_after_seconds: int = 1
    enforce: bool = True  # False: count only, never refuse

    @classmethod
    def provider(cls, *, enforce: bool = True) -> Limits:
        """One write a second per key (GCS, R2, Storj) and 750 requests a second per
        bucket (Hetzner)."""
        return cls(1.0, 750.0, enforce=enforce)


@dataclass(frozen=True)
class KeyWrites:
    key: str  # bucket/key
    writes: int  # forwarded writes
    peak_per_second: int  # the most forwarded writes in one wall-clock second


@dataclass(frozen=True)
class LimitReport:
    counts: dict[str, int]
    seconds: float  # since the counters started
    arrived_per_second: dict[int, int]  # wall-clock second -> requests arrived
    forwarded_per_second: dict[int, int]
    hottest: list[KeyWrites]  # by peak writes in one second, then by writes
    keys_written: int
    over_key: dict[str, int]  # bucket/key -> writes to it within its window (refused or not)
    by_family: dict[str, int]  # "operation key-family" -> requests forwarded (see _family)

    @property
    def peak_requests_per_second(self) -> int:
        return max(self.arrived_per_second.values(), default=0)

    @property
    def peak_forwarded_per_second(self) -> int:
        return max(self.forwarded_per_second.values(), default=0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(sorted(self.counts.items())),
            "seconds": round(self.seconds, 3),
            "peak_requests_per_second": self.peak_requests_per_second,
            "peak_forwarded_per_second": self.peak_forwarded_per_second,
            "keys_written": self.keys_written,
            "hottest": [vars(k) for k in self.hottest],
        }


@dataclass
class _Bucket:
    """A token bucket: ``rate`` tokens a second, holding at most ``rate``."""

    rate: float
    tokens: float
    refilled: float  # time.monotonic()

    def take(self, now: float) -> bool:
        self.tokens = min(self.rate, self.tokens + (now - self.refilled) * self.rate)
        self.refilled = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _KeyCount:
    writes: int = 0
    second: int = -1
    in_second: int = 0
    peak: int = 0


@dataclass
class _Counters:
    started: float = field(default_factory=time.monotonic)
    counts: Counter[str] = field(default_factory=Counter)
    arrived: Counter[int] = field(default_factory=Counter)
    forwarded: Counter[int] = field(default_factory=Counter)
    keys: dict[str, _KeyCount] = field(default_factory=dict)
    over_key: Counter[str] = field(default_factory=Counter)
    by_family: Counter[str] = field(default_factory=Counter)


_REFUSALS = {  # status line, counter
    429: ("429 Too Many Requests", "per_key_429"),
    503: ("503 Service Unavailable", "bucket_503"),
}


class LimitProxy(FaultProxy):
    """Forwards to ``upstream`` (``http://host:port``) within ``limits``."""

    def __init__(
        self, upstream: str, limits: Limits, *, max_lifetime_seconds: float = 900.0
    ) -> None:
        super().__init__(upstream, max_lifetime_seconds=max_lifetime_seconds)
        self.limits = limits
        self._last_write: dict[str, float] = {}  # bucket/key -> time.monotonic() of its window
        self._buckets: dict[str, _Bucket] = {}
        self._counters = _Counters()

    def __enter__(self) -> LimitProxy:
        self.start()
        return self

    def reset_counts(self) -> None:
        with self._lock:
            self._counters = _Counters()

    def report(self, hottest: int = 10) -> LimitReport:
        with self._lock:
            c = self._counters
            keys = [KeyWrites(k, v.writes, v.peak) for k, v in c.keys.items()]
            counts, arrived, forwarded = dict(c.counts), dict(c.arrived), dict(c.forwarded)
            over_key, seconds = dict(c.over_key), time.monotonic() - c.started
            by_family = dict(c.by_family.most_common())
        keys.sort(key=lambda k: (-k.peak_per_second, -k.writes, k.key))
        return LimitReport(
            counts, seconds, arrived, forwarded, keys[:hottest], len(keys), over_key, by_family
        )

    # -- serving ----------------------------------------------------------------------------

    def _answer(
        self,
        client: socket.socket,
        upstream: list[http.client.HTTPConnection],
        request: _Request,
    ) -> bool:
        refusal = self._admit(request)
        client.sendall(refusal or self._forward(upstream, request))
        return not request.close

    def _admit(self, request: _Request) -> bytes | None:
        """The refusal to send instead of forwarding, or None (then counted as forwarded,
        and its written keys' windows started)."""
        bucket, written = _target(request)
        limits = self.limits
        now, second = time.monotonic(), int(time.time())
        with self._lock:
            c = self._counters
            c.counts["requests"] += 1
            c.arrived[second] += 1
            status = None
            interval = limits.per_key_write_interval_seconds
            recent = [
                k
                for k in written
                if interval is not None and now - self._last_write.get(k, -1e18) < interval
            ]
            if recent:
                c.counts["over_key_interval"] += 1
                c.over_key.update(recent)
                status = 429
            rate = limits.bucket_requests_per_second
            if rate is not None and bucket:
                tokens = self._buckets.setdefault(bucket, _Bucket(rate, rate, now))
                if not tokens.take(now):
                    c.counts["over_bucket_rate"] += 1
                    status = 503  # the bucket's refusal comes first
            if status is not None and limits.enforce:
                c.counts["refused"] += 1
                c.counts[_REFUSALS[status][1]] += 1
                resource = f"/{bucket}/{written[0]}" if written else f"/{bucket}"
                return _refusal(status, limits.retry_after_seconds, resource, request)
            c.counts["forwarded"] += 1
            c.counts[f"forwarded:{request.operation}"] += 1
            c.by_family[_family(request)] += 1
            c.forwarded[second] += 1
            for key in written:
                self._last_write[key] = now
                c.counts["writes"] += 1
                count = c.keys.setdefault(key, _KeyCount())
                count.writes += 1
                if count.second != second:
                    count.second, count.in_second = second, 0
                count.in_second += 1
                count.peak = max(count.peak, count.in_second)
        return None


def _target(request: _Request) -> tuple[str, list[str]]:
    """The bucket, and the ``bucket/key`` names the request writes (none for a read)."""
    parts = urlsplit(request.target)
    bucket, _, key = parts.path.lstrip("/").partition("/")
    bucket = unquote(bucket)
    query = parse_qs(parts.query, keep_blank_values=True)
    if request.method == "POST" and "delete" in query:
        return bucket, [f"{bucket}/{k}" for k in request.key.split("\n") if k]
    if not key or "partNumber" in query:  # a bucket request, or a part of an upload
        return bucket, []
    if request.method in ("PUT", "DELETE") and "uploadId" not in query:
        return bucket, [f"{bucket}/{unquote(key)}"]
    if request.method == "POST" and "uploadId" in query:  # completes an upload
        return bucket, [f"{bucket}/{unquote(key)}"]
    return bucket, []


def _family(request: _Request) -> str:
    """The operation and the key's folder, its last part starred (``get _notify/*``; a
    multi-delete's by its first key): which kind of key the requests go to."""
    folder = request.key.partition("\n")[0].rpartition("/")[0]
    return f"{request.operation} {folder}/*" if folder else f"{request.operation} *"


def _refusal(status: int, retry_after: int, resource: str, request: _Request) -> bytes:
    """An S3 ``SlowDown`` error answer with ``Retry-After`` (a HEAD answer has headers only)."""
    status_line, _ = _REFUSALS[status]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        "<Message>Please reduce your request rate.</Message>"
        f"<Resource>{_xml(resource)}</Resource></Error>"
    )
    head = (
        f"HTTP/1.1 {status_line}\r\nContent-Type: application/xml\r\n"
        f"Retry-After: {retry_after}\r\nContent-Length: {len(body.encode())}\r\n\r\n"
    )
    return (head + ("" if request.method == "HEAD" else body)).encode()


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
