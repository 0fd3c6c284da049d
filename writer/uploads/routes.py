"""Resumable uploads (SPEC §6): sessions, parts in any order, complete, expiry.

A session's bytes live in one preallocated file, `<data>/uploads/<id>`; part `i` covers
`[i * partSize, min(size, (i + 1) * partSize))` and is written at its offset. A part's row is
inserted only after its bytes are fdatasync'd, so after a cut, a crash or a `kill -9` the rows
say exactly which parts a resume may skip. A recorded part is never written again: a re-send
is only hashed and compared (identical: harmless; other bytes: 409). One process (the writer,
under its lock) serves uploads, so an in-process registry keeps two requests from writing the
same part at once, and makes a repeated `complete` wait for the one already running.

`complete` checks the whole file's hash (mostly computed already, as the parts were recorded:
sessions.py `PrefixHash`), stages it to the storage (an object store receives it by a
multipart upload, invisible until complete, unless one fed while the parts arrived holds it all
and is completed now; a directory needs nothing), then in one transaction claims the digest
against cleanup and checks that no removal of the same bytes got in the way since the staging
(writer/blobs/locks.py; if one did, it stages again: artifacts.py `publish_blob`),
publishes the blob (a directory hard-links the file into the blob store, directories fsynced;
an object store has it already), inserts the blob and the artifact and marks the session
completed: a crash, or a store that fails (503 `unavailable`), anywhere before that commit
leaves no artifact and a session that `complete` finishes.
Expired sessions (no part for ARKVORY_UPLOAD_EXPIRY) are removed with their files at the
writer's start, on access, by each new session, and by the worker's cleanup
(`sessions.sweep_expired_uploads`), never while this writer receives into or completes
from a session's file: it holds the file locked meanwhile (shared/storage/upload_files.py).

A completed session stays (DELETE is 409) until the idempotency retention ends, so a repeated
`complete` returns its artifact.

Session files and in-process bookkeeping are in sessions.py, the disk one principal's
sessions may reserve in reservations.py, the upload places in places.py,
receiving bytes in store.py, the OpenAPI fragment in routes_openapi.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import Repository, parse_uuid
from arkvory.shared.errors import Conflict, DigestMismatch, InvalidInput, NotFound, PayloadTooLarge
from arkvory.shared.http.media_types import upload_media_type
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, StorageError
from arkvory.shared.storage.upload_files import open_in_use, remove_own_file

from ..audit.actions import record_request
from ..audit.trail import actor_of
from ..catalog.artifacts import COLUMNS as ARTIFACT_COLUMNS, artifact_json, check_artifact_name
from ..catalog.uploaders import uploader_of
from ..idempotency import Result, idempotent, key_of
from ..blobs.locks import Staging
from ..catalog.repositories import repository_for_write
from ..request_inputs import json_body, principal_of, runtime_of
from .places import UploadPlaces
from .publishing import place_claimed_blob, publish_blob
from .reservations import MAX_OPEN_SESSIONS, check_reservable, claim_reservation, reserved_by
from .sessions import (
    DEFAULT_PART,
    MAX_PART,
    MAX_PARTS,
    MIN_PART,
    ActiveUploads,
    allocate_session_file,
    part_count,
    part_span,
    remove_sessions,
    session_path,
    sweep_expired_uploads,
    whole_digest,
)
from .store import BatchedReceiver, Region, open_direct, parse_sha256, refuse_form_upload
from .routes_openapi import OPENAPI_PATHS  # noqa: F401  (served next to `routes`)

log = logging.getLogger("arkvory.uploads")

def check_key(request: Request) -> None:
    """Routes that are idempotent by nature (a part, complete) still refuse a malformed key."""
    key_of(request)


# -- the in-process registry: who is writing what --------------------------------------------


def active_uploads(request: Request) -> ActiveUploads:
    state = request.app.state
    registry = getattr(state, "active_uploads", None)
    if registry is None:
        registry = state.active_uploads = ActiveUploads()
    return registry


# -- sessions ----------------------------------------------------------------------------------

_COLUMNS = (
    "id, repository_id, principal_id, name, size, sha256, media_type, part_size,"
    " status, artifact_id, created_at, expires_at"
)


def session_json(session: asyncpg.Record, received: list[int], repo: Repository) -> dict[str, Any]:
    count = part_count(session["size"], session["part_size"])
    return {
        "id": str(session["id"]),
        "repository": repo.name,
        "name": session["name"],
        "size": session["size"],
        "sha256": session["sha256"],
        "mediaType": session["media_type"],
        "partSize": session["part_size"],
        "partCount": count,
        "receivedParts": received,
        "status": session["status"],
        "artifactId": str(session["artifact_id"]) if session["artifact_id"] else None,
        "createdAt": session["created_at"].isoformat(),
        "expiresAt": session["expires_at"].isoformat(),
    }


_DESCRIPTOR_FIELDS = frozenset({"name", "size", "sha256", "mediaType", "partSize"})


def _descriptor(body: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    # Strict like a task body: a misspelt `sha256` must not quietly drop the check it asked for.
    unknown = sorted(set(body) - _DESCRIPTOR_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}; known: {', '.join(sorted(_DESCRIPTOR_FIELDS))}")
    name = body.get("name")
    if not isinstance(name, str):
        raise InvalidInput("'name' is required")
    check_artifact_name(name, "'name'")
    size = body.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput("'size' must be a whole number of bytes, 0 or more")
    if size > max_bytes:
        raise PayloadTooLarge(f"an artifact may have at most {max_bytes} bytes (ARKVORY_MAX_ARTIFACT_BYTES)")
    sha256 = body.get("sha256")
    if sha256 is not None and not isinstance(sha256, str):
        raise InvalidInput("'sha256' must be a string")
    media_type = body.get("mediaType")
    if media_type is not None and not isinstance(media_type, str):
        raise InvalidInput("'mediaType' must be a string")
    part_size = body.get("partSize")
    smallest = max(MIN_PART, math.ceil(size / MAX_PARTS))
    if part_size is None:
        part_size = max(DEFAULT_PART, smallest)
    if not isinstance(part_size, int) or isinstance(part_size, bool) or not MIN_PART <= part_size <= MAX_PART:
        raise InvalidInput(f"'partSize' must be {MIN_PART}..{MAX_PART} bytes")
    if part_size < smallest:
        if smallest > MAX_PART:
            raise PayloadTooLarge(f"a resumable upload may have at most {MAX_PARTS * MAX_PART} bytes")
        raise InvalidInput(f"'partSize' must be at least {smallest} for {size} bytes ({MAX_PARTS} parts at most)")
    return {
        "name": name,
        "size": size,
        "sha256": parse_sha256(sha256, "'sha256'"),
        "mediaType": upload_media_type(media_type, None),
        "partSize": part_size,
    }


async def create_upload(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    if key_of(request) is None:
        raise InvalidInput("creating an upload session needs an Idempotency-Key header")
    runtime = runtime_of(request)
    settings, storage = runtime.settings, runtime.storage
    assert storage is not None
    descriptor = _descriptor(await json_body(request), settings.max_artifact_bytes)
    limit = settings.max_reserved_bytes_per_principal
    check_reservable(descriptor["size"], limit)
    await _sweep_some(request)

    async def work(conn: asyncpg.Connection) -> Result:
        await claim_reservation(conn, principal.id, descriptor["size"], limit)
        session_id = uuid.uuid4()
        row = await conn.fetchrow(
            "INSERT INTO arkvory_uploads (id, repository_id, principal_id, name, size, sha256,"
            " media_type, part_size, expires_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9))"
            f" RETURNING {_COLUMNS}",
            session_id, repo.id, principal.id, descriptor["name"], descriptor["size"],
            descriptor["sha256"], descriptor["mediaType"], descriptor["partSize"],
            float(settings.upload_expiry_s), timeout=POOLED_QUERY_TIMEOUT_S,
        )
        # Inside the transaction that records the key: a full disk rolls the row back, and a
        # crash before the commit leaves only a file without a row (the sweep removes it).
        await asyncio.to_thread(
            allocate_session_file, session_path(storage, session_id), descriptor["size"], storage, settings.min_free_bytes
        )
        return Result(201, session_json(row, [], repo), {"Location": _location(request, session_id)})

    return await idempotent(request, principal, {"body": descriptor}, work)


def _location(request: Request, session_id: uuid.UUID) -> str:
    return f"/api/v1/repositories/{request.path_params['repo']}/uploads/{session_id}"


async def _received(conn: asyncpg.Connection, session_id: uuid.UUID) -> list[int]:
    rows = await conn.fetch(
        "SELECT index FROM arkvory_upload_parts WHERE upload_id = $1 ORDER BY index",
        session_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return [r["index"] for r in rows]


async def _session_for(request: Request) -> tuple[Repository, asyncpg.Record]:
    """The caller's session in this repository; an expired one is removed here and is 404.
    Sessions belong to the principal that created them: another one gets 404, as for none."""
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    session_id = parse_uuid(request.path_params["upload_id"], "upload id")
    runtime = runtime_of(request)
    assert runtime.pool is not None and runtime.storage is not None
    async with pooled(runtime.pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS}, expires_at < now() AS expired FROM arkvory_uploads"
            " WHERE id = $1 AND repository_id = $2 AND principal_id = $3",
            session_id, repo.id, principal.id, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is not None and row["expired"] and not active_uploads(request).busy(session_id):
            active_uploads(request).forget(session_id)
            await remove_sessions(conn, runtime.storage, [session_id])
            raise NotFound(f"upload {session_id} expired and was removed; start a new one")
    if row is None:
        raise NotFound(f"no upload {session_id} in {repo.name!r}")
    return repo, row


async def list_uploads(request: Request) -> Response:
    """The caller's open sessions in this repository (at most MAX_OPEN_SESSIONS: no pages), and
    what all its open sessions reserve: what to complete or delete when a new one is refused.
    Needs write permission, like every upload route: the client asks here whether it may upload
    before it answers "stored already" (shared/client/upload.py)."""
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    runtime = runtime_of(request)
    assert runtime.pool is not None
    async with pooled(runtime.pool) as conn:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS}, (SELECT count(*) FROM arkvory_upload_parts p WHERE p.upload_id = u.id)"
            " AS received FROM arkvory_uploads u WHERE repository_id = $1 AND principal_id = $2"
            " AND status = 'open' ORDER BY created_at, id LIMIT $3",
            repo.id, principal.id, MAX_OPEN_SESSIONS, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        _, reserved = await reserved_by(conn, principal.id)
    return JSONResponse({
        "items": [_session_summary(row, repo) for row in rows],
        "reservedBytes": reserved,
        "maxReservedBytes": runtime.settings.max_reserved_bytes_per_principal,
    })


def _session_summary(row: asyncpg.Record, repo: Repository) -> dict[str, Any]:
    """A session in a list: the count of its parts instead of their indexes (up to 10,000)."""
    summary = session_json(row, [], repo)
    del summary["receivedParts"]
    summary["receivedPartCount"] = row["received"]
    return summary


async def show_upload(request: Request) -> Response:
    repo, session = await _session_for(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        received = await _received(conn, session["id"])
    return JSONResponse(session_json(session, received, repo))


_COMPLETED = (
    "this upload is completed: its artifact exists (delete the artifact instead); the session"
    " stays until it expires so that a repeated complete returns the artifact"
)


async def delete_upload(request: Request) -> Response:
    """Abandon an open session. A completed one is refused (409): its row is what a repeated
    `complete` replays from, so a DELETE racing a successful complete loses."""
    check_key(request)
    _, session = await _session_for(request)
    runtime = runtime_of(request)
    assert runtime.pool is not None and runtime.storage is not None
    if session["status"] != "open":
        raise Conflict(_COMPLETED)
    busy = Conflict("this upload is receiving a part or completing; retry when it is done")
    if active_uploads(request).busy(session["id"]):
        raise busy
    async with pooled(runtime.pool) as conn:
        # Only while still open: a complete that committed since (its row lock orders the two)
        # keeps its row. The file goes after the row, in a thread (it may be many GiB).
        removed = await remove_sessions(
            conn, runtime.storage, [session["id"]], only_expired=False, only_open=True
        )
        if not removed:
            status = await conn.fetchval(
                "SELECT status FROM arkvory_uploads WHERE id = $1", session["id"],
                timeout=POOLED_QUERY_TIMEOUT_S,
            )
            if status is None:
                raise NotFound(f"upload {session['id']} was removed meanwhile")
            if status != "open":
                raise Conflict(_COMPLETED)
            raise busy  # its file is in use: a request took it since our look
        # Right after the row's DELETE, not in its transaction: the file goes in between, and
        # a file is never removed inside a transaction (tests/test_code_rules.py).
        await record_request(conn, request, actor_of(await principal_of(request)), 204,
                             details={"name": session["name"], "size": session["size"]})
    active_uploads(request).forget(session["id"])
    return Response(status_code=204)


# -- receiving parts ---------------------------------------------------------------------------


async def put_part(request: Request) -> Response:
    refuse_form_upload(request)
    check_key(request)
    raw_index = request.path_params["index"]
    if not raw_index.isascii() or not raw_index.isdigit() or len(raw_index) > 5:
        raise InvalidInput("the part index must be a whole number")
    index = int(raw_index)
    declared = parse_sha256(request.headers.get("x-content-sha256"), "X-Content-SHA256")
    if declared is None:
        raise InvalidInput("a part needs its X-Content-SHA256 header")
    repo, session = await _session_for(request)
    if session["status"] != "open":
        raise Conflict("this upload is completed; its parts cannot change")
    if index >= part_count(session["size"], session["part_size"]):
        raise InvalidInput(f"this upload has parts 0..{part_count(session['size'], session['part_size']) - 1}")
    offset, size = part_span(session, index)
    _check_length(request, size)
    pool = runtime_of(request).pool
    assert pool is not None
    async with _receiving(request, session, range(index, index + 1)):
        # Looked up after the claim: no other request can record this part until we are done.
        async with pooled(pool) as conn:
            recorded = await conn.fetchval(
                "SELECT sha256 FROM arkvory_upload_parts WHERE upload_id = $1 AND index = $2",
                session["id"], index, timeout=POOLED_QUERY_TIMEOUT_S,
            )
        if recorded is not None and recorded != declared:
            raise Conflict(f"part {index} was already received with other bytes (sha256 {recorded})")
        region = Region(index, offset, size, recorded, declared)
        await _receive_regions(request, session, [region])
    return JSONResponse(
        {"index": index, "size": size, "sha256": declared, "alreadyReceived": recorded is not None}
    )


async def put_content(request: Request) -> Response:
    """The whole body at once; recorded part by part as it streams, so a cut one resumes."""
    refuse_form_upload(request)
    check_key(request)
    repo, session = await _session_for(request)
    if session["status"] != "open":
        raise Conflict("this upload is completed; its content cannot change")
    _check_length(request, session["size"])
    pool = runtime_of(request).pool
    assert pool is not None
    count = part_count(session["size"], session["part_size"])
    whole = hashlib.sha256()
    async with _receiving(request, session, range(count)):
        async with pooled(pool) as conn:
            rows = await conn.fetch(
                "SELECT index, sha256 FROM arkvory_upload_parts WHERE upload_id = $1",
                session["id"], timeout=POOLED_QUERY_TIMEOUT_S,
            )
        recorded = {r["index"]: r["sha256"] for r in rows}
        regions = [Region(i, *part_span(session, i), recorded.get(i)) for i in range(count)]
        await _receive_regions(request, session, regions, whole)
        if session["sha256"] is not None and whole.hexdigest() != session["sha256"]:
            # Still holding every part: nobody can use the parts this body recorded before
            # they go again.
            await _unrecord(request, session["id"], [r.index for r in regions if r.recorded is None])
            raise DigestMismatch(
                f"the content has sha256 {whole.hexdigest()}, not the session's {session['sha256']};"
                " nothing was kept: send the right file"
            )
    async with pooled(pool) as conn:
        received = await _received(conn, session["id"])
    return JSONResponse(session_json(session, received, repo))


async def _unrecord(request: Request, session_id: uuid.UUID, indexes: list[int]) -> None:
    """Forget parts this request recorded (their bytes stay in the file until sent again),
    and the prefix hash that may have read them."""
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        await conn.execute(
            "DELETE FROM arkvory_upload_parts WHERE upload_id = $1 AND index = ANY($2::int[])",
            session_id, indexes, timeout=POOLED_QUERY_TIMEOUT_S,
        )
    active_uploads(request).forget(session_id)


def _check_length(request: Request, expected: int) -> None:
    value = request.headers.get("content-length")
    if value is not None and value != str(expected):
        raise InvalidInput(f"this body must have exactly {expected} bytes (Content-Length: {value})")


@contextlib.asynccontextmanager
async def _receiving(request: Request, session: asyncpg.Record, indexes: range):
    """The claim on these parts and an upload place of the session's principal (shared with
    the one-shot upload). The claim first: a retry of a part whose cut request still holds it
    gets the 409 that says so, not the 503 of its principal's share of places."""
    places: UploadPlaces = request.app.state.upload_places
    registry = active_uploads(request)
    registry.claim(session["id"], indexes)
    try:
        with places.hold(session["principal_id"]):
            yield
    finally:
        registry.release(session["id"], indexes)


