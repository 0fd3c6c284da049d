"""The `cleanup` task kind (SPEC §7): reclaims storage while the writer and gateways serve.

Steps, each checkpointed (a resumed task skips the steps it finished; every step is also safe to
run twice): expire idempotency keys; delete expired credentials; remove abandoned upload
sessions and upload temp files; prune finished tasks past ARKVORY_TASK_RETENTION; prune audit
entries past ARKVORY_AUDIT_RETENTION; delete the artifacts the repositories' retention rules no
longer keep (retention.py); delete
unreferenced blobs; delete stray blob files (a file with no blob row, left by a crash between
placing and committing); abort an object store's incomplete multipart uploads that no upload
can still complete (multipart_uploads.py: last, so a store that hangs there holds up no other step).

Why deleting a blob cannot break an upload or a download:

- **Uploads.** A blob is removed in two parts (writer/blobs/locks.py has the whole argument): under its
  digest's exclusive claim, a statement that starts after the claim is granted re-checks
  everything (no artifact references it, it is older than the grace period, no live read pin
  names it, no removal of it is pending), deletes the row and marks the removal; that
  transaction commits, and only then is the blob deleted from the storage, outside any
  transaction and lock, and the mark settled. An upload of the same bytes never waits on a lock
  we hold across the storage: it waits (without a transaction) for the pending mark to settle,
  and one that staged its bytes before we marked publishes them again. A digest being uploaded
  right now is skipped (try-lock), never waited for. A removal stopped between its mark and its
  settling (a crash, a failing store, a cancel) is finished by the next run, first thing.
- **Downloads.** A transfer opens a blob only after its read pin is committed (shared/cluster/pins.py),
  and the re-check counts a pin as live while `pinned_until > now()`, `now()` being the start
  of our transaction (earlier than the check: conservative). A cleanup that checked before the
  pin existed can only delete a blob whose artifact was already gone; the transfer then finds
  no file and answers 404 (shared/download/transfer.py). An open descriptor keeps its bytes after unlink.
  An object store has no descriptors: a transfer reads it in range requests for as long as it
  runs, which its pin covers; the one that started on an artifact deleted before our check is
  cut cleanly at its next range (shared/download/object_transfer.py), never padded.
  A process whose pins cannot be written serves no payload, so no expired pin hides a read.
- **Stray files.** A stored blob without a row (a file, or an object that a store failing before
  the commit left) is a candidate when it was last modified before the grace period (mtime,
  LastModified, as listed); it is marked like an unreferenced blob, under the digest's exclusive
  claim, only if there is still no row and no pending removal: an upload publishing it is either
  finished (the row is there) or not yet at its publishing transaction, which then sees our mark
  and stages its bytes again after we settle.

Unlinks are not followed by a directory fsync: a crash that loses an unlink brings back a file
with the right bytes and no row, a stray the next run removes; an upload of the same content
in between simply reuses it under its claim.

Cost: referenced blobs cost no round trip each; candidates come from one keyset-paged
anti-join, stray files from the storage's listing (`os.scandir`, or an object store's LIST pages),
checked against the table in batches. The storage does the removals (shared/storage: unlinks
in the disk thread below, DeleteObjects for an object store), never inside a transaction (a
lint in tests/test_code_rules.py holds it), and every pool wait has a timeout. Downloads come
first: the disk work runs in one thread of its own at nice 10, and after each batch the task
sleeps PACE times the time the batch kept a CPU busy (its wall time minus the time its thread
waited for the disk), so the task and its queries use at most 1 / (1 + PACE) of a core.

Budgets (writer/tasks/budgets.py): an item is a thing removed (a key, a credential, a task, an audit entry, a
session or temp file, an artifact retention deletes, a blob, a stray file), its bytes what it
freed, its cost units one per row and one per file (an unreferenced blob and an abandoned upload
cost 2). Each batch is cut, before it is
removed, to what the budget has left, so the usage never goes over; when work is left that not
even one removal fits, the task fails there with `budget_exceeded`. A batch's usage is written
in the transaction that removes its rows or marks its blobs (`progress(conn=...)`), so a crash
can lose neither without the other and a retry never gets that budget back; the upload sweep,
which removes files outside any transaction, reserves its cost first (`reserving`). A stray
counts with its listed size when it is marked. What a step removed stays removed, so a resumed
run keeps all the usage (`RESUME_REPEATS_WORK`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

import anyio
import asyncpg

from arkvory.shared.db import pooled
from arkvory.shared.errors import InvalidInput
from arkvory.shared.storage import BlobStorage, to_the_end
from arkvory.shared.storage.upload_files import any_stale_upload, remove_stale_uploads
from arkvory.writer.tasks.budgets import cost_units
from arkvory.writer.tasks.context import TaskCancelled
from arkvory.writer.tasks.retention import any_to_prune, prune_finished_batch

from ..audit.retention import any_to_prune as any_audit_to_prune, prune_batch as prune_audit_batch

from ..blobs.locks import (
    NONE_PENDING,
    Removal,
    ended_quarantines,
    mark_removals,
    pending_removals,
    prune_settled_removals,
    settle_removals,
    try_claim_for_removal,
)

log = logging.getLogger("arkvory.cleanup")

QUERY_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 10.0
BLOB_BATCH = 1000  # unreferenced blobs removed per transaction
SCAN_BATCH = 5000  # stray-file candidates checked against the table per query
KEY_BATCH = 10_000
TASK_BATCH = 1000
AUDIT_BATCH = 10_000
# After each batch, sleep this many times the CPU time it took (bench/cleanup.py measures it).
PACE = 2.0
DISK_NICE = 10
MAX_GRACE_S = 10 * 365 * 86400
# An upload session file or temp file younger than this may be one created a moment ago, not yet
# locked by its writer, even with a zero grace period (tests): the sweep leaves it for the next run.
MIN_ORPHAN_AGE_S = 60

_PARAMS = {"grace_seconds"}

# A resumed cleanup does not undo what it removed after its last checkpoint: keep that usage.
RESUME_REPEATS_WORK = False
# Cost units of one removal (writer/tasks/budgets.py).
ROW_COST = cost_units(rows=1)  # an idempotency key; a finished task with its events
FILE_COST = cost_units(files=1)  # a stray blob file
BLOB_COST = cost_units(rows=1, files=1)  # an unreferenced blob: its row and its file
# An abandoned upload: its session row (none for a temp file or an orphan) and its file.
UPLOAD_COST = cost_units(rows=1, files=1)
UPLOAD_SWEEP_MAX = 1_000_000  # per run; the next run takes the rest


def validate_params(params: Any) -> dict:
    """`grace_seconds` (optional int, 0..10 years): overrides ARKVORY_CLEANUP_GRACE."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInput("params must be an object")
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        raise InvalidInput(f"unknown cleanup param(s) {unknown}: expected only {sorted(_PARAMS)}")
    checked: dict[str, Any] = {}
    if "grace_seconds" in params:
        grace = params["grace_seconds"]
        if isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE_S:
            raise InvalidInput(f"params.grace_seconds must be an integer 0..{MAX_GRACE_S}, got {grace!r}")
        checked["grace_seconds"] = grace
    return checked


