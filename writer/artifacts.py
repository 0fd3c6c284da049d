"""Writer routes for artifacts: the small-file upload shortcut and metadata (SPEC §6).

An upload streams into a temporary file inside the storage directory while its SHA-256 is
computed, is renamed into the content-addressed store only once complete, and its metadata row
is committed last: an interrupted body leaves neither an artifact nor a stray file.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.bodies import ReceiveTimedOut, body_chunks, declared_length
from shared.catalog import QUERY_TIMEOUT_S, check_text, parse_uuid, pooled, repository_for_read
from shared.errors import Busy, InvalidInput, NotFound
from shared.media_types import upload_media_type
from shared.metrics import Metrics
from shared.storage import Storage

from .repositories import principal_of, repository_for_write, runtime_of

MAX_NAME = 255


def check_artifact_name(name: str) -> str:
    """A file name as clients will save it: no path separators, no `.`/`..`, no controls."""
    check_text(name, "query parameter 'name'", MAX_NAME)
    if "/" in name or "\\" in name or name in (".", ".."):
        raise InvalidInput("query parameter 'name' must be a file name: no '/', '\\', '.' or '..'")
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


def _fsync_directory(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


async def receive_into_store(
    request: Request, storage: Storage, timeout_s: float, metrics: Metrics
) -> tuple[str, int]:
    """Stream the body to a temp file, then rename it to its digest; returns (sha256, size).

    A body that sends no byte for `timeout_s` is aborted (its temp file removed), so a client
    that declared a large body and went silent cannot hold an upload place."""
    expected = declared_length(request)
    digest = hashlib.sha256()
    size = 0
    partial = storage.tmp / f"upload-{uuid.uuid4().hex}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            async for chunk in body_chunks(request, timeout_s):
                # uvicorn hands over at most 64 KiB at a time: hashing and a page-cache write
                # of that is well under a millisecond, cheaper than a thread hop.
                digest.update(chunk)
                _write_all(fd, chunk)
                size += len(chunk)
            await asyncio.to_thread(os.fsync, fd)
        except ReceiveTimedOut:
            metrics.transfer_aborts.labels(direction="upload", reason="receive_timeout").inc()
            raise
        finally:
            os.close(fd)
        if expected is not None and expected != size:
            raise InvalidInput("the body ended before Content-Length bytes arrived")
        sha256 = digest.hexdigest()
        final = storage.blob_path(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, final)  # identical content may already be there: same bytes
        # The metadata row is committed next: the rename must be on disk before it can point here.
        await asyncio.to_thread(_fsync_directory, final.parent)
        return sha256, size
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


async def upload_artifact(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    name = check_artifact_name(request.query_params.get("name", ""))
    media_type = upload_media_type(
        request.query_params.get("mediaType"), request.headers.get("content-type")
    )
    declared_length(request)  # a malformed Content-Length is refused before taking a place
    limiter: asyncio.Semaphore = request.app.state.upload_slots
    # Waiting for a place is bounded by not waiting at all: the client retries after
    # Retry-After, and a place is held at most until its body goes silent (receive timeout).
    if limiter.locked():
        raise Busy("too many uploads at once (ARKVORY_MAX_UPLOADS)", retry_after=5)
    runtime = runtime_of(request)
    assert runtime.storage is not None and runtime.pool is not None
    async with limiter:
        try:
            sha256, size = await receive_into_store(
                request, runtime.storage, runtime.settings.receive_timeout_s, runtime.metrics
            )
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening; nothing was kept
        async with pooled(runtime.pool) as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO arkvory_blobs (sha256, size) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                sha256,
                size,
            )
            row = await conn.fetchrow(
                "INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type)"
                " VALUES ($1, $2, $3, $4, $5, $6)"
                " RETURNING id, name, sha256, size, media_type, created_at",
                uuid.uuid4(),
                repo.id,
                name,
                sha256,
                size,
                media_type,
            )
    return JSONResponse(artifact_json(row), status_code=201)


_SELECT = "SELECT id, name, sha256, size, media_type, created_at FROM arkvory_artifacts"


async def show_artifact(request: Request) -> Response:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    artifact_id = parse_uuid(request.path_params["artifact_id"], "artifact id")
    principal = await principal_of(request)
    async with pooled(runtime.pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        row = await conn.fetchrow(
            f"{_SELECT} WHERE repository_id = $1 AND id = $2", repo.id, artifact_id, timeout=QUERY_TIMEOUT_S
        )
    if row is None:
        raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
    return JSONResponse(artifact_json(row))


async def list_artifacts(request: Request) -> Response:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    principal = await principal_of(request)
    async with pooled(runtime.pool) as conn:
        repo = await repository_for_read(conn, request.path_params["repo"], principal)
        rows = await conn.fetch(
            f"{_SELECT} WHERE repository_id = $1 ORDER BY created_at, id LIMIT 1000",
            repo.id,
            timeout=QUERY_TIMEOUT_S,
        )
    return JSONResponse({"items": [artifact_json(r) for r in rows]})


routes = [
    Route("/api/v1/repositories/{repo}/artifacts", upload_artifact, methods=["POST"]),
    Route("/api/v1/repositories/{repo}/artifacts", list_artifacts, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/artifacts/{artifact_id}", show_artifact, methods=["GET"]),
]
