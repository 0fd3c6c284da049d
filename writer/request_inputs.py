"""What every writer route reads of its request: the process's runtime, the principal behind the
request's credential, a bounded JSON body, its declared query parameters and a true/false query
flag; and the admin check."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from arkvory.shared.auth.credentials import SESSION_COOKIE, resolve
from arkvory.shared.auth.identity import Principal
from arkvory.shared.errors import Forbidden, InvalidInput, PasswordChangeRequired, Unauthorized
from arkvory.shared.http.access_log import note_principal
from arkvory.shared.http.bodies import read_json_object
from arkvory.shared.http.query import checked_query, query_value
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
    raw = query(request, name)
    raw = "false" if raw is None else raw
    if raw not in ("true", "false"):
        raise InvalidInput(f"query parameter '{name}' must be true or false")
    return raw == "true"


def query(request: Request, name: str) -> str | None:
    """The declared query parameter `name` (shared/http/query.py: undeclared ones are 400)."""
    return query_value(request, name)


def declared_query_parameters(document: dict[str, Any], path: str, method: str) -> frozenset[str]:
    """The query parameters the OpenAPI operation `method path` declares (HEAD: those of its
    GET, unless the document describes HEAD itself)."""
    item = document["paths"][path]
    operation = item.get(method) or (item.get("get") if method == "head" else None)
    assert operation is not None, f"{method.upper()} {path} is not in the OpenAPI document"
    return frozenset(p["name"] for p in operation.get("parameters", []) if p.get("in") == "query")


def with_declared_query(routes: Sequence[BaseRoute], document: dict[str, Any]) -> list[BaseRoute]:
    """Each route, refusing the query parameters its OpenAPI operation does not declare (400
    naming it) before anything else runs: one check for every writer route, held to what the
    document tells clients (tests/test_query_parameters.py calls each with each parameter)."""
    checked: list[BaseRoute] = []
    for route in routes:
        assert isinstance(route, Route), f"unexpected route kind {route!r}"
        declared = {
            method: declared_query_parameters(document, route.path, method.lower())
            for method in route.methods or ()
        }
        checked.append(
            Route(route.path, _checking(route.endpoint, route.path, declared), methods=list(route.methods or ()),
                  name=route.name)
        )
    return checked


def _checking(endpoint: Callable[[Request], Awaitable[Response]], path: str,
              declared: dict[str, frozenset[str]]) -> Callable[[Request], Awaitable[Response]]:
    @functools.wraps(endpoint)
    async def checked(request: Request) -> Response:
        checked_query(request.scope, declared[request.method], f"{request.method} {path}")
        return await endpoint(request)

    return checked