async def run(ctx) -> dict:
    grace = int(ctx.params.get("grace_seconds", ctx.settings.cleanup_grace_s))
    state = dict(ctx.resumed_from or {})
    done: list[str] = list(state.get("done", []))
    totals: dict[str, dict] = dict(state.get("totals", {}))
    await _finish_removals_left(ctx)
    for name, step in _STEPS:
        if name in done:
            continue
        started = time.monotonic()
        totals[name] = await step(ctx, grace)
        log.info("cleanup %s: %s in %.1f s", name, totals[name], time.monotonic() - started)
        done.append(name)
        ctx.require_budget(transitions=1)  # asked first, as for the work
        await ctx.checkpoint({"done": done, "totals": totals})
    blobs, strays = totals.get("blobs", {}), totals.get("stray_files", {})
    return {
        "grace_seconds": grace,
        "deleted_blobs": blobs.get("deleted", 0) + strays.get("deleted", 0),
        "reclaimed_bytes": blobs.get("bytes", 0) + strays.get("bytes", 0),
        "steps": totals,
    }


# -- steps ---------------------------------------------------------------------------------


# The condition of writer/idempotency.py `delete_expired`: asked only when the budget is spent.
_ANY_EXPIRED_KEY = "SELECT EXISTS (SELECT 1 FROM arkvory_idempotency_keys WHERE expires_at <= now())"


