"""The console's defences against other sites and injected script.

CSRF. A token is the HMAC-SHA256 of a fixed purpose string keyed with a secret the browser
holds only in an HttpOnly, SameSite=Strict cookie: the session token once signed in (the
`arkvory_session` cookie), and before that a random pre-session cookie (`arkvory_console_csrf`,
for the sign-in form). The server recomputes it from the cookie on every request, so nothing is
stored; another site can neither read the cookie nor the page that carries the token, and a
token dies with its session. Every console form carries it in the hidden field `csrf`; a POST
without it, or with another, is 403 before anything else is read or done.

The API accepts the session cookie too (SPEC §5), so the console's script can upload and follow
task events with it. SameSite=Strict already keeps other sites' requests from carrying the
cookie; as a second defence, `CookieCsrfGuard` refuses (403) every request to /api/ that would
change something, is authorized by the cookie alone (no `Authorization` header: the bearer
always wins over the cookie, shared/auth/credentials.py), and lacks the same token in the
`X-CSRF-Token` header. Login and sign-up authorize nobody by the cookie and are left to the API,
which refuses them from another site's page (writer/identity/sign_in_guard.py).

Headers. Every console response says: no script but our own files (`script-src 'self'`, no
inline script, no `unsafe-inline`), no framing, no MIME sniffing, no referrer off the origin,
and `Cache-Control: no-store` unless the response set its own (a download's).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arkvory.shared.auth.credentials import SESSION_COOKIE
from arkvory.shared.errors import Forbidden
from arkvory.shared.http.access_log import PRINCIPAL_ID_KEY
from arkvory.shared.http.edge import send_error
from arkvory.shared.http.handle import HANDLE_KEY

CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
PRESESSION_COOKIE = "arkvory_console_csrf"
_PURPOSE = b"arkvory console csrf v1"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# These routes authenticate nobody (they take a name and a password), so the cookie authorizes
# nothing there; a client that holds an old session cookie still signs in.
_NOT_COOKIE_AUTHORIZED = frozenset({"/api/v1/login", "/api/v1/register"})

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_PAGE_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


def csrf_token(secret: str) -> str:
    """The CSRF token of a cookie's secret (a session token or a pre-session value)."""
    mac = hmac.new(secret.encode("utf-8", "surrogatepass"), _PURPOSE, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode("ascii").rstrip("=")


def csrf_matches(secret: str | None, sent: str | None) -> bool:
    if not secret or not sent:
        return False
    expected = csrf_token(secret).encode("ascii")
    return hmac.compare_digest(expected, sent.encode("utf-8", "surrogatepass"))


def new_presession_secret() -> str:
    return secrets.token_urlsafe(32)


def cookies_of(scope: Scope) -> dict[str, str]:
    """The request's cookies, parsed as Starlette parses them for `request.cookies` (the same
    value the API's `principal_of` reads)."""
    values = [value.decode("latin-1") for key, value in scope["headers"] if key == b"cookie"]
    return cookie_parser("; ".join(values)) if values else {}


def _cookie_change_allowed(scope: Scope) -> bool:
    sent: list[str] = []
    for key, value in scope["headers"]:
        if key == b"authorization":
            return True  # the bearer decides whom the request acts for, never the cookie
        if key == b"x-csrf-token":
            sent.append(value.decode("latin-1"))
    session = cookies_of(scope).get(SESSION_COOKIE)
    if not session:
        return True  # no cookie: nothing a forged request could borrow
    return len(sent) == 1 and csrf_matches(session, sent[0])


class CookieCsrfGuard:
    """On the writer, before any route: a change to the API authorized by the session cookie
    alone must carry the console page's CSRF token in `X-CSRF-Token` (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] not in _SAFE_METHODS
            and scope["path"].startswith("/api/")
            and scope["path"] not in _NOT_COOKIE_AUTHORIZED
            and not _cookie_change_allowed(scope)
        ):
            await send_error(scope, send, Forbidden(
                f"a change authorized by the session cookie must carry the console's {CSRF_HEADER} "
                "header; API clients send 'Authorization: Bearer <token>' instead"
            ))
            return
        await self.app(scope, receive, send)


class PageHeaders:
    """Adds the console's security headers to every response it sends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extensions = scope.get("extensions") or {}
        outer = scope
        if HANDLE_KEY in extensions:
            # A response written through the connection handle would skip `send_with_headers`
            # and go out without the headers below: the console's downloads take the ASGI path.
            scope = {**scope, "extensions": {k: v for k, v in extensions.items() if k != HANDLE_KEY}}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [header for header in _PAGE_HEADERS if header[0] not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            # What the edge reads of the request at its end (the metrics' route, the access
            # line's principal) was set on the copy.
            for key in ("route", PRINCIPAL_ID_KEY):
                if key in scope:
                    outer[key] = scope[key]