async def _receive_regions(
    request: Request, session: asyncpg.Record, regions: list[Region], whole=None
) -> None:
    runtime = runtime_of(request)
    storage, pool = runtime.storage, runtime.pool
    assert storage is not None and pool is not None
    path = session_path(storage, session["id"])
    try:
        fd = await open_in_use(path, os.O_WRONLY)  # no sweep removes it while we write
    except FileNotFoundError:
        raise NotFound("this upload was removed meanwhile; start a new one") from None

    registry = active_uploads(request)

    async def inline(region: Region):
        # A part not yet recorded, fed to the whole-file hash (and the publication) as it arrives.
        if region.recorded is not None:
            return None
        return await registry.start_inline(session, region.index, path, storage)

    async def record(region: Region) -> None:
        if region.recorded is not None:
            return
        async with pooled(pool) as conn:
            await conn.execute(
                "WITH part AS (INSERT INTO arkvory_upload_parts (upload_id, index, size, sha256)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING)"
                " UPDATE arkvory_uploads SET expires_at = now() + make_interval(secs => $5)"
                " WHERE id = $1",
                session["id"], region.index, region.size, region.digest.hexdigest(),
                float(runtime.settings.upload_expiry_s), timeout=POOLED_QUERY_TIMEOUT_S,
            )
        if region.feed is not None:
            region.feed.finish()
        else:
            registry.part_recorded(session, region.index, path, storage)

    # On an object store the session file is only read back when a part arrived out of order or
    # the publication failed: written O_DIRECT, past the page cache (store.py). A
    # directory links it as the blob, which downloads then find in the page cache: buffered.
    direct_fd = None
    try:
        if hasattr(storage, "open_publication"):
            direct_fd = open_direct(path)
        receiver = BatchedReceiver(
            fd, regions, storage=storage, reserve=0, check_room=False, whole=whole,
            direct_fd=direct_fd, inline=inline,
        )
        await receiver.receive(request, runtime.settings, record, runtime.metrics)
    except ClientDisconnect:
        raise InvalidInput("the client went away; the parts it finished are kept") from None
    finally:
        for region in regions:
            if region.feed is not None:
                region.feed.abandon()  # nothing when it was recorded (finished)
        if direct_fd is not None:
            os.close(direct_fd)
        os.close(fd)