async def _idempotency_keys(ctx, grace: int) -> dict:
    from arkvory.writer.idempotency import delete_expired

    deleted = await _rows_in_batches(
        ctx, KEY_BATCH, delete_expired,
        lambda conn: conn.fetchval(_ANY_EXPIRED_KEY, timeout=QUERY_TIMEOUT_S),
        lambda done: f"expired idempotency keys: {done} deleted",
    )
    return {"deleted": deleted}


# Expired credentials (sessions, personal tokens, managed keys) are refused already; their rows
# only fill the table (writer/identity/tokens.py and accounts.py forget an account's own at its next
# token or login; this takes those of accounts that make neither). Asked first: even a DELETE of
# nothing notifies every process to flush its credentials cache (migrations/0004_accounts.sql).
_ANY_EXPIRED_CREDENTIAL = "SELECT EXISTS (SELECT 1 FROM arkvory_credentials WHERE expires_at <= now())"
_DELETE_EXPIRED_CREDENTIALS = """
DELETE FROM arkvory_credentials WHERE id IN (
    SELECT id FROM arkvory_credentials WHERE expires_at <= now() LIMIT $1
)
"""


async def _delete_expired_credentials(conn: asyncpg.Connection, at_most: int) -> int:
    if not await conn.fetchval(_ANY_EXPIRED_CREDENTIAL, timeout=QUERY_TIMEOUT_S):
        return 0
    status = await conn.execute(_DELETE_EXPIRED_CREDENTIALS, at_most, timeout=QUERY_TIMEOUT_S)
    return int(status.split()[-1])


async def _credentials(ctx, grace: int) -> dict:
    deleted = await _rows_in_batches(
        ctx, KEY_BATCH, _delete_expired_credentials,
        lambda conn: conn.fetchval(_ANY_EXPIRED_CREDENTIAL, timeout=QUERY_TIMEOUT_S),
        lambda done: f"expired credentials: {done} deleted",
    )
    return {"deleted": deleted}


async def _upload_sessions(ctx, grace: int) -> dict:
    from arkvory.writer.uploads.sessions import sweep_expired_uploads

    _stop_if_cancelled(ctx)
    # Sessions and temp files the writer is using are locked by it and left alone, however old
    # (shared/storage/upload_files.py); the age only spares files created a moment ago.
    orphan_age = max(grace, MIN_ORPHAN_AGE_S)
    room = _room(ctx, UPLOAD_SWEEP_MAX, UPLOAD_COST)
    sessions = temp_files = 0
    # Files go outside any transaction of ours: their cost is on record before the first one.
    async with ctx.reserving(items=room, cost_units=room * UPLOAD_COST, transitions=1 if room else 0):
        if room:
            sessions = await sweep_expired_uploads(
                ctx.pool, ctx.storage, orphans_older_than_s=orphan_age, limit=room
            )
            if sessions < room:
                temp_files = await to_the_end(
                    _on_disk(remove_stale_uploads, ctx.storage, orphan_age, room - sessions)
                )
        removed = sessions + temp_files
        if removed or _spare_transition(ctx):
            await ctx.progress(
                items=removed, cost_units=removed * UPLOAD_COST,
                message=f"abandoned uploads: {sessions} session(s) and {temp_files} temp file(s) removed",
            )
    if removed == room < UPLOAD_SWEEP_MAX and await _abandoned_uploads_left(ctx, orphan_age):
        _refuse_next(ctx, UPLOAD_COST)  # the budget stopped the sweep, not the end of the work
    return {"sessions": sessions, "temp_files": temp_files}


async def _abandoned_uploads_left(ctx, orphan_age: float) -> bool:
    async with pooled(ctx.pool) as conn:
        if await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM arkvory_uploads WHERE expires_at < now())",
            timeout=QUERY_TIMEOUT_S,
        ):
            return True
    return await _on_disk(any_stale_upload, ctx.storage, orphan_age)


