"""Publishing an upload's verified bytes (SPEC §6): what the one-shot upload and a session's
`complete` share.

An upload streams into a temporary file inside ARKVORY_DATA_DIR while its SHA-256 is computed
(in batches, in a worker thread: writer/uploads/store.py). Only once it is complete is it staged
to the storage (an object store receives the bytes then, outside any transaction; a directory
needs nothing), and one transaction claims its digest, checks that no removal of an identical
old blob got in the way since the staging (writer/blobs/locks.py; if one did, the
bytes are staged again: `publish_blob`), publishes the blob under its digest and inserts the
blob and artifact rows with the Idempotency-Key: an interrupted body leaves neither an artifact
nor a stray file, and a retry with the same key replays the first artifact instead of creating
a second. A store that fails meanwhile, or a removal of the same bytes that the store does not
finish within 30 s, answers 503 `unavailable` (retry later, with the same key) and nothing is
visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import asyncpg
from starlette.requests import Request

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.errors import PayloadTooLarge, Unavailable
from arkvory.shared.http.bodies import declared_length
from arkvory.shared.metrics import Metrics
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, StorageError, is_out_of_space, out_of_space
from arkvory.shared.storage.upload_files import hold_in_use, remove_own_file

from ..blobs.locks import (
    RemovalUnderWay,
    RemovedSinceStaging,
    Staging,
    before_staging,
    check_not_removed_since,
    claim_for_upload,
)
from ..blobs.diagnostics import clear_diagnostic
from ..blobs.quarantine import notify_moved
from .store import BatchedReceiver, Region

log = logging.getLogger("arkvory.uploads")


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
    `staging`. A removal of the digest that got in the way (writer/blobs/locks.py) is
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
    `publish_blob` stages again; writer/blobs/locks.py), publish the blob under it
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
