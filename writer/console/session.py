"""Who is signed in to the console, the sign-in and sign-out pages, and what every page uses:
rendering a template, redirects with a notice, the checks before a handler runs.

Signing in is the API's login (`POST /api/v1/login`), called in-process with the browser's
address and device cookie, so its limits and lockout rules hold unchanged; its session cookie
(`arkvory_session`: HttpOnly, SameSite=Strict, Secure under TLS) goes to the browser as the
API set it. The device cookie the API scopes to its login route is handed to the browser
scoped to the console's sign-in page instead, and back. Signing out is the API's logout.

A page needs a session (not a token or a key: those are for programs). A visitor without one
is sent to the sign-in page, with the page it wanted as `next` (a console path only, so the
link cannot send anyone elsewhere). A session whose password an administrator reset sees only
the password page (PASSWORD_PATH, password.py) until it sets its own, as the API allows it
nothing else (writer/identity/account_lifecycle.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from arkvory.shared.auth.credentials import SESSION_COOKIE, resolve
from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import ApiError, Forbidden, Unauthorized
from arkvory.shared.http.access_log import note_principal
from arkvory.shared.process.runtime import Runtime

from ..identity.device_cookies import COOKIE as DEVICE_COOKIE
from .forms import read_form
from .internal import InternalApi, Refused
from .security import CSRF_FIELD, PRESESSION_COOKIE, cookies_of, csrf_matches, csrf_token, new_presession_secret

SIGN_IN_PATH = "/console/sign-in"
PASSWORD_PATH = "/console/account/password"
_NEXT = re.compile(r"/console/[A-Za-z0-9/._~%@=&?+-]{0,1000}")

# What a redirect after a change may say (`?notice=`): fixed texts, never echoed input.
NOTICES = {
    "signed-out": "You are signed out.",
    "repository-created": "The repository was created.",
    "repository-updated": "The repository's visibility was changed.",
    "repository-deleted": "The repository was deleted.",
    "member-set": "The member's level was set.",
    "member-removed": "The member was removed: the account has no permission on this repository now.",
    "artifact-deleted": "The artifact was deleted.",
    "package-deleted": "The package version was deleted.",
    "asset-deleted": "The asset was deleted.",
    "package-published": "The package version is published.",
    "package-exists": "This version was already published with this artifact: nothing changed.",
    "asset-pointed": "The asset points at the artifact now.",
    "asset-restored": "The asset points back at that artifact now.",
    "task-cancelled": "The task was cancelled (or is being cancelled).",
    "account-created": "The account was created.",
    "account-disabled": "The account was disabled; its sessions and tokens ended, the service keys it made are suspended.",
    "account-enabled": "The account was enabled.",
    "account-deleted": "The account was deleted: its sessions and tokens ended, the service keys it made are"
    " suspended, its permissions are gone; its artifacts stay.",
    "account-password-reset": "The password was reset and the account's sessions ended: at its next sign-in it"
    " must set its own.",
    "password-changed": "Your password was changed; your other sessions ended, your personal tokens stay valid.",
    "password-change-required": "An administrator reset your password: set your own to go on.",
    "token-revoked": "The token was revoked.",
    "key-revoked": "The service key was revoked.",
    "key-adopted": "The service key is yours now, and works again.",
    "uploaded": "The file was uploaded.",
    "retention-saved": "The retention rule was saved.",
    "retention-disabled": "The retention rule was disabled: it deletes nothing until enabled again.",
    "retention-deleted": "The retention rule was deleted.",
}


@dataclasses.dataclass(frozen=True)
class ConsoleUser:
    """A signed-in account: its principal (the API's), its session token (the bearer of every
    API call the console makes for it, never shown) and the CSRF token of its pages."""

    principal: Principal
    token: str
    name: str

    @property
    def admin(self) -> bool:
        return self.principal.is_admin

    @property
    def csrf(self) -> str:
        return csrf_token(self.token)

    def abilities(self, repo: str) -> dict[str, bool]:
        """What the pages offer on `repo`, by the principal's own permission methods (the API
        decides anyway): writing (upload, publish, delete what it holds), administering, and
        deleting the repository."""
        principal = self.principal
        return {
            "may_write": principal.may_write(repo) and not principal.read_only,
            "may_administer": principal.may_administer(repo),
            "may_delete": principal.is_admin,
        }

    @property
    def must_change_password(self) -> bool:
        """An administrator reset the password: the console shows only the password page."""
        return self.principal.password_change_required


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


def templates_of(request: Request) -> Jinja2Templates:
    return request.app.state.templates


def api_for(request: Request, user: ConsoleUser | None) -> InternalApi:
    return InternalApi(request.app.state.writer_app, request, user.token if user else None)


async def signed_in(request: Request) -> ConsoleUser | None:
    """The account whose session cookie came with the request, or None."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    runtime = runtime_of(request)
    try:
        principal = await resolve(runtime.keys, runtime.credentials, runtime.pool, None, token)
    except Unauthorized:
        return None
    if principal.credential_kind != "session" or principal.account_id is None:
        return None
    note_principal(request.scope, principal.id)
    assert runtime.pool is not None
    async with pooled(runtime.pool) as conn:
        name = await conn.fetchval(
            "SELECT name FROM arkvory_accounts WHERE id = $1", principal.account_id, timeout=POOLED_QUERY_TIMEOUT_S
        )
    if name is None:
        return None
    return ConsoleUser(principal, token, name)


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path, else the overview."""
    if value and _NEXT.fullmatch(value) and "//" not in value and ".." not in value:
        return value
    return "/console/"


def see_other(path: str, notice: str | None = None, /, **query: str) -> RedirectResponse:
    """303 to a console page, after a change (the browser then GETs it), with `query` (a
    field may be called `path`: the page's path is positional only)."""
    params = {k: v for k, v in query.items() if v is not None}
    if notice is not None:
        assert notice in NOTICES, notice
        params["notice"] = notice
    target = path + ("?" + urllib.parse.urlencode(params) if params else "")
    return RedirectResponse(target, status_code=303)


def render(
    request: Request,
    user: ConsoleUser | None,
    template: str,
    context: dict[str, Any] | None = None,
    *,
    status: int = 200,
    error: str | None = None,
) -> Response:
    notice = NOTICES.get(request.query_params.get("notice", ""))
    page: dict[str, Any] = {
        "user": user,
        "csrf": user.csrf if user else None,
        "notice": notice,
        "error": error,
        "path": request.url.path,
        **(context or {}),
    }
    return templates_of(request).TemplateResponse(request, template, page, status_code=status)


def refusal_message(refusal: Refused | ApiError) -> str:
    """The API's message with its code and status, for a page that shows only the refusal."""
    return f"{refusal.message} ({refusal.code}, {refusal.status})"


def refusal_status(refusal: Refused | ApiError) -> int:
    return refusal.status if 400 <= refusal.status < 600 else 500


Handler = Callable[..., Awaitable[Response]]


def page(handler: Handler) -> Handler:
    """A GET page: needs a signed-in account; `handler(request, user)`."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        user = await signed_in(request)
        if user is None:
            return sign_in_redirect(request)
        if user.must_change_password and request.url.path != PASSWORD_PATH:
            return see_other(PASSWORD_PATH, "password-change-required")
        return await handler(request, user)

    return run


def action(handler: Handler) -> Handler:
    """A POST form: a signed-in account and the form's CSRF token, checked before anything is
    done; `handler(request, user, form)`. 403 without the token, whoever asks."""

    @functools.wraps(handler)
    async def run(request: Request) -> Response:
        form = await read_form(request, runtime_of(request).settings.receive_timeout_s)
        secret = request.cookies.get(SESSION_COOKIE)
        if not csrf_matches(secret, form.optional(CSRF_FIELD)):
            raise Forbidden("this form's CSRF token is missing or wrong: reload the page and send it again")
        user = await signed_in(request)
        if user is None:
            return sign_in_redirect(request)
        if user.must_change_password and request.url.path != PASSWORD_PATH:
            return see_other(PASSWORD_PATH, "password-change-required")
        return await handler(request, user, form)

    return run


def sign_in_redirect(request: Request) -> Response:
    wanted = request.url.path if request.method == "GET" else "/console/"
    if request.method == "GET" and request.url.query:
        wanted += "?" + request.url.query
    query = {"next": wanted} if safe_next(wanted) != "/console/" else {}
    target = SIGN_IN_PATH + ("?" + urllib.parse.urlencode(query) if query else "")
    return RedirectResponse(target, status_code=303)


# -- sign-in and sign-out ----------------------------------------------------------------------


def _presession_cookie(request: Request, value: str) -> str:
    secure = "; Secure" if runtime_of(request).settings.tls_cert_file is not None else ""
    return f"{PRESESSION_COOKIE}={value}; Path=/console/; HttpOnly; SameSite=Strict{secure}"


async def sign_in_page(request: Request) -> Response:
    if await signed_in(request) is not None:
        return RedirectResponse(safe_next(request.query_params.get("next")), status_code=303)
    return _sign_in_form(request)


def _sign_in_form(request: Request, *, error: str | None = None, status: int = 200, name: str = "") -> Response:
    secret = request.cookies.get(PRESESSION_COOKIE)
    fresh = not secret
    if fresh:
        secret = new_presession_secret()
    response = render(
        request, None, "sign_in.html",
        {"csrf": csrf_token(secret), "next": safe_next(request.query_params.get("next")), "name": name},
        status=status, error=error,
    )
    if fresh:
        response.headers.append("set-cookie", _presession_cookie(request, secret))
    return response


async def sign_in(request: Request) -> Response:
    form = await read_form(request, runtime_of(request).settings.receive_timeout_s)
    if not csrf_matches(request.cookies.get(PRESESSION_COOKIE), form.optional(CSRF_FIELD)):
        raise Forbidden("the sign-in form's CSRF token is missing or wrong: reload the page and sign in again")
    name, password = form.text("name"), form.text("password")
    api = api_for(request, None)
    headers = []
    device = cookies_of(request.scope).get(DEVICE_COOKIE)
    if device:
        headers.append(("cookie", f"{DEVICE_COOKIE}={device}"))
    answer = await api.call("POST", "/api/v1/login", body={"name": name, "password": password}, headers=headers)
    if answer.status != 200:
        refusal = answer.refusal()
        response = _sign_in_form(request, error=refusal.message, status=refusal_status(refusal), name=name)
        if refusal.status == 429 and answer.header("retry-after"):
            response.headers["retry-after"] = answer.header("retry-after") or ""
        return response
    response = RedirectResponse(safe_next(form.optional("next")), status_code=303)
    for cookie in answer.header_values("set-cookie"):
        if cookie.startswith(f"{DEVICE_COOKIE}="):
            # The API scopes it to its login route; the browser sends it back to this page.
            cookie = re.sub(r"; Path=[^;]*", f"; Path={SIGN_IN_PATH}", cookie)
        response.headers.append("set-cookie", cookie)
    return response


async def sign_out(request: Request) -> Response:
    form = await read_form(request, runtime_of(request).settings.receive_timeout_s)
    if not csrf_matches(request.cookies.get(SESSION_COOKIE), form.optional(CSRF_FIELD)):
        raise Forbidden("this form's CSRF token is missing or wrong: reload the page and send it again")
    user = await signed_in(request)
    response = see_other(SIGN_IN_PATH, "signed-out")
    if user is not None:
        # The API ends the session and answers with the cookie that clears it.
        answer = await api_for(request, user).call("POST", "/api/v1/logout")
        if answer.status >= 400:
            raise answer.refusal()
        for cookie in answer.header_values("set-cookie"):
            response.headers.append("set-cookie", cookie)
    else:
        secure = "; Secure" if runtime_of(request).settings.tls_cert_file is not None else ""
        response.headers.append("set-cookie", f"{SESSION_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict{secure}")
    return response
