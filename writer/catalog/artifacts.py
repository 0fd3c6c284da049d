"""Writer routes for artifacts: list, show and delete (SPEC §6); an artifact's name, JSON form
and schema. (Uploads, the one-shot POST among them, are in writer/uploads/one_shot.py.)

Delete removes the metadata at once; the blob stays for the cleanup task. An artifact that a
package version or an asset still points at cannot be deleted (409): a published version is
immutable, and an asset would otherwise point at nothing. The asset-history entries that named
a deleted artifact go with it: what is left of a history can all be restored. Retention rules
(writer/maintenance/retention.py) delete through the same `delete_unused_artifacts`.
"""

from __future__ import annotations

import re
import uuid

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import check_text, parse_uuid, repository_for_read
from arkvory.shared.errors import Conflict, InvalidInput, NotFound

from ..idempotency import Result, idempotent
from ..openapi import (
    IDEMPOTENCY_KEY, errors, json_content, order_param, page_of, page_params, prefix_param, query_param, repo_param,
)
from ..pagination import NEWEST, OLDEST, TIME_ID, ListQuery, page_cursor, page_limit, page_order, text_filter
from .repositories import repository_for_write
from . import uploaders
from ..request_inputs import principal_of, query, runtime_of

MAX_NAME = 255
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def check_artifact_name(name: str, what: str = "query parameter 'name'") -> str:
    """A file name as clients will save it: no path separators, no `.`/`..`, no controls.
    `what` names where it came from (the one-shot query, or a session descriptor's field)."""
    check_text(name, what, MAX_NAME)
    if "/" in name or "\\" in name or name in (".", ".."):
        raise InvalidInput(f"{what} must be a file name: no '/', '\\', '.' or '..'")
    return name


def artifact_json(row) -> dict:
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "sha256": row["sha256"],
        "size": row["size"],
        "mediaType": row["media_type"],
        "createdAt": row["created_at"].isoformat(),
        "uploadedBy": uploaders.uploader_json(row),
    }




def artifact_location(repo_name: str, artifact_id: uuid.UUID) -> str:
    return f"/api/v1/repositories/{repo_name}/artifacts/{artifact_id}"


# What artifact_json reads: a SELECT's or an INSERT's RETURNING columns.
COLUMNS = f"id, name, sha256, size, media_type, created_at, {uploaders.COLUMNS}"
_SELECT = f"SELECT {COLUMNS} FROM arkvory_artifacts"


async def show_artifact(request: Request) -> Response:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    artifact_id = parse_uuid(request.path_params["artifact_id"], "artifact id")
    principal = await principal_of(request)
    async with pooled(runtime.pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        row = await conn.fetchrow(
            f"{_SELECT} WHERE repository_id = $1 AND id = $2", repo.id, artifact_id, timeout=POOLED_QUERY_TIMEOUT_S
        )
    if row is None:
        raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
    return JSONResponse(artifact_json(row))


def check_sha256_filter(value: str | None) -> str | None:
    if value is not None and not _SHA256.fullmatch(value):
        raise InvalidInput("query parameter 'sha256' must be a SHA-256: 64 hexadecimal digits")
    return None if value is None else value.lower()


def artifacts_listing(
    repository_id: uuid.UUID, *, order: str = OLDEST, name: str | None = None, prefix: str | None = None,
    sha256: str | None = None, cursor: tuple | None = None,
) -> ListQuery:
    """One page of a repository's artifacts: (repository_id, created_at, id) serves either order,
    (repository_id, name C, created_at, id) a name or a prefix, (sha256) a digest."""
    listing = ListQuery(_SELECT, TIME_ID, descending=order == NEWEST).where("repository_id = {}", repository_id)
    if name is not None:
        listing.where('name COLLATE "C" = {}', name)
    listing.starts_with('name COLLATE "C"', prefix)
    if sha256 is not None:
        listing.where("sha256 = {}", sha256)
    return listing.after(cursor)


async def list_artifacts(request: Request) -> Response:
    """Oldest first unless `?order=newest`, `?limit=` per page and `?cursor=` to go on; `?name=`
    keeps one name, `?prefix=` the names that start with it, `?sha256=` one content."""
    runtime = runtime_of(request)
    assert runtime.pool is not None
    limit = page_limit(request)
    order = page_order(request, OLDEST)
    name, prefix = text_filter(request, "name", MAX_NAME), text_filter(request, "prefix", MAX_NAME)
    sha256 = check_sha256_filter(query(request, "sha256"))
    cursor = page_cursor(request, TIME_ID)
    principal = await principal_of(request)
    async with pooled(runtime.pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        listing = artifacts_listing(repo.id, order=order, name=name, prefix=prefix, sha256=sha256, cursor=cursor)
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, artifact_json))


