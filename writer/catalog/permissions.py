"""A repository's members: the accounts with a permission on it (`read`, `write`, `admin`), and
their management API (issue 25 §2).

`/api/v1/repositories/{repo}/members[/{account}]` lists them (by account name, a page at a time,
with each account's level and whether it is an administrator of the whole installation or
disabled), gives one a level (PUT) or takes it away (DELETE). `/permissions` is the same family
under its first name, kept for the clients that use it.

Only an administrator or the repository's own admins manage them (SPEC §5). A repository the
caller may not read answers as if it did not exist (shared/download/catalog.py), so management
cannot probe names. A change notifies `arkvory_credentials` (migration 0004): every process
drops the principals it cached, and the account's next request has exactly its new permissions.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import forget_cached
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import InvalidInput, NotFound

from .. import openapi
from ..identity.account_names import FOLDED_NAME, check_account_name, fold
from ..idempotency import idempotent
from ..pagination import ListQuery, SortColumn, page_cursor, page_limit
from ..request_inputs import json_body, runtime_of
from .repositories import administered_repository

LEVELS = ("read", "write", "admin")


async def _administered(request: Request):
    return await administered_repository(request, "managing permissions")


def member_json(row: asyncpg.Record) -> dict[str, Any]:
    return {"account": row["name"], "accountId": str(row["account_id"]), "level": row["level"],
            "admin": row["is_admin"], "disabled": row["disabled"]}


# By name without regard to case, as the accounts list (the folded name is unique, migration 0012).
MEMBER_ORDER = (SortColumn('lower(a.name COLLATE "C")', "folded"),)


async def list_members(request: Request) -> Response:
    """By account name, `?limit=` per page and `?cursor=` to go on."""
    _, repo = await _administered(request)
    limit = page_limit(request)
    listing = ListQuery(
        "SELECT a.name, lower(a.name COLLATE \"C\") AS folded, p.account_id, p.level, a.is_admin, a.disabled FROM arkvory_repository_permissions p"
        " JOIN arkvory_accounts a ON a.id = p.account_id",
        MEMBER_ORDER,
    ).where("p.repository_id = {}", repo.id)
    listing.after(page_cursor(request, MEMBER_ORDER))
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, member_json))


async def _account(conn: asyncpg.Connection, name: str) -> asyncpg.Record:
    """The account's id and its name as stored, found by `name` in any case."""
    account = await conn.fetchrow(
        f"SELECT id, name FROM arkvory_accounts WHERE {FOLDED_NAME} = $1", fold(name), timeout=POOLED_QUERY_TIMEOUT_S
    )
    if account is None:
        raise NotFound(f"no account {name!r}")
    return account


async def set_permission(request: Request) -> Response:
    principal, repo = await _administered(request)
    name = check_account_name(request.path_params["account"])
    body = await json_body(request)
    level = body.get("level")
    if level not in LEVELS:
        raise InvalidInput("'level' must be 'read', 'write' or 'admin'")

    async def work(conn: asyncpg.Connection):
        account = await _account(conn, name)
        await conn.execute(
            "INSERT INTO arkvory_repository_permissions (repository_id, account_id, level)"
            " VALUES ($1, $2, $3) ON CONFLICT (repository_id, account_id) DO UPDATE SET level = excluded.level",
            repo.id, account["id"], level,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        return 200, {"repository": repo.name, "account": account["name"], "level": level}

    answer = await idempotent(request, principal, {"level": level}, work)
    forget_cached(runtime_of(request).credentials)
    return answer


async def delete_permission(request: Request) -> Response:
    principal, repo = await _administered(request)
    name = check_account_name(request.path_params["account"])

    async def work(conn: asyncpg.Connection):
        account_id = (await _account(conn, name))["id"]
        deleted = await conn.fetchval(
            "DELETE FROM arkvory_repository_permissions WHERE repository_id = $1 AND account_id = $2"
            " RETURNING level",
            repo.id, account_id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if deleted is None:
            raise NotFound(f"{name!r} has no permission on {repo.name!r}")
        return 204, None

    answer = await idempotent(request, principal, {}, work)
    forget_cached(runtime_of(request).credentials)
    return answer


# `members` and its first name, `permissions`: one family, the same handlers.
_FAMILIES = ("members", "permissions")
routes = [
    route
    for family in _FAMILIES
    for route in (
        Route(f"/api/v1/repositories/{{repo}}/{family}", list_members, methods=["GET"]),
        Route(f"/api/v1/repositories/{{repo}}/{family}/{{account}}", set_permission, methods=["PUT"]),
        Route(f"/api/v1/repositories/{{repo}}/{family}/{{account}}", delete_permission, methods=["DELETE"]),
    )
]


_ACCOUNT_PARAM = {"name": "account", "in": "path", "required": True, "description": "Account name.",
                  "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"}}
_LEVEL = {"type": "string", "enum": list(LEVELS)}

_MEMBER = {
    "type": "object", "required": ["account", "accountId", "level", "admin", "disabled"],
    "properties": {
        "account": {"type": "string"}, "accountId": {"type": "string", "format": "uuid"}, "level": _LEVEL,
        "admin": {"type": "boolean", "description": "an administrator of the whole installation (may do"
                  " everything there, whatever the level)"},
        "disabled": {"type": "boolean", "description": "a disabled account acts on nothing until enabled"},
    },
}


def _family(name: str, deprecated: bool) -> dict[str, Any]:
    first = {"deprecated": True, "description": "The first name of /members: the same routes."} if deprecated else {}
    return {
        f"/api/v1/repositories/{{repo}}/{name}": {"get": {
            "summary": "The repository's members: the accounts with a permission on it, by name, a page at a time"
            " (admin or its repository admins); administrators and keys with a matching scope have access too",
            **first,
            "parameters": [openapi.repo_param(), *openapi.page_params()],
            "responses": {
                "200": {"description": "One page", "content": openapi.json_content(openapi.page_of(_MEMBER))},
                **openapi.errors(400, 401, 403, 404),
            },
        }},
        f"/api/v1/repositories/{{repo}}/{name}/{{account}}": {
            "put": {
                "summary": "Give an account read, write or admin on the repository (replaces its level)",
                **first,
                "parameters": [openapi.repo_param(), _ACCOUNT_PARAM, openapi.IDEMPOTENCY_KEY],
                "requestBody": openapi.json_body({"type": "object", "required": ["level"], "properties": {"level": _LEVEL}}),
                "responses": {
                    "200": {"description": "Set", "content": openapi.json_content({
                        "type": "object", "required": ["repository", "account", "level"],
                        "properties": {"repository": {"type": "string"}, "account": {"type": "string"}, "level": _LEVEL}})},
                    **openapi.errors(400, 401, 403, 404, 409, 413, 422),
                },
            },
            "delete": {
                "summary": "Take an account's permission on the repository away",
                **first,
                "parameters": [openapi.repo_param(), _ACCOUNT_PARAM, openapi.IDEMPOTENCY_KEY],
                "responses": {"204": {"description": "Removed"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
            },
        },
    }


OPENAPI_PATHS: dict[str, Any] = {**_family("members", False), **_family("permissions", True)}