async def _tasks(ctx, grace: int) -> dict:
    retention = ctx.settings.task_retention_s
    pruned = await _rows_in_batches(
        ctx, TASK_BATCH,
        lambda conn, room: prune_finished_batch(conn, retention, room),
        lambda conn: any_to_prune(conn, retention),
        lambda done: f"finished tasks past retention: {done} pruned",
    )
    return {"pruned": pruned}


async def _audit_entries(ctx, grace: int) -> dict:
    """Audit entries past ARKVORY_AUDIT_RETENTION (writer/audit/retention.py), oldest first."""
    retention = ctx.settings.audit_retention_s
    pruned = await _rows_in_batches(
        ctx, AUDIT_BATCH,
        lambda conn, room: prune_audit_batch(conn, retention, room),
        lambda conn: any_audit_to_prune(conn, retention),
        lambda done: f"audit entries past retention: {done} pruned",
    )
    return {"pruned": pruned}


async def _rows_in_batches(
    ctx,
    batch: int,
    delete: Callable[[asyncpg.Connection, int], Awaitable[int]],
    any_left: Callable[[asyncpg.Connection], Awaitable[bool]],
    message: Callable[[int], str],
) -> int:
    """Delete rows up to `batch` a statement (`delete(conn, at_most)` returns how many went),
    paced and within the budget, until a statement deletes fewer than it may; returns how many
    went. When the budget leaves no room and `any_left`, the next run is refused (the budget
    stopped the step, not the end of the work)."""
    gone = 0
    while True:
        _stop_if_cancelled(ctx)
        async with _paced():
            async with pooled(ctx.pool) as conn:
                room = _room(ctx, batch, ROW_COST)
                if room == 0:
                    if await any_left(conn):
                        _refuse_next(ctx, ROW_COST)
                    return gone
                async with conn.transaction():
                    count = await delete(conn, room)
                    if count or (not gone and _spare_transition(ctx)):
                        # In the deleting transaction: the usage commits with the rows.
                        await ctx.progress(
                            items=count, cost_units=count * ROW_COST, message=message(gone + count), conn=conn
                        )
        gone += count
        if count < room:
            return gone


_CANDIDATES = """
SELECT b.sha256, b.size FROM arkvory_blobs b
WHERE b.sha256 > $1 AND b.created_at < now() - make_interval(secs => $2)
  AND NOT EXISTS (SELECT 1 FROM arkvory_artifacts a WHERE a.sha256 = b.sha256)
ORDER BY b.sha256 LIMIT $3
"""
# Under the digests' exclusive claims, in a statement that began after they were granted.
_DELETE_UNREFERENCED = f"""
DELETE FROM arkvory_blobs b
WHERE b.sha256 = ANY($1::text[]) AND b.created_at < now() - make_interval(secs => $2)
  AND NOT EXISTS (SELECT 1 FROM arkvory_artifacts a WHERE a.sha256 = b.sha256)
  AND NOT EXISTS (
      SELECT 1 FROM arkvory_read_pins p WHERE p.sha256 = b.sha256 AND p.pinned_until > now()
  )
  AND {NONE_PENDING.format(d="b.sha256")}
RETURNING b.sha256, b.size
"""

# Counts a batch's removals (how many, bytes freed) inside the transaction that marks them.
Counted = Callable[[asyncpg.Connection, int, int], Awaitable[None]]