_LOCK = (
    "SELECT id FROM arkvory_artifacts WHERE id = ANY($1::uuid[]) AND repository_id = $2 ORDER BY id FOR UPDATE"
)
_DELETE_UNUSED = """
DELETE FROM arkvory_artifacts a
WHERE a.id = ANY($1::uuid[]) AND a.repository_id = $2
  AND NOT EXISTS (SELECT 1 FROM arkvory_packages p WHERE p.artifact_id = a.id)
  AND NOT EXISTS (SELECT 1 FROM arkvory_assets s WHERE s.artifact_id = a.id)
RETURNING a.id, a.name, a.sha256, a.size, a.media_type, a.created_at
"""


async def delete_unused_artifacts(
    conn: asyncpg.Connection, repository_id: uuid.UUID, ids: list[uuid.UUID]
) -> list[asyncpg.Record]:
    """Delete those of `ids` (artifacts of the repository) that no package version and no asset
    points at, and the asset-history entries that named them, in the caller's transaction;
    returns the rows deleted. Their blobs stay for the cleanup's unreferenced-blob step.

    The rows are locked first (in id order, so two deleters never deadlock), and the delete is a
    statement of its own after that: a package version or an asset being pointed at one of them
    has either committed by then (the delete sees it and keeps that artifact) or waits for our
    commit and then fails on its foreign key (409). Never a dangling reference."""
    if not ids:
        return []
    await conn.execute(_LOCK, ids, repository_id, timeout=POOLED_QUERY_TIMEOUT_S)
    rows = await conn.fetch(_DELETE_UNUSED, ids, repository_id, timeout=POOLED_QUERY_TIMEOUT_S)
    if rows:
        await conn.execute(
            "DELETE FROM arkvory_asset_history WHERE artifact_id = ANY($1::uuid[]) AND repository_id = $2",
            [r["id"] for r in rows], repository_id, timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return rows


async def delete_artifact(request: Request) -> Response:
    """Metadata goes at once (the blob stays for cleanup); 409 while a package or asset uses it."""
    artifact_id = parse_uuid(request.path_params["artifact_id"], "artifact id")
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)

    async def work(conn: asyncpg.Connection) -> Result:
        if await delete_unused_artifacts(conn, repo.id, [artifact_id]):
            return Result(204)
        row = await conn.fetchrow(
            "SELECT EXISTS (SELECT 1 FROM arkvory_packages WHERE artifact_id = $1) AS packaged,"
            " EXISTS (SELECT 1 FROM arkvory_artifacts WHERE id = $1 AND repository_id = $2) AS found",
            artifact_id, repo.id, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if not row["found"]:
            raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
        what = "a package version" if row["packaged"] else "an asset"
        raise Conflict(f"artifact {artifact_id} is still used by {what}; remove that first")

    response = await idempotent(request, principal, {}, work)
    runtime_of(request).catalog.invalidate()  # our own next download must not find it
    return response


routes = [
    Route("/api/v1/repositories/{repo}/artifacts", list_artifacts, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/artifacts/{artifact_id}", show_artifact, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/artifacts/{artifact_id}", delete_artifact, methods=["DELETE"]),
]


ARTIFACT_SCHEMA = {"type": "object", "required": ["id", "name", "sha256", "size", "mediaType", "createdAt", "uploadedBy"],
            "properties": {"id": {"type": "string", "format": "uuid"}, "name": {"type": "string"},
                           "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                           "size": {"type": "integer"}, "mediaType": {"type": "string"},
                           "createdAt": {"type": "string", "format": "date-time"},
                           "uploadedBy": uploaders.SCHEMA}}


def _openapi_paths() -> dict:
    artifact = ARTIFACT_SCHEMA
    artifact_id = {"name": "artifact_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    name = {"type": "string", "minLength": 1, "maxLength": MAX_NAME}
    return {
        "/api/v1/repositories/{repo}/artifacts": {
            "get": {
                "summary": "List artifacts, oldest (or newest) first, a page at a time; find them by name, "
                           "name prefix or SHA-256",
                "security": [{}, {"bearer": []}],
                "parameters": [repo_param(), query_param("name", "Only artifacts with this name.", schema=name),
                               prefix_param("name", MAX_NAME),
                               query_param("sha256", "Only artifacts with this content (its SHA-256, 64 hex digits).",
                                           schema={"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}),
                               order_param("oldest", sorted_by="upload time"), *page_params()],
                "responses": {"200": {"description": "A page.", "content": json_content(page_of(artifact))},
                              **errors(400, 401, 404)},
            },
        },
        "/api/v1/repositories/{repo}/artifacts/{artifact_id}": {
            "get": {"summary": "One artifact's metadata", "security": [{}, {"bearer": []}],
                    "parameters": [repo_param(), artifact_id],
                    "responses": {"200": {"description": "The artifact.", "content": json_content(artifact)},
                                  **errors(400, 401, 404)}},
            "delete": {"summary": "Delete an artifact's metadata (the blob stays for cleanup); 409 while a package "
                                  "version or an asset points at it",
                       "parameters": [repo_param(), artifact_id, IDEMPOTENCY_KEY],
                       "responses": {"204": {"description": "Deleted."}, **errors(400, 401, 403, 404, 409, 422)}},
        },
    }


OPENAPI_PATHS = _openapi_paths()
