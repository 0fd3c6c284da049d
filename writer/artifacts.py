"""Writer routes for artifacts: the small-file upload shortcut, list, show and delete (SPEC §6).

An upload streams into a temporary file inside ARKVORY_DATA_DIR while its SHA-256 is computed
(in batches, in a worker thread: writer/upload_store.py). Only once it is complete is it staged
to the storage (an object store receives the bytes then, outside any transaction; a directory
needs nothing), and one transaction claims its digest, checks that no removal of an identical
old blob got in the way since the staging (writer/maintenance/blob_locks.py; if one did, the
bytes are staged again: `publish_blob`), publishes the blob under its digest and inserts the
blob and artifact rows with the Idempotency-Key: an interrupted body leaves neither an artifact
nor a stray file, and a retry with the same key replays the first artifact instead of creating
a second. A store that fails meanwhile, or a removal of the same bytes that the store does not
finish within 30 s, answers 503 `unavailable` (retry later, with the same key) and nothing is
visible.

Delete removes the metadata at once; the blob stays for the cleanup task. An artifact that a
package version or an asset still points at cannot be deleted (409): a published version is
immutable, and an asset would otherwise point at nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import asyncpg
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import Repository, check_text, parse_uuid, repository_for_read
from arkvory.shared.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge, Unavailable
from arkvory.shared.http.bodies import declared_length
from arkvory.shared.http.media_types import upload_media_type
from arkvory.shared.metrics import Metrics
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, StorageError, is_out_of_space, out_of_space
from arkvory.shared.storage.upload_files import hold_in_use, remove_own_file

from .idempotency import HeldKey, Result, holding_key, idempotent
from .maintenance.blob_locks import (
    RemovalUnderWay,
    RemovedSinceStaging,
    Staging,
    before_staging,
    check_not_removed_since,
    claim_for_upload,
)
from .maintenance.diagnostics import clear_diagnostic
from .maintenance.quarantine import notify_moved
from .openapi import ERROR, IDEMPOTENCY_KEY, errors, json_content, page_of, page_params, query_param, repo_param
from .pagination import page, page_cursor, page_limit
from .repositories import principal_of, repository_for_write, runtime_of
from .upload_places import UploadPlaces
from .upload_store import BatchedReceiver, Region, refuse_form_upload

MAX_NAME = 255

log = logging.getLogger("arkvory.artifacts")


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
    }


@contextlib.asynccontextmanager
async def received_body(
    request: Request, storage: BlobStorage, settings: Settings, metrics: Metrics
) -> AsyncIterator[tuple[pathlib.Path, str, int]]:
    """Stream the body to a temp file (fsynced); yields (temp path, sha256, size). The caller
    places it with `place_claimed_blob` inside its publishing transaction; the temp file is
    removed when the block ends, whatever happened.

    Bounded before and while reading: a declared length above ARKVORY_MAX_ARTIFACT_BYTES is
    413 before a byte is read, a sent body as soon as it passes it; a disk that is full or
    would fall below ARKVORY_MIN_FREE_BYTES is 507 (checked per batch). A body that sends no
    byte for the receive timeout is 408."""
    expected = declared_length(request)
    limit = settings.max_artifact_bytes
    if expected is not None and expected > limit:
        raise PayloadTooLarge(f"an artifact may have at most {limit} bytes (ARKVORY_MAX_ARTIFACT_BYTES)")
    storage.require_room(expected or 0, settings.min_free_bytes)
    size = limit if expected is None else expected
    regions = [Region(0, 0, size, None)] if size else []
    partial = storage.tmp / f"upload-{uuid.uuid4().hex}"
    fd: int | None = None
    try:
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            # Held in use until it is published or removed: the sweep of stale temp files
            # leaves it however slowly the body arrives (shared/storage/upload_files.py).
            hold_in_use(fd)
            receiver = BatchedReceiver(
                fd, regions, storage=storage, reserve=settings.min_free_bytes, check_room=True,
                open_ended=expected is None,
            )
            await receiver.receive(request, settings, _nothing_to_record, metrics)
            await asyncio.to_thread(os.fsync, fd)
        except OSError as exc:
            if is_out_of_space(exc):
                raise out_of_space(exc) from None
            raise
        region = regions[0] if regions else Region(0, 0, 0, None)
        yield partial, region.digest.hexdigest(), region.filled
    finally:
        await remove_own_file(partial, fd)  # unless published; in a thread: it may be large


STORAGE_RETRY_AFTER_S = 5


def storage_failed(exc: StorageError) -> Unavailable:
    """The 503 an upload answers when the store fails it: nothing was made visible, and the
    same request (the same Idempotency-Key, or `complete` again) finishes it later."""
    return Unavailable(
        f"the storage could not take the blob now ({exc.message}); nothing was published: retry"
        " later", retry_after=STORAGE_RETRY_AFTER_S,
    )


async def stage_blob(storage: BlobStorage, source: str | os.PathLike, sha256: str, size: int) -> None:
    """Before the publishing transaction: bring the verified bytes to the storage (an object
    store's upload; nothing for a directory). A failure is a 503 and leaves nothing visible."""
    try:
        await storage.stage(source, sha256, size)
    except StorageError as exc:
        raise storage_failed(exc) from None


PUBLISH_ATTEMPTS = 3  # a removal of the same bytes gets in the way at most this often
REMOVAL_RETRY_AFTER_S = 5

T = TypeVar("T")


async def publish_blob(
    pool: asyncpg.Pool, storage: BlobStorage, source: str | os.PathLike, sha256: str, size: int,
    publish: Callable[[Staging], Awaitable[T]], *, staged_already: Callable[[], Awaitable[bool]] | None = None,
) -> T:
    """Stage the verified bytes (`stage_blob`, or `staged_already()` when it says it did) and run
    `publish(staging)`, the publishing transaction, which calls `place_claimed_blob` with
    `staging`. A removal of the digest that got in the way (writer/maintenance/blob_locks.py) is
    waited for, without a transaction, and the bytes are staged again; one that does not
    settle in time is a 503, and nothing is published."""
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        try:
            staging = await before_staging(pool, sha256)
        except RemovalUnderWay:
            raise Unavailable(
                "the storage has not finished removing an earlier copy of these bytes (a cleanup"
                " task); nothing was published: retry later", retry_after=REMOVAL_RETRY_AFTER_S,
            ) from None
        if attempt > 1 or staged_already is None or not await staged_already():
            await stage_blob(storage, source, sha256, size)
        try:
            return await publish(staging)
        except RemovedSinceStaging:
            log.info("upload of %s: a removal of the same bytes got in the way; staging them again", sha256)
    raise Unavailable(
        "cleanup kept removing an earlier copy of these bytes while they were published; nothing"
        " was published: retry later", retry_after=REMOVAL_RETRY_AFTER_S,
    )


async def place_claimed_blob(
    conn: asyncpg.Connection, storage: BlobStorage, source: str | os.PathLike, sha256: str, size: int,
    staging: Staging, *, link: bool = False,
) -> None:
    """Inside a publishing transaction (`publish_blob`): claim the digest, check that no
    removal of it got in the way since `staging` (RemovedSinceStaging: roll back, and
    `publish_blob` stages again; writer/maintenance/blob_locks.py), publish the blob under it
    (a directory replaces a file already there, which nobody has checked since:
    shared/storage/directory.py `place_blob`; an object store has it from the staging) and insert
    its row. The claim lasts until the commit that makes the artifact visible, so cleanup cannot
    remove the blob between our publishing it and our reference to it.

    `source` holds bytes whose digest the caller computed, so the blob is good again: its
    storage diagnostic (missing, or corrupt) goes in the same transaction, and at the commit
    every process drops a cached descriptor of a file we replaced (it may be a rotten one)."""
    await claim_for_upload(conn, sha256)
    await check_not_removed_since(conn, sha256, staging)
    try:
        replaced = await storage.publish(source, sha256, size, link=link)
    except OSError as exc:
        if is_out_of_space(exc):
            raise out_of_space(exc) from None
        raise
    except StorageError as exc:
        raise storage_failed(exc) from None
    await conn.execute(
        "INSERT INTO arkvory_blobs (sha256, size) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        sha256, size, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    await clear_diagnostic(conn, sha256)
    if replaced:
        await notify_moved(conn, sha256)


async def _nothing_to_record(region: Region) -> None:
    """A one-shot body is one region; it is recorded by the artifact row."""


async def upload_artifact(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    refuse_form_upload(request)
    name = check_artifact_name(request.query_params.get("name", ""))
    media_type = upload_media_type(
        request.query_params.get("mediaType"), request.headers.get("content-type")
    )
    declared_length(request)  # a malformed Content-Length is refused before taking a place
    runtime = runtime_of(request)
    assert runtime.storage is not None
    places: UploadPlaces = request.app.state.upload_places
    # The key is held while the body streams (a concurrent duplicate gets 409 at once, before
    # the 503 its principal's full share of places would give) and recorded in the transaction
    # that inserts the artifact (a retry replays it).
    async with holding_key(request, principal) as held:
        with places.hold(principal.id):
            try:
                async with received_body(request, runtime.storage, runtime.settings, runtime.metrics) as body:
                    return await _publish_received(request, held, repo, name, media_type, *body)
            except ClientDisconnect:
                return Response(status_code=400)  # nobody is listening; nothing was kept


async def _publish_received(
    request: Request, held: HeldKey, repo: Repository, name: str, media_type: str,
    partial: pathlib.Path, sha256: str, size: int,
) -> Response:
    runtime = runtime_of(request)
    storage, pool = runtime.storage, runtime.pool
    assert storage is not None and pool is not None
    parts = {"query": {"name": name, "mediaType": media_type}, "sha256": sha256, "size": size}

    async def publish(staging: Staging) -> Response:
        return await held.run(parts, lambda conn: publish_in(conn, staging))

    async def publish_in(conn: asyncpg.Connection, staging: Staging) -> Result:
        await place_claimed_blob(conn, storage, partial, sha256, size, staging)
        row = await conn.fetchrow(
            "INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type)"
            " VALUES ($1, $2, $3, $4, $5, $6)"
            " RETURNING id, name, sha256, size, media_type, created_at",
            uuid.uuid4(), repo.id, name, sha256, size, media_type,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        return Result(201, artifact_json(row), {"Location": _location(repo.name, row["id"])})

    return await publish_blob(pool, storage, partial, sha256, size, publish)


def _location(repo_name: str, artifact_id: uuid.UUID) -> str:
    return f"/api/v1/repositories/{repo_name}/artifacts/{artifact_id}"


_SELECT = "SELECT id, name, sha256, size, media_type, created_at FROM arkvory_artifacts"


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


async def list_artifacts(request: Request) -> Response:
    """Oldest first, `?limit=` per page and `?cursor=` to go on; `?name=` keeps one name."""
    runtime = runtime_of(request)
    assert runtime.pool is not None
    limit = page_limit(request)
    after = page_cursor(request, ("createdAt", "id"))
    name = request.query_params.get("name")
    if name is not None:
        check_text(name, "query parameter 'name'", MAX_NAME)
    after_time, after_id = None, None
    if after is not None:
        try:
            after_time = datetime.datetime.fromisoformat(after[0])
            after_id = uuid.UUID(after[1])
        except ValueError:
            raise InvalidInput("query parameter 'cursor' is not a cursor this list returned") from None
        if after_time.tzinfo is None:
            raise InvalidInput("query parameter 'cursor' is not a cursor this list returned")
    principal = await principal_of(request)
    async with pooled(runtime.pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        rows = await conn.fetch(
            f"{_SELECT} WHERE repository_id = $1 AND ($2::text IS NULL OR name = $2)"
            " AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4::uuid))"
            " ORDER BY created_at, id LIMIT $5",
            repo.id, name, after_time, after_id, limit + 1,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return JSONResponse(
        page(rows, limit, artifact_json, lambda r: [r["created_at"].isoformat(), str(r["id"])])
    )


async def delete_artifact(request: Request) -> Response:
    """Metadata goes at once (the blob stays for cleanup); 409 while a package or asset uses it."""
    artifact_id = parse_uuid(request.path_params["artifact_id"], "artifact id")
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)

    async def work(conn: asyncpg.Connection) -> Result:
        row = await conn.fetchrow(
            "SELECT EXISTS (SELECT 1 FROM arkvory_packages WHERE artifact_id = $1) AS packaged,"
            " EXISTS (SELECT 1 FROM arkvory_assets WHERE artifact_id = $1) AS pointed,"
            " EXISTS (SELECT 1 FROM arkvory_artifacts WHERE id = $1 AND repository_id = $2) AS found",
            artifact_id, repo.id, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if not row["found"]:
            raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
        if row["packaged"] or row["pointed"]:
            what = "a package version" if row["packaged"] else "an asset"
            raise Conflict(f"artifact {artifact_id} is still used by {what}; remove that first")
        # A package or asset that starts pointing here meanwhile fails this delete on its
        # foreign key (409 too): never a dangling reference.
        await conn.execute(
            "DELETE FROM arkvory_artifacts WHERE id = $1 AND repository_id = $2",
            artifact_id, repo.id, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        return Result(204)

    response = await idempotent(request, principal, {}, work)
    runtime_of(request).catalog.invalidate()  # our own next download must not find it
    return response


routes = [
    Route("/api/v1/repositories/{repo}/artifacts", upload_artifact, methods=["POST"]),
    Route("/api/v1/repositories/{repo}/artifacts", list_artifacts, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/artifacts/{artifact_id}", show_artifact, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/artifacts/{artifact_id}", delete_artifact, methods=["DELETE"]),
]


def _openapi_paths() -> dict:
    artifact = {"type": "object", "required": ["id", "name", "sha256", "size", "mediaType", "createdAt"],
                "properties": {"id": {"type": "string", "format": "uuid"}, "name": {"type": "string"},
                               "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                               "size": {"type": "integer"}, "mediaType": {"type": "string"},
                               "createdAt": {"type": "string", "format": "date-time"}}}
    artifact_id = {"name": "artifact_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    name = {"type": "string", "minLength": 1, "maxLength": MAX_NAME}
    return {
        "/api/v1/repositories/{repo}/artifacts": {
            "post": {
                "summary": "Upload a small file in one request (the raw body; not a multipart form)",
                "description": "The body is the file (`curl --data-binary @file`); a multipart form is 415. "
                               "At most ARKVORY_MAX_ARTIFACT_BYTES (413); a full disk or one that would fall below "
                               "ARKVORY_MIN_FREE_BYTES is 507 and keeps nothing. With an Idempotency-Key a retry "
                               "replays the first artifact.",
                "parameters": [
                    repo_param(), query_param("name", "The artifact's file name.", required=True, schema=name),
                    query_param("mediaType", "Media type (else Content-Type, else application/octet-stream)."),
                    IDEMPOTENCY_KEY,
                ],
                "requestBody": {"required": True, "content": {"application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"}}}},
                "responses": {"201": {"description": "Stored.", "headers": {"Location": {"schema": {"type": "string"}}},
                                      "content": json_content(artifact)},
                              "415": ERROR, **errors(400, 401, 403, 404, 408, 409, 413, 422, 507)},
            },
            "get": {
                "summary": "List artifacts, oldest first, a page at a time",
                "security": [{}, {"bearer": []}],
                "parameters": [repo_param(), query_param("name", "Only artifacts with this name.", schema=name),
                               *page_params()],
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