async def _blobs(ctx, grace: int) -> dict:
    deleted = reclaimed = skipped = 0
    after = ""

    async def counted(conn: asyncpg.Connection, count: int, freed: int) -> None:
        await ctx.progress(
            items=count, bytes=freed, cost_units=count * BLOB_COST, conn=conn,
            message=f"unreferenced blobs: {deleted + count} deleted, {reclaimed + freed} bytes reclaimed",
        )

    while True:
        _stop_if_cancelled(ctx)
        async with _paced():
            async with pooled(ctx.pool) as conn:
                rows = await conn.fetch(_CANDIDATES, after, float(grace), BLOB_BATCH, timeout=QUERY_TIMEOUT_S)
            if not rows:
                break
            # Each candidate may be removed: only as many as the budget covers go in.
            room = _room(ctx, len(rows), BLOB_COST, [r["size"] for r in rows])
            if room == 0:
                _refuse_next(ctx, BLOB_COST, rows[0]["size"])
            last_batch = len(rows) < BLOB_BATCH and room == len(rows)
            rows = rows[:room]
            after = rows[-1]["sha256"]
            candidates = [r["sha256"] for r in rows]
            count, freed = await remove_unreferenced(
                ctx.pool, ctx.storage, candidates, grace, task_id=ctx.task_id, counted=counted
            )
        deleted += count
        reclaimed += freed
        skipped += len(candidates) - count
        ctx.metrics.cleanup_deleted_blobs.inc(count)
        ctx.metrics.cleanup_reclaimed_bytes.inc(freed)
        if last_batch:
            break
    if not deleted and _spare_transition(ctx):
        await ctx.progress(message="unreferenced blobs: none to delete")
    return {"deleted": deleted, "bytes": reclaimed, "kept": skipped}


async def remove_unreferenced(
    pool: asyncpg.Pool, storage: BlobStorage, digests: list[str], grace: int,
    *, task_id: uuid.UUID | None = None, counted: Counted | None = None,
) -> tuple[int, int]:
    """Remove those of `digests` that are still unreferenced, old enough, unpinned and not
    being removed: rows deleted and removals marked (and `counted`) in one transaction under
    their exclusive digest claims, then the stored blobs deleted outside it (writer/blobs/locks.py);
    returns (blobs removed, bytes freed)."""
    async with pooled(pool) as conn, conn.transaction():
        locked = await try_claim_for_removal(conn, digests)
        if not locked:
            return 0, 0
        rows = await conn.fetch(_DELETE_UNREFERENCED, locked, float(grace), timeout=QUERY_TIMEOUT_S)
        if not rows:
            return 0, 0
        gone = [r["sha256"] for r in rows]
        freed = sum(r["size"] for r in rows)
        # What verify found wrong with a blob that no longer exists is no longer a problem.
        await conn.execute(
            "DELETE FROM arkvory_storage_diagnostics WHERE sha256 = ANY($1::text[])", gone,
            timeout=QUERY_TIMEOUT_S,
        )
        removals = await mark_removals(conn, gone, "unreferenced", task_id)
        if counted is not None:
            await counted(conn, len(rows), freed)
    await remove_marked(pool, storage, removals)
    return len(rows), freed


async def remove_marked(pool: asyncpg.Pool, storage: BlobStorage, removals: list[Removal]) -> None:
    """Delete the marked blobs from the storage (no transaction or claim is held: an upload of
    the same bytes waits for the marks, not for us), then settle the marks. A cancel waits for
    the deletion (a thread cannot be stopped, a store request may be under way) and settles if
    it succeeded; a failure leaves the marks pending for the next run."""
    if not removals:
        return
    deleting = asyncio.ensure_future(storage.delete([r.sha256 for r in removals], offload=_on_disk))
    try:
        await to_the_end(deleting)
    finally:
        if not deleting.cancelled() and deleting.exception() is None:
            # Even when we are cancelled now, or uploads of these bytes would wait for the
            # next run (bounded: a settle that does not come is finished then).
            with anyio.move_on_after(SETTLE_TIMEOUT_S, shield=True):
                async with pooled(pool) as conn:
                    await settle_removals(conn, removals)


async def _finish_removals_left(ctx) -> None:
    """Removals an earlier run marked (and counted) but did not see through: the storage may
    or may not have deleted those blobs, so delete them (again) and settle. A quarantine whose
    verify ended without settling it is settled (verify looks at that blob again), and old
    settled marks go (locks.SETTLED_KEPT_S)."""
    async with pooled(ctx.pool) as conn:
        left = await pending_removals(conn, ("unreferenced", "stray"))
        await settle_removals(conn, await ended_quarantines(conn))
        await prune_settled_removals(conn)
    if left:
        log.info("cleanup: finishing %d blob removal(s) an earlier run left pending", len(left))
    for start in range(0, len(left), BLOB_BATCH):
        _stop_if_cancelled(ctx)
        async with _paced():
            await remove_marked(ctx.pool, ctx.storage, left[start:start + BLOB_BATCH])


