"""Who may use the dashboard, and proof that a POST came from its own forms.

Auth (optional): HTTP Basic ``user:password`` or a token (``Authorization: Bearer T``, or
``?token=T`` once in a browser, which sets an HttpOnly cookie holding an HMAC of it). Every
comparison is constant-time.

CSRF: a signed double-submit token. The ``jq_session`` cookie holds a random session id; forms
carry ``csrf_token = HMAC(secret, session id)`` in a hidden field. A POST is accepted only if
the field matches the cookie's signature: a cross-site page can make the browser send the
cookie (SameSite=Strict already stops that in current browsers) but can neither read it nor
forge the signature, and a cookie planted by a sibling host does not match a token signed with
this process's secret. The secret is random per dashboard process: a restart only means
reloading the page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import URL
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_COOKIE = "jq_session"
TOKEN_COOKIE = "jq_token"
CSRF_FIELD = "csrf_token"


def _mac(secret: bytes, purpose: str, value: str) -> str:
    return hmac.new(secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Csrf:
    secret: bytes

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(32)

    def token_for(self, session_id: str) -> str:
        return _mac(self.secret, "csrf", session_id)

    def valid(self, session_id: str | None, submitted: str | None) -> bool:
        if not session_id or not submitted:
            return False
        # Bytes: compare_digest refuses non-ASCII str, and the field comes from the client.
        return hmac.compare_digest(self.token_for(session_id).encode(), submitted.encode())


@dataclass(frozen=True)
class Credentials:
    """What the dashboard accepts: Basic user and password, or a token (or nothing)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    @property
    def required(self) -> bool:
        return self.user is not None or self.token is not None

    @classmethod
    def parse_basic(cls, text: str) -> Credentials:
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise ValueError("--auth takes user:password (both non-empty)")
        return cls(user=user, password=password)

    def basic_ok(self, header: str | None) -> bool:
        if self.user is None or self.password is None or not header:
            return False
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        expected = f"{self.user}:{self.password}".encode()
        return hmac.compare_digest(given, expected)

    def bearer_ok(self, header: str | None) -> bool:
        if self.token is None or not header:
            return False
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.token.encode()
        )

    def token_ok(self, given: str | None) -> bool:
        return (
            self.token is not None
            and given is not None
            and hmac.compare_digest(given.encode(), self.token.encode())
        )


class AuthGate:
    """ASGI middleware: every HTTP request must authenticate when credentials are set."""

    def __init__(self, app: ASGIApp, credentials: Credentials, secret: bytes) -> None:
        self.app, self.credentials, self.secret = app, credentials, secret

    def _cookie_value(self) -> str:
        return _mac(self.secret, "token", self.credentials.token or "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.credentials.required:
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        auth = conn.headers.get("authorization")
        creds = self.credentials
        cookie = conn.cookies.get(TOKEN_COOKIE)
        if (
            creds.basic_ok(auth)
            or creds.bearer_ok(auth)
            or (
                creds.token is not None
                and cookie is not None
                and hmac.compare_digest(cookie.encode(), self._cookie_value().encode())
            )
        ):
            await self.app(scope, receive, send)
            return
        query_token = conn.query_params.get("token")
        response: Response
        if creds.token_ok(query_token):
            # Drop the token from the address bar (and history) once the cookie holds it.
            rest = [(k, v) for k, v in parse_qsl(conn.url.query) if k != "token"]
            target = URL(path=conn.url.path, query=urlencode(rest))
            response = RedirectResponse(str(target), status_code=303)
            response.set_cookie(
                TOKEN_COOKIE, self._cookie_value(), httponly=True, samesite="strict"
            )
        else:
            headers = {"WWW-Authenticate": 'Basic realm="jobqueue"'} if creds.user else {}
            response = PlainTextResponse("authentication required", 401, headers=headers)
        await response(scope, receive, send)


READ_ONLY_REFUSAL = (
    "this dashboard is read-only: it changes nothing (started with --read-only, or "
    "create_app(read_only=True))"
)


class ReadOnlyGate:
    """ASGI middleware of a read-only dashboard: only GET and HEAD pass; anything else (every
    POST /actions/<name>, whatever its token) is a 403 saying why, before any handler runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
            await PlainTextResponse(READ_ONLY_REFUSAL, 403)(scope, receive, send)
            return
        await self.app(scope, receive, send)
