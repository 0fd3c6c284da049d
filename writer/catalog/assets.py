"""Writer routes for assets: a named path pointing at an artifact, re-pointable, with history.

Every pointing (re-point or restore) appends to the path's history in the same transaction.
Deleting an asset removes the path and its history at once; the artifacts stay.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import MAX_ASSET_PATH, Repository, check_asset_path, repository_for_read
from arkvory.shared.errors import Conflict, InvalidInput, NotFound

from .. import openapi
from ..idempotency import Result, idempotent
from ..pagination import MAX_LIMIT, NEWEST, ListQuery, SortColumn, page_cursor, page_limit, page_order, text_filter
from .repositories import artifact_in, forget_cached_lookups, repository_in, writable_name
from ..request_inputs import json_body, principal_of, query, runtime_of

DEFAULT_HISTORY = 100


def _path(request: Request) -> str:
    return check_asset_path(query(request, "path") or "")


def asset_json(row: asyncpg.Record) -> dict[str, Any]:
    return {"path": row["path"], "artifactId": str(row["artifact_id"]), "updatedAt": row["updated_at"].isoformat()}


def history_json(row: asyncpg.Record) -> dict[str, Any]:
    return {"id": row["id"], "artifactId": str(row["artifact_id"]), "pointedAt": row["pointed_at"].isoformat()}


async def _point(conn: asyncpg.Connection, repo: Repository, path: str, artifact_id) -> Result:
    row = await conn.fetchrow(
        "INSERT INTO arkvory_assets (repository_id, path, artifact_id) VALUES ($1, $2, $3)"
        " ON CONFLICT (repository_id, path) DO UPDATE"
        " SET artifact_id = excluded.artifact_id, updated_at = now()"
        " RETURNING path, artifact_id, updated_at",
        repo.id, path, artifact_id,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    await conn.execute(
        "INSERT INTO arkvory_asset_history (repository_id, path, artifact_id) VALUES ($1, $2, $3)",
        repo.id, path, artifact_id,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return Result(200, asset_json(row))


async def point_asset(request: Request) -> Response:
    principal = await principal_of(request)
    repo_name = await writable_name(request, principal)
    path = _path(request)
    body = await json_body(request)
    artifact_value = body.get("artifactId")

    async def work(conn: asyncpg.Connection) -> Result:
        repo = await repository_in(conn, repo_name)
        return await _point(conn, repo, path, await artifact_in(conn, repo, artifact_value))

    response = await idempotent(request, principal, {"path": path, "artifactId": artifact_value}, work)
    forget_cached_lookups(request)
    return response


async def restore_asset(request: Request) -> Response:
    """Point the path again at the artifact of one of its history entries (`historyId`)."""
    principal = await principal_of(request)
    repo_name = await writable_name(request, principal)
    path = _path(request)
    body = await json_body(request)
    entry = body.get("historyId")
    if not isinstance(entry, int) or isinstance(entry, bool) or not 1 <= entry < 2**63:
        raise InvalidInput("'historyId' must be the id of an entry of this asset's history")

    async def work(conn: asyncpg.Connection) -> Result:
        repo = await repository_in(conn, repo_name)
        row = await conn.fetchrow(
            "SELECT h.artifact_id, a.id IS NOT NULL AS present FROM arkvory_asset_history h"
            " LEFT JOIN arkvory_artifacts a ON a.id = h.artifact_id AND a.repository_id = h.repository_id"
            " WHERE h.id = $1 AND h.repository_id = $2 AND h.path = $3",
            entry, repo.id, path,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no history entry {entry} for asset {path!r}")
        if not row["present"]:
            raise Conflict(f"the artifact of history entry {entry} was deleted; it cannot be restored")
        return await _point(conn, repo, path, row["artifact_id"])

    response = await idempotent(request, principal, {"path": path, "historyId": entry}, work)
    forget_cached_lookups(request)
    return response


PATH_ORDER = (SortColumn('path COLLATE "C"', "path"),)


def assets_listing(repository_id: uuid.UUID, *, prefix: str | None = None, cursor: tuple | None = None) -> ListQuery:
    """One page of a repository's assets, by path in byte order: (repository_id, path C) serves
    the order and the prefix's range."""
    listing = ListQuery("SELECT path, artifact_id, updated_at FROM arkvory_assets", PATH_ORDER)
    listing.where("repository_id = {}", repository_id).starts_with('path COLLATE "C"', prefix)
    return listing.after(cursor)


async def list_assets(request: Request) -> Response:
    """Sorted by path (byte order); `prefix` narrows the list."""
    principal = await principal_of(request)
    prefix = text_filter(request, "prefix", MAX_ASSET_PATH)
    limit = page_limit(request)
    cursor = page_cursor(request, PATH_ORDER)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        listing = assets_listing(repo.id, prefix=prefix, cursor=cursor)
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, asset_json))