_WITHOUT_ROW = f"""
SELECT d FROM unnest($1::text[]) AS d
WHERE NOT EXISTS (SELECT 1 FROM arkvory_blobs b WHERE b.sha256 = d) AND {NONE_PENDING.format(d="d")}
"""


async def _stray_files(ctx, grace: int) -> dict:
    """Stored blobs that no row describes, older than the grace period (a file's mtime, an
    object's LastModified)."""
    storage: BlobStorage = ctx.storage
    cutoff = time.time() - grace
    scanned = deleted = reclaimed = 0
    pending: dict[str, int] = {}  # digest -> size, as listed

    async def counted(conn: asyncpg.Connection, count: int, freed: int) -> None:
        await ctx.progress(
            items=count, bytes=freed, cost_units=count * FILE_COST, conn=conn,
            message=f"stray blob files: {deleted + count} deleted, {reclaimed + freed} bytes reclaimed",
        )

    async def settle() -> None:
        nonlocal deleted, reclaimed
        if not pending:
            return
        async with _paced():
            async with pooled(ctx.pool) as conn:
                found = await conn.fetch(_WITHOUT_ROW, list(pending), timeout=QUERY_TIMEOUT_S)
        strays = [(r["d"], pending[r["d"]]) for r in found]
        pending.clear()
        while strays:
            _stop_if_cancelled(ctx)
            batch = _strays_within_budget(ctx, strays)
            strays = strays[len(batch):]
            async with _paced():
                count, freed = await remove_strays(
                    ctx.pool, storage, batch, task_id=ctx.task_id, counted=counted
                )
            deleted += count
            reclaimed += freed
            if count:
                ctx.metrics.cleanup_deleted_blobs.inc(count)
                ctx.metrics.cleanup_reclaimed_bytes.inc(freed)

    listing = storage.listing(offload=_on_disk)
    try:
        while True:
            _stop_if_cancelled(ctx)
            async with _paced():
                page = await anext(listing, None)
            if page is None:
                break
            old = {blob.sha256: blob.size for blob in page if blob.modified < cutoff}
            scanned += len(old)
            pending.update(old)
            if len(pending) >= SCAN_BATCH:
                await settle()
    finally:
        await listing.aclose()
    await settle()
    if _spare_transition(ctx):
        await ctx.progress(message=f"stray blob files: {scanned} old file(s) checked, {deleted} deleted")
    return {"checked": scanned, "deleted": deleted, "bytes": reclaimed}


