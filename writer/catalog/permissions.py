"""Repository permissions for accounts (`read`, `write`, `admin`) and their management API.

Only an administrator or the repository's own admins manage them. A repository the caller may
not read answers as if it did not exist (shared/download/catalog.py), so management cannot probe names.
A change notifies `arkvory_credentials` (migration 0004): every process drops the principals it
cached, and the account's next request has exactly its new permissions.
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
from ..request_inputs import json_body, runtime_of
from .repositories import administered_repository

LEVELS = ("read", "write", "admin")


async def _administered(request: Request):
    return await administered_repository(request, "managing permissions")


async def list_permissions(request: Request) -> Response:
    _, repo = await _administered(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await conn.fetch(
            "SELECT a.name, p.level FROM arkvory_repository_permissions p"
            " JOIN arkvory_accounts a ON a.id = p.account_id WHERE p.repository_id = $1 ORDER BY a.name",
            repo.id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return JSONResponse({"items": [{"account": r["name"], "level": r["level"]} for r in rows]})


async def _account_id(conn: asyncpg.Connection, name: str):
    account_id = await conn.fetchval(
        f"SELECT id FROM arkvory_accounts WHERE {FOLDED_NAME} = $1", fold(name), timeout=POOLED_QUERY_TIMEOUT_S
    )
    if account_id is None:
        raise NotFound(f"no account {name!r}")
    return account_id


async def set_permission(request: Request) -> Response:
    principal, repo = await _administered(request)
    name = check_account_name(request.path_params["account"])
    body = await json_body(request)
    level = body.get("level")
    if level not in LEVELS:
        raise InvalidInput("'level' must be 'read', 'write' or 'admin'")

    async def work(conn: asyncpg.Connection):
        account_id = await _account_id(conn, name)
        await conn.execute(
            "INSERT INTO arkvory_repository_permissions (repository_id, account_id, level)"
            " VALUES ($1, $2, $3) ON CONFLICT (repository_id, account_id) DO UPDATE SET level = excluded.level",
            repo.id, account_id, level,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        return 200, {"repository": repo.name, "account": name, "level": level}

    answer = await idempotent(request, principal, {"level": level}, work)
    forget_cached(runtime_of(request).credentials)
    return answer


async def delete_permission(request: Request) -> Response:
    principal, repo = await _administered(request)
    name = check_account_name(request.path_params["account"])

    async def work(conn: asyncpg.Connection):
        account_id = await _account_id(conn, name)
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


routes = [
    Route("/api/v1/repositories/{repo}/permissions", list_permissions, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/permissions/{account}", set_permission, methods=["PUT"]),
    Route("/api/v1/repositories/{repo}/permissions/{account}", delete_permission, methods=["DELETE"]),
]


_ACCOUNT_PARAM = {"name": "account", "in": "path", "required": True, "description": "Account name.",
                  "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"}}
_LEVEL = {"type": "string", "enum": list(LEVELS)}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/repositories/{repo}/permissions": {"get": {
        "summary": "The accounts' permissions on a repository (admin or its repository admins)",
        "parameters": [openapi.repo_param()],
        "responses": {
            "200": {"description": "Permissions", "content": openapi.json_content({
                "type": "object", "required": ["items"], "properties": {"items": {"type": "array", "items": {
                    "type": "object", "required": ["account", "level"],
                    "properties": {"account": {"type": "string"}, "level": _LEVEL}}}}})},
            **openapi.errors(400, 401, 403, 404),
        },
    }},
    "/api/v1/repositories/{repo}/permissions/{account}": {
        "put": {
            "summary": "Give an account read, write or admin on the repository (replaces its level)",
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
            "parameters": [openapi.repo_param(), _ACCOUNT_PARAM, openapi.IDEMPOTENCY_KEY],
            "responses": {"204": {"description": "Removed"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
        },
    },
}