async def show_asset(request: Request) -> Response:
    """The current target and the latest (or, `?order=oldest`, the first) `historyLimit`
    pointings; (repository_id, path, id) serves either direction."""
    principal = await principal_of(request)
    path = _path(request)
    raw = query(request, "historyLimit")
    raw = str(DEFAULT_HISTORY) if raw is None else raw
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and 0 <= int(raw) <= MAX_LIMIT):
        raise InvalidInput(f"query parameter 'historyLimit' must be an integer from 0 to {MAX_LIMIT}")
    direction = "DESC" if page_order(request, NEWEST) == NEWEST else "ASC"
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        row = await conn.fetchrow(
            "SELECT path, artifact_id, updated_at FROM arkvory_assets WHERE repository_id = $1 AND path = $2",
            repo.id, path,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no asset {path!r} in {repo.name!r}")
        history = await conn.fetch(
            "SELECT id, artifact_id, pointed_at FROM arkvory_asset_history"
            f" WHERE repository_id = $1 AND path = $2 ORDER BY id {direction} LIMIT $3",
            repo.id, path, int(raw),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return JSONResponse({**asset_json(row), "history": [history_json(h) for h in history]})


async def delete_asset(request: Request) -> Response:
    principal = await principal_of(request)
    repo_name = await writable_name(request, principal)
    path = _path(request)

    async def work(conn: asyncpg.Connection) -> Result:
        repo = await repository_in(conn, repo_name)
        deleted = await conn.fetchval(
            "DELETE FROM arkvory_assets WHERE repository_id = $1 AND path = $2 RETURNING 1",
            repo.id, path,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if not deleted:
            raise NotFound(f"no asset {path!r} in {repo.name!r}")
        await conn.execute(
            "DELETE FROM arkvory_asset_history WHERE repository_id = $1 AND path = $2",
            repo.id, path,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        return Result(204)

    response = await idempotent(request, principal, {"path": path}, work)
    forget_cached_lookups(request)
    return response


routes = [
    Route("/api/v1/repositories/{repo}/assets", point_asset, methods=["PUT"]),
    Route("/api/v1/repositories/{repo}/assets", list_assets, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/asset", show_asset, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/asset", delete_asset, methods=["DELETE"]),
    Route("/api/v1/repositories/{repo}/asset/restore", restore_asset, methods=["POST"]),
]

_PATH = {"type": "string", "minLength": 1, "maxLength": MAX_ASSET_PATH}
_ASSET_PROPERTIES = {
    "path": _PATH,
    "artifactId": {"type": "string", "format": "uuid"},
    "updatedAt": {"type": "string", "format": "date-time"},
}
_ASSET = {"type": "object", "required": list(_ASSET_PROPERTIES), "properties": _ASSET_PROPERTIES}
_HISTORY_ENTRY = {
    "type": "object",
    "required": ["id", "artifactId", "pointedAt"],
    "properties": {
        "id": {"type": "integer"},
        "artifactId": {"type": "string", "format": "uuid"},
        "pointedAt": {"type": "string", "format": "date-time"},
    },
}


def _path_param() -> dict[str, Any]:
    return openapi.query_param("path", "Asset path.", required=True, schema=_PATH)


_WRITE_ERRORS = openapi.errors(400, 401, 403, 404, 409, 413, 422)

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/repositories/{repo}/assets": {
        "put": {
            "summary": "Point an asset path at an artifact (re-pointable; each pointing is kept in its history)",
            "parameters": [openapi.repo_param(), _path_param(), openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body(
                {"type": "object", "required": ["artifactId"], "properties": {"artifactId": {"type": "string", "format": "uuid"}}}
            ),
            "responses": {"200": {"description": "Pointed", "content": openapi.json_content(_ASSET)}, **_WRITE_ERRORS},
        },
        "get": {
            "summary": "List assets (sorted by path, byte order)",
            "security": openapi.ANONYMOUS_TOO,
            "parameters": [
                openapi.repo_param(),
                openapi.prefix_param("path", MAX_ASSET_PATH),
                *openapi.page_params(),
            ],
            "responses": {
                "200": {"description": "One page", "content": openapi.json_content(openapi.page_of(_ASSET))},
                **openapi.errors(400, 401, 404),
            },
        },
    },
    "/api/v1/repositories/{repo}/asset": {
        "get": {
            "summary": "Show an asset and its history, newest (or oldest) first",
            "security": openapi.ANONYMOUS_TOO,
            "parameters": [
                openapi.repo_param(),
                _path_param(),
                openapi.query_param(
                    "historyLimit", f"History entries to include (default {DEFAULT_HISTORY}).",
                    schema={"type": "integer", "minimum": 0, "maximum": MAX_LIMIT},
                ),
                openapi.order_param("newest", sorted_by="pointing, of the history"),
            ],
            "responses": {
                "200": {
                    "description": "The asset",
                    "content": openapi.json_content({
                        "type": "object",
                        "required": [*_ASSET_PROPERTIES, "history"],
                        "properties": {**_ASSET_PROPERTIES, "history": {"type": "array", "items": _HISTORY_ENTRY}},
                    }),
                },
                **openapi.errors(400, 401, 404),
            },
        },
        "delete": {
            "summary": "Delete an asset path and its history (the artifacts stay)",
            "parameters": [openapi.repo_param(), _path_param(), openapi.IDEMPOTENCY_KEY],
            "responses": {"204": {"description": "Deleted"}, **openapi.errors(400, 401, 403, 404, 422)},
        },
    },
    "/api/v1/repositories/{repo}/asset/restore": {
        "post": {
            "summary": "Point the asset again at the artifact of an earlier history entry",
            "parameters": [openapi.repo_param(), _path_param(), openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body(
                {"type": "object", "required": ["historyId"], "properties": {"historyId": {"type": "integer", "minimum": 1}}}
            ),
            "responses": {"200": {"description": "Pointed", "content": openapi.json_content(_ASSET)}, **_WRITE_ERRORS},
        },
    },
}
