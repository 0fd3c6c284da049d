"""Writer routes for packages: `group/name/version` pointing at an artifact (SPEC §6).

A version is immutable once published: registering it again with the same artifact answers the
existing one (200), with another artifact 409. Deleting a version removes its metadata at once
(an administrator's correction; the artifact and its blob stay), after which it may be
registered again.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import MAX_PACKAGE_FIELD, check_text, repository_for_read
from arkvory.shared.errors import Conflict, InvalidInput, NotFound

from .. import openapi
from ..idempotency import Result, idempotent
from ..pagination import NEWEST, OLDEST, ListQuery, SortColumn, page_cursor, page_limit, page_order, text_filter
from .repositories import artifact_in, forget_cached_lookups, repository_in, writable_name
from ..request_inputs import json_body, principal_of, query, runtime_of

FIELDS = ("group", "name", "version")


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise InvalidInput(f"'{name}' must be a string")
    return check_text(value, f"'{name}'", MAX_PACKAGE_FIELD)


def _query_text(request: Request, name: str, required: bool) -> str | None:
    value = query(request, name)
    if value is None:
        if required:
            raise InvalidInput(f"query parameter '{name}' is required")
        return None
    return check_text(value, f"query parameter '{name}'", MAX_PACKAGE_FIELD)


def package_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "group": row["group_name"],
        "name": row["name"],
        "version": row["version"],
        "artifactId": str(row["artifact_id"]),
        "publishedAt": row["published_at"].isoformat(),
    }


_COLUMNS = "group_name, name, version, artifact_id, published_at"


async def register_package(request: Request) -> Response:
    principal = await principal_of(request)
    repo_name = await writable_name(request, principal)
    body = await json_body(request)
    group, name, version = (_text(body, k) for k in FIELDS)
    artifact_value = body.get("artifactId")

    async def work(conn: asyncpg.Connection) -> Result:
        repo = await repository_in(conn, repo_name)
        artifact_id = await artifact_in(conn, repo, artifact_value)
        row = await conn.fetchrow(
            "INSERT INTO arkvory_packages (repository_id, group_name, name, version, artifact_id)"
            f" VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING {_COLUMNS}",
            repo.id, group, name, version, artifact_id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is not None:
            return Result(201, package_json(row))
        existing = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM arkvory_packages WHERE repository_id = $1"
            " AND group_name = $2 AND name = $3 AND version = $4",
            repo.id, group, name, version,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if existing is None:  # deleted between the two statements
            raise Conflict("the request conflicts with a concurrent change; read the state and retry")
        if existing["artifact_id"] != artifact_id:
            raise Conflict(f"{group}/{name}/{version} is already published with another artifact")
        return Result(200, package_json(existing))

    parts = {"group": group, "name": name, "version": version, "artifactId": artifact_value}
    return await idempotent(request, principal, parts, work)


# The list's orders: by coordinates in byte order (the default), or by publication time.
NAME_ORDER = tuple(SortColumn(f'{column} COLLATE "C"', column) for column in ("group_name", "name", "version"))
TIME_ORDER = (SortColumn("published_at", "published_at", "timestamptz"), *NAME_ORDER)
ORDERS = ("name", NEWEST, OLDEST)


def packages_listing(
    repository_id: uuid.UUID, *, order: str = "name", group: str | None = None, name: str | None = None,
    prefix: str | None = None, cursor: tuple | None = None,
) -> ListQuery:
    """One page of a repository's package versions; indexes in byte order serve each order, a
    group, a name and a name prefix (shared/migrations/0017_list_indexes.sql)."""
    key = NAME_ORDER if order == "name" else TIME_ORDER
    listing = ListQuery(f"SELECT {_COLUMNS} FROM arkvory_packages", key, descending=order == NEWEST)
    listing.where("repository_id = {}", repository_id)
    if group is not None:
        listing.where('group_name COLLATE "C" = {}', group)
    if name is not None:
        listing.where('name COLLATE "C" = {}', name)
    listing.starts_with('name COLLATE "C"', prefix)
    return listing.after(cursor)


async def list_packages(request: Request) -> Response:
    """Sorted by group, name, version (byte order), or newest or oldest first; `group` and
    `name` narrow the list, `prefix` keeps the names that start with it."""
    principal = await principal_of(request)
    group, name = _query_text(request, "group", False), _query_text(request, "name", False)
    prefix = text_filter(request, "prefix", MAX_PACKAGE_FIELD)
    order = page_order(request, "name", ORDERS)
    limit = page_limit(request)
    cursor = page_cursor(request, NAME_ORDER if order == "name" else TIME_ORDER)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        listing = packages_listing(repo.id, order=order, group=group, name=name, prefix=prefix, cursor=cursor)
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, package_json))


async def show_package(request: Request) -> Response:
    principal = await principal_of(request)
    group, name, version = (_query_text(request, k, True) for k in FIELDS)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM arkvory_packages WHERE repository_id = $1"
            " AND group_name = $2 AND name = $3 AND version = $4",
            repo.id, group, name, version,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    if row is None:
        raise NotFound(f"no package {group}/{name}/{version} in {repo.name!r}")
    return JSONResponse(package_json(row))


async def delete_package(request: Request) -> Response:
    principal = await principal_of(request)
    repo_name = await writable_name(request, principal)
    group, name, version = (_query_text(request, k, True) for k in FIELDS)

    async def work(conn: asyncpg.Connection) -> Result:
        repo = await repository_in(conn, repo_name)
        deleted = await conn.fetchval(
            "DELETE FROM arkvory_packages WHERE repository_id = $1"
            " AND group_name = $2 AND name = $3 AND version = $4 RETURNING 1",
            repo.id, group, name, version,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if not deleted:
            raise NotFound(f"no package {group}/{name}/{version} in {repo.name!r}")
        return Result(204)

    response = await idempotent(request, principal, {"group": group, "name": name, "version": version}, work)
    forget_cached_lookups(request)
    return response


routes = [
    Route("/api/v1/repositories/{repo}/packages", register_package, methods=["PUT", "POST"]),
    Route("/api/v1/repositories/{repo}/packages", list_packages, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/package", show_package, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/package", delete_package, methods=["DELETE"]),
]

_FIELD = {"type": "string", "minLength": 1, "maxLength": MAX_PACKAGE_FIELD}
_PACKAGE = {
    "type": "object",
    "required": ["group", "name", "version", "artifactId", "publishedAt"],
    "properties": {
        "group": _FIELD, "name": _FIELD, "version": _FIELD,
        "artifactId": {"type": "string", "format": "uuid"},
        "publishedAt": {"type": "string", "format": "date-time"},
    },
}


def _register(method: str) -> dict[str, Any]:
    return {
        "summary": "Register an artifact as group/name/version (immutable once published)",
        "operationId": f"{method}Package",
        "parameters": [openapi.repo_param(), openapi.IDEMPOTENCY_KEY],
        "requestBody": openapi.json_body({
            "type": "object",
            "required": ["group", "name", "version", "artifactId"],
            "properties": {"group": _FIELD, "name": _FIELD, "version": _FIELD, "artifactId": {"type": "string", "format": "uuid"}},
        }),
        "responses": {
            "201": {"description": "Published", "content": openapi.json_content(_PACKAGE)},
            "200": {"description": "Already published with this artifact", "content": openapi.json_content(_PACKAGE)},
            **openapi.errors(400, 401, 403, 404, 409, 413, 422),
        },
    }


def _coordinates(required: bool) -> list[dict[str, Any]]:
    return [openapi.query_param(k, f"Package {k}.", required=required, schema=_FIELD) for k in FIELDS]


OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/repositories/{repo}/packages": {
        "put": _register("put"),
        "post": _register("post"),
        "get": {
            "summary": "List package versions (sorted by group, name, version, or newest or oldest first)",
            "security": openapi.ANONYMOUS_TOO,
            "parameters": [openapi.repo_param(), *_coordinates(False)[:2], openapi.prefix_param("name", MAX_PACKAGE_FIELD),
                           openapi.order_param("name", ORDERS, sorted_by="publication time; `name`: by group, name, "
                                               "version in byte order"),
                           *openapi.page_params()],
            "responses": {
                "200": {"description": "One page", "content": openapi.json_content(openapi.page_of(_PACKAGE))},
                **openapi.errors(400, 401, 404),
            },
        },
    },
    "/api/v1/repositories/{repo}/package": {
        "get": {
            "summary": "Show one package version",
            "security": openapi.ANONYMOUS_TOO,
            "parameters": [openapi.repo_param(), *_coordinates(True)],
            "responses": {
                "200": {"description": "The version", "content": openapi.json_content(_PACKAGE)},
                **openapi.errors(400, 401, 404),
            },
        },
        "delete": {
            "summary": "Delete one package version (metadata at once; the artifact stays)",
            "parameters": [openapi.repo_param(), *_coordinates(True), openapi.IDEMPOTENCY_KEY],
            "responses": {"204": {"description": "Deleted"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
        },
    },
}