# -- complete ----------------------------------------------------------------------------------


async def complete_upload(request: Request) -> Response:
    check_key(request)
    repo, session = await _session_for(request)
    registry = active_uploads(request)
    if session["status"] == "completed":
        # A crash right after the publishing commit may have left the session's own link.
        storage = runtime_of(request).storage
        assert storage is not None
        await remove_own_file(session_path(storage, session["id"]))
        return await _completed_answer(request, session, replay=True)
    if registry.parts.get(session["id"]):
        raise Conflict("parts of this upload are still being received; complete when they are done")
    task = registry.completing.get(session["id"])
    if task is None:
        # The publication runs to its end even if this client goes away: a repeat (from this
        # client's retry) waits for the same task instead of hashing and publishing again.
        task = asyncio.ensure_future(_publish_in_use(request, repo, session))
        registry.completing[session["id"]] = task
        task.add_done_callback(lambda done: _completion_ended(registry, session["id"], done))
    row = await asyncio.shield(task)
    return JSONResponse(artifact_json(row), status_code=201)


def _completion_ended(registry: ActiveUploads, session_id: uuid.UUID, task: asyncio.Task) -> None:
    registry.completing.pop(session_id, None)
    registry.forget(session_id)
    if not task.cancelled():
        task.exception()  # retrieved here: the client that started it may be gone


