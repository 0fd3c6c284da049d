"""What every writer route reads of its request: the process's runtime, the principal behind the
request's credential, a bounded JSON body, a true/false query flag; and the admin check."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from arkvory.shared.auth.credentials import SESSION_COOKIE, resolve
from arkvory.shared.auth.identity import Principal
from arkvory.shared.errors import Forbidden, InvalidInput, PasswordChangeRequired, Unauthorized
from arkvory.shared.http.access_log import note_principal
from arkvory.shared.http.bodies import read_json_object
from arkvory.shared.process.runtime import Runtime


# Who asked, once a route has resolved it: the audit of a refused change names them
# (writer/audit/refusals.py).
PRINCIPAL_KEY = "arkvory.principal"


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


async def principal_of(request: Request, *, before_new_password: bool = False) -> Principal:
    """Any credential kind (shared/auth/credentials.py); on the writer also the session cookie of the
    console (SameSite=Strict, so other sites cannot make a browser send it).

    A session signed in with a password an administrator reset is refused (403
    password_change_required) by every route but those that pass `before_new_password`: setting
    the new password and logging out."""
    runtime = runtime_of(request)
    principal = request.scope[PRINCIPAL_KEY] = await resolve(
        runtime.keys,
        runtime.credentials,
        runtime.pool,
        request.headers.get("authorization"),
        request.cookies.get(SESSION_COOKIE),
    )
    note_principal(request.scope, principal.id)  # a refused session's line names it too
    if principal.password_change_required and not before_new_password:
        raise PasswordChangeRequired(
            "an administrator reset this account's password: set your own first (POST /api/v1/account/password"
            " with the password you were given as oldPassword, `arkvory password ACCOUNT`, or the console)"
        )
    return principal


def require_admin_scope(principal: Principal, managing: str) -> None:
    """401 without credentials, 403 without the admin scope (`managing`: what the caller does)."""
    if principal.is_anonymous:
        raise Unauthorized("this request needs credentials")
    if not principal.is_admin:
        raise Forbidden(f"managing {managing} needs the admin scope")


async def json_body(request: Request) -> dict[str, Any]:
    """The JSON object body, bounded in size, depth and time; read only after the caller
    was authenticated (and, where the route can tell, authorized)."""
    return await read_json_object(request, runtime_of(request).settings.receive_timeout_s)


def flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false")
    if raw not in ("true", "false"):
        raise InvalidInput(f"query parameter '{name}' must be true or false")
    return raw == "true"