def _strays_within_budget(ctx, strays: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The leading strays (digest, listed size) the budget covers; fails the task when not even
    one does."""
    sizes = [size for _, size in strays] if "bytes" in ctx.budget_left() else []
    room = _room(ctx, len(strays), FILE_COST, sizes)
    if room == 0:
        _refuse_next(ctx, FILE_COST, sizes[0] if sizes else 0)
    return strays[:room]


async def remove_strays(
    pool: asyncpg.Pool, storage: BlobStorage, strays: list[tuple[str, int]],
    *, task_id: uuid.UUID | None = None, counted: Counted | None = None,
) -> tuple[int, int]:
    """Remove the stored blobs of `strays` (digest, listed size) that still have no blob row
    and no pending removal: marked (and `counted`, at their listed sizes) under their exclusive
    digest claims, then deleted outside the transaction; returns (removed, bytes freed)."""
    sizes = dict(strays)
    async with pooled(pool) as conn:
        without_row = [r["d"] for r in await conn.fetch(_WITHOUT_ROW, list(sizes), timeout=QUERY_TIMEOUT_S)]
        if not without_row:
            return 0, 0
        async with conn.transaction():
            locked = await try_claim_for_removal(conn, without_row)
            if not locked:
                return 0, 0
            # Re-checked under the claims: an upload that published it has committed its row by now.
            still = [r["d"] for r in await conn.fetch(_WITHOUT_ROW, locked, timeout=QUERY_TIMEOUT_S)]
            if not still:
                return 0, 0
            removals = await mark_removals(conn, still, "stray", task_id)
            freed = sum(sizes[d] for d in still)
            if counted is not None:
                await counted(conn, len(still), freed)
    await remove_marked(pool, storage, removals)
    return len(still), freed


async def _multipart_uploads(ctx, grace: int) -> dict:
    from .multipart_uploads import abort_abandoned_uploads  # it takes this module's helpers

    return await abort_abandoned_uploads(ctx, grace)


async def _retention(ctx, grace: int) -> dict:
    from .retention import apply_retention  # (it uses this module's budget helpers)

    return await apply_retention(ctx)


_STEPS: tuple[tuple[str, Callable[[Any, int], Awaitable[dict]]], ...] = (
    ("idempotency_keys", _idempotency_keys),
    ("credentials", _credentials),
    ("upload_sessions", _upload_sessions),
    ("tasks", _tasks),
    ("audit", _audit_entries),
    ("retention", _retention),  # before blobs: the blobs of old artifacts it deletes go in the same run
    ("blobs", _blobs),
    ("stray_files", _stray_files),
    ("multipart_uploads", _multipart_uploads),
)
STEP_NAMES = tuple(name for name, _ in _STEPS)


# -- budgets -------------------------------------------------------------------------------


def _room(ctx, wanted: int, cost_each: int, sizes: Sequence[int] = ()) -> int:
    """How many of the next `wanted` removals the task's budget still covers: each is one item
    and `cost_each` cost units, plus its size in bytes when `sizes` gives them, and the progress
    call that reports them is one transition."""
    left = ctx.budget_left()
    if left.get("transitions", 1) < 1:
        return 0
    room = min(wanted, left.get("items", wanted), left.get("cost_units", wanted * cost_each) // cost_each)
    bytes_left = left.get("bytes")
    if bytes_left is not None and sizes:
        total = 0
        for fitted, size in enumerate(sizes[:room]):
            total += size
            if total > bytes_left:
                return fitted
    return room


def _spare_transition(ctx) -> bool:
    """Whether a report of no work fits: a summary line is no reason to fail the task."""
    return ctx.budget_left().get("transitions", 1) >= 1


def _refuse_next(ctx, cost_each: int, size: int = 0) -> NoReturn:
    """Work is left that the budget does not cover: fail the task before doing any of it."""
    ctx.require_budget(items=1, bytes=size, cost_units=cost_each, transitions=1)
    raise AssertionError("budget_left and require_budget disagree")


# -- pacing and cancellation ---------------------------------------------------------------


_disk: concurrent.futures.ThreadPoolExecutor | None = None
_waited = [0.0]  # seconds the disk thread spent off the CPU (waiting for the disk), in total


def _nice_thread() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, DISK_NICE)  # Linux: this thread only
    except OSError:
        pass


async def _on_disk(fn: Callable, *args: Any) -> Any:
    """Run `fn(*args)` in cleanup's own low-priority thread, counting its time off the CPU."""
    global _disk
    if _disk is None:
        _disk = concurrent.futures.ThreadPoolExecutor(1, "arkvory-cleanup-disk", initializer=_nice_thread)
    return await asyncio.get_running_loop().run_in_executor(_disk, functools.partial(_counting_wait, fn, *args))


def _counting_wait(fn: Callable, *args: Any) -> Any:
    wall, cpu = time.monotonic(), time.thread_time()
    try:
        return fn(*args)
    finally:
        _waited[0] += max(0.0, (time.monotonic() - wall) - (time.thread_time() - cpu))


class _paced:
    """After the block, sleep PACE times the time it kept a CPU busy: its wall time (our
    queries run on the database's CPU meanwhile) minus the time our disk thread waited."""

    __slots__ = ("started", "waited")

    async def __aenter__(self) -> None:
        self.started = time.monotonic()
        self.waited = _waited[0]

    async def __aexit__(self, *exc_info: object) -> None:
        if exc_info[0] is None and PACE > 0:
            busy = (time.monotonic() - self.started) - (_waited[0] - self.waited)
            await asyncio.sleep(max(0.0, busy) * PACE)


def _stop_if_cancelled(ctx) -> None:
    if ctx.cancel_requested():
        raise TaskCancelled("cancel requested")