async def _completed_answer(request: Request, session: asyncpg.Record, replay: bool) -> Response:
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {ARTIFACT_COLUMNS} FROM arkvory_artifacts WHERE id = $1",
            session["artifact_id"], timeout=POOLED_QUERY_TIMEOUT_S,
        ) if session["artifact_id"] else None
    if row is None:
        raise NotFound("this upload was published, but its artifact has been deleted since")
    return JSONResponse(artifact_json(row), headers={"Idempotent-Replayed": "true"} if replay else None)


async def _publish_in_use(request: Request, repo: Repository, session: asyncpg.Record) -> asyncpg.Record:
    """`_publish` while holding the session's file in use (shared/storage/upload_files.py): no sweep
    removes the session or its file from before it is read until it is published."""
    storage = runtime_of(request).storage
    assert storage is not None
    try:
        fd = await open_in_use(session_path(storage, session["id"]), os.O_RDONLY)
    except FileNotFoundError:
        raise NotFound("this upload's bytes are gone (removed or expired); start a new one") from None
    try:
        return await _publish(request, repo, session)
    finally:
        os.close(fd)  # cheap: the file is the blob now, or still the session's


async def _publish(request: Request, repo: Repository, session: asyncpg.Record) -> asyncpg.Record:
    runtime = runtime_of(request)
    storage, pool = runtime.storage, runtime.pool
    assert storage is not None and pool is not None
    session_id = session["id"]
    async with pooled(pool) as conn:
        received = await _received(conn, session_id)
    missing = part_count(session["size"], session["part_size"]) - len(received)
    if missing:
        have = set(received)
        first = [i for i in range(part_count(session["size"], session["part_size"])) if i not in have][:10]
        raise Conflict(f"{missing} part(s) missing, e.g. {first}; send them, then complete")
    path = session_path(storage, session_id)
    try:
        actual_size = os.stat(path).st_size
        sha256 = await whole_digest(active_uploads(request), session, path)
    except FileNotFoundError:
        raise NotFound("this upload's bytes are gone (removed or expired); start a new one") from None
    if actual_size != session["size"]:
        raise Conflict(f"the received bytes are {actual_size}, not the declared {session['size']}")
    if session["sha256"] is not None and sha256 != session["sha256"]:
        raise DigestMismatch(
            f"the parts add up to sha256 {sha256}, not the declared {session['sha256']};"
            " delete this upload and start again"
        )
    # An object store receives the bytes now, before the transaction (a 503 if it fails: the
    # session stays open and a repeated `complete` stages again). Sent already while the parts
    # arrived (sessions.py `PrefixHash`): only made visible now that the digest matched.
    staged_already = functools.partial(_complete_publication, request, session_id, sha256, session["size"])
    actor = actor_of(await principal_of(request))

    async def audited(conn: asyncpg.Connection, artifact: asyncpg.Record) -> None:
        await record_request(conn, request, actor, 201, body=artifact_json(artifact))

    row = await publish_blob(
        pool, storage, path, sha256, session["size"],
        functools.partial(_publish_session, pool, storage, repo, session, path, sha256, runtime.settings, audited),
        staged_already=staged_already,
    )
    await remove_own_file(path)
    return row


