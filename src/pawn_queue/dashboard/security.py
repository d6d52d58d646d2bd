"""Who may use the dashboard: the bind check, the token, CSRF tokens and response headers.

- Off loopback, a token is required (:func:`check_bind`). With a token, every request needs
  it: ``Authorization: Bearer TOKEN``, or a session cookie got by opening any page once with
  ``?token=TOKEN`` (the answer redirects to the same page without it, so the token stays out
  of the history). The token is never written into a page, a header or a log.
- Without a token (loopback only), requests must name a loopback host: a web page cannot
  reach the dashboard through a name of its own that resolves to 127.0.0.1 (DNS rebinding).
- Forms that change data carry a CSRF token: an HMAC of a per-browser cookie under a
  per-process secret. Another site can make a browser post, but cannot read the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections import OrderedDict
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pawn_queue.dashboard.settings import TOKEN_ENV_VAR
from pawn_queue.exceptions import ArgumentError

SESSION_COOKIE = "pq_session"
CSRF_COOKIE = "pq_csrf"
_MAX_SESSIONS = 1000
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

# Scripts and styles only from the dashboard's own files: an injected tag would not run.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token (ArgumentError, one line)."""
    if not token and not is_loopback(host):
        raise ArgumentError(
            f"refusing to listen on {host} without a token: anyone who reaches it could read "
            f"every message; give --token (or {TOKEN_ENV_VAR}), or listen on 127.0.0.1"
        )


class Csrf:
    """CSRF tokens: an HMAC of the browser's ``pq_csrf`` cookie under a process secret."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self._secret, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, token: str | None) -> bool:
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token_for(cookie), token)


class Guard:
    """ASGI middleware: host check, token, the CSRF cookie and the security headers."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self._token = token
        self._sessions: OrderedDict[str, None] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        cookies = _cookies(headers)
        extra: list[tuple[str, str]] = []
        if self._token is None and not _host_is_loopback(headers.get("host", "")):
            await _plain(send, 421, "this dashboard answers only to 127.0.0.1 or localhost")
            return
        if self._token is not None and not self._authenticated(headers, cookies):
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            given = query.pop("token", None)
            if given is None or not hmac.compare_digest(given.encode(), self._token.encode()):
                await self._refuse(scope, send)
                return
            session = self._new_session()
            raw = scope.get("raw_path") or scope["path"].encode("utf-8")
            # One leading slash: "//host" would send the browser to another site.
            location = "/" + raw.decode("latin-1").lstrip("/")
            if query:
                location += "?" + urlencode(query)
            cookie = f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict"
            await _redirect(send, location, [("set-cookie", cookie)])
            return
        if not cookies.get(CSRF_COOKIE):
            value = secrets.token_urlsafe(24)
            scope.setdefault("state", {})["csrf_cookie"] = value
            extra.append(
                ("set-cookie", f"{CSRF_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict")
            )

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    out[name] = value
                for name, value in extra:
                    out.append(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _authenticated(self, headers: Headers, cookies: dict[str, str]) -> bool:
        assert self._token is not None
        bearer = headers.get("authorization", "")
        if bearer.lower().startswith("bearer ") and hmac.compare_digest(
            bearer[7:].strip().encode(), self._token.encode()
        ):
            return True
        session = cookies.get(SESSION_COOKIE)
        return session is not None and session in self._sessions

    def _new_session(self) -> str:
        session = secrets.token_urlsafe(32)
        self._sessions[session] = None
        while len(self._sessions) > _MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if scope["path"].startswith("/api/"):
            await _plain(send, 401, "token required", "application/json")
            return
        await _plain(
            send,
            401,
            "This dashboard needs its token: open it as http://HOST:PORT/?token=YOUR-TOKEN "
            "(the token given with --token or the PAWNQUEUE_DASHBOARD_TOKEN variable).",
        )


def csrf_cookie(scope: Scope, cookies: dict[str, str]) -> str:
    """The browser's CSRF cookie: sent with the request, or set by this response."""
    state = scope.get("state", {})
    return cookies.get(CSRF_COOKIE) or str(state.get("csrf_cookie", ""))


def _host_is_loopback(host_header: str) -> bool:
    host = host_header.strip()
    if host.startswith("["):
        host = host[: host.find("]") + 1]
    else:
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return host.lower() in _LOOPBACK_HOSTS or is_loopback(host)


def _cookies(headers: Headers) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for value in headers.getlist("cookie"):
        try:
            jar.load(value)
        except Exception:  # noqa: S112 - a malformed cookie header counts as none
            continue
    return {name: morsel.value for name, morsel in jar.items()}


async def _plain(send: Send, status: int, text: str, media: str = "text/plain") -> None:
    body = (f'{{"error": "{text}"}}' if media == "application/json" else text).encode()
    headers = [
        (b"content-type", f"{media}; charset=utf-8".encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, extra: list[tuple[str, str]]) -> None:
    headers = [
        (b"location", location.encode("latin-1", "replace")),
        (b"content-length", b"0"),
        *((k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()),
        *((k.encode(), v.encode()) for k, v in extra),
    ]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
