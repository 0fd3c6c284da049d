"""The small-file upload shortcut (SPEC §6): `POST /api/v1/repositories/{repo}/artifacts` with
the raw body as the file, published as `publishing.py` says, in one request."""

from __future__ import annotations

import pathlib
import uuid

import asyncpg
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.download.catalog import Repository
from arkvory.shared.http.bodies import declared_length
from arkvory.shared.http.media_types import upload_media_type
from arkvory.shared.storage import StorageError

from ..catalog.artifacts import ARTIFACT_SCHEMA, COLUMNS, MAX_NAME, artifact_json, artifact_location, check_artifact_name
from ..catalog.uploaders import uploader_of
from ..idempotency import HeldKey, Result, holding_key
from ..blobs.locks import Staging
from ..openapi import ERROR, IDEMPOTENCY_KEY, errors, json_content, query_param, repo_param
from ..catalog.repositories import repository_for_write
from ..request_inputs import principal_of, query, runtime_of
from .places import UploadPlaces
from .publishing import place_claimed_blob, publish_blob, received_body, storage_failed
from .store import refuse_form_upload


async def upload_artifact(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    refuse_form_upload(request)
    name = check_artifact_name(query(request, "name") or "")
    media_type = upload_media_type(query(request, "mediaType"), request.headers.get("content-type"))
    declared_length(request)  # a malformed Content-Length is refused before taking a place
    runtime = runtime_of(request)
    assert runtime.storage is not None
    if not runtime.storage_available:
        # A store that does not answer now (the probe's verdict) could not take the blob at the
        # end either: refused before a byte of the body is read, not after all of it.
        raise storage_failed(StorageError(runtime.storage_health.reason or "the object store does not answer"))
    places: UploadPlaces = request.app.state.upload_places
    # The key is held while the body streams (a concurrent duplicate gets 409 at once, before
    # the 503 its principal's full share of places would give) and recorded in the transaction
    # that inserts the artifact (a retry replays it).
    async with holding_key(request, principal) as held:
        with places.hold(principal.id):
            try:
                async with received_body(request, runtime.storage, runtime.settings, runtime.metrics) as body:
                    return await _publish_received(request, held, principal.id, repo, name, media_type, *body)
            except ClientDisconnect:
                return Response(status_code=400)  # nobody is listening; nothing was kept


async def _publish_received(
    request: Request, held: HeldKey, principal_id: str, repo: Repository, name: str, media_type: str,
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
            "INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type, uploaded_by_kind,"
            f" uploaded_by_id, uploaded_by_name) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {COLUMNS}",
            uuid.uuid4(), repo.id, name, sha256, size, media_type, *await uploader_of(conn, principal_id),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        return Result(201, artifact_json(row), {"Location": artifact_location(repo.name, row["id"])})

    return await publish_blob(pool, storage, partial, sha256, size, publish)


routes = [Route("/api/v1/repositories/{repo}/artifacts", upload_artifact, methods=["POST"])]

OPENAPI_PATHS = {
    "/api/v1/repositories/{repo}/artifacts": {
        "post": {
            "summary": "Upload a small file in one request (the raw body; not a multipart form)",
            "description": "The body is the file (`curl --data-binary @file`); a multipart form is 415. "
                           "At most ARKVORY_MAX_ARTIFACT_BYTES (413); a full disk or one that would fall below "
                           "ARKVORY_MIN_FREE_BYTES is 507 and keeps nothing. With an Idempotency-Key a retry "
                           "replays the first artifact.",
            "parameters": [
                repo_param(),
                query_param("name", "The artifact's file name.", required=True,
                            schema={"type": "string", "minLength": 1, "maxLength": MAX_NAME}),
                query_param("mediaType", "Media type (else Content-Type, else application/octet-stream)."),
                IDEMPOTENCY_KEY,
            ],
            "requestBody": {"required": True, "content": {"application/octet-stream": {
                "schema": {"type": "string", "format": "binary"}}}},
            "responses": {"201": {"description": "Stored.", "headers": {"Location": {"schema": {"type": "string"}}},
                                  "content": json_content(ARTIFACT_SCHEMA)},
                          "415": ERROR, **errors(400, 401, 403, 404, 408, 409, 413, 422, 507)},
        },
    },
}