async def _publish_session(
    pool: asyncpg.Pool, storage: BlobStorage, repo: Repository, session: asyncpg.Record, path: str, sha256: str,
    settings: Settings, audited: Callable[[asyncpg.Connection, asyncpg.Record], Awaitable[None]], staging: Staging,
) -> asyncpg.Record:
    """The publishing transaction of a session's `complete` (artifacts.py `publish_blob`), with
    its audit entry (`audited`)."""
    session_id = session["id"]
    async with pooled(pool) as conn, conn.transaction():
        status = await conn.fetchval(
            "SELECT status FROM arkvory_uploads WHERE id = $1 FOR UPDATE", session_id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if status != "open":
            raise NotFound("this upload was removed meanwhile; start a new one")
        # The digest is claimed before the file is placed and until the artifact is visible
        # (cleanup cannot unlink an identical old blob in between). A link, not a rename: if
        # the commit fails, the session still has its file and a repeated complete links it
        # again (the same bytes under the same name).
        await place_claimed_blob(conn, storage, path, sha256, session["size"], staging, link=True)
        # Only the session's own principal completes it (_session_for): the uploader.
        row = await conn.fetchrow(
            "INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type, uploaded_by_kind,"
            f" uploaded_by_id, uploaded_by_name) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {ARTIFACT_COLUMNS}",
            uuid.uuid4(), repo.id, session["name"], sha256, session["size"], session["media_type"],
            *await uploader_of(conn, session["principal_id"]),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        # Kept for the idempotency retention, so a late repeat still finds its artifact.
        await conn.execute(
            "UPDATE arkvory_uploads SET status = 'completed', artifact_id = $2,"
            " expires_at = now() + make_interval(secs => $3) WHERE id = $1",
            session_id, row["id"], float(settings.idempotency_retention_s),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        await conn.execute(
            "DELETE FROM arkvory_upload_parts WHERE upload_id = $1", session_id, timeout=POOLED_QUERY_TIMEOUT_S
        )
        await audited(conn, row)
    return row


async def _complete_publication(request: Request, session_id: uuid.UUID, sha256: str, size: int) -> bool:
    """Make the object sent while the parts arrived visible, if it holds every byte of this
    verified blob; False when there is none (or it failed: the caller publishes from the file)."""
    prefix = active_uploads(request).prefixes.get(session_id)
    publication = None if prefix is None else prefix.whole_publication(sha256, size)
    if publication is None:
        return False
    try:
        await publication.complete()
    except StorageError as exc:
        log.warning("upload %s: completing the publication sent while receiving failed (%s);"
                    " publishing from the file", session_id, exc.message)
        return False
    return True


# -- expiry ------------------------------------------------------------------------------------


async def _sweep_some(request: Request) -> None:
    """Expired sessions go at the writer's start (shared/storage/upload_files.py) and when accessed; each
    new session also sweeps those expired since (one indexed query when there are none), so
    a writer that runs for weeks without the worker still frees their space."""
    runtime = runtime_of(request)
    assert runtime.pool is not None and runtime.storage is not None
    await sweep_expired_uploads(runtime.pool, runtime.storage, busy=active_uploads(request))


_BASE = "/api/v1/repositories/{repo}/uploads"

routes = [
    Route(_BASE, create_upload, methods=["POST"]),
    Route(_BASE, list_uploads, methods=["GET"]),
    Route(_BASE + "/{upload_id}", show_upload, methods=["GET"]),
    Route(_BASE + "/{upload_id}", delete_upload, methods=["DELETE"]),
    Route(_BASE + "/{upload_id}/content", put_content, methods=["PUT"]),
    Route(_BASE + "/{upload_id}/parts/{index}", put_part, methods=["PUT"]),
    Route(_BASE + "/{upload_id}/complete", complete_upload, methods=["POST"]),
]
