"""Cleanup's step `multipart_uploads` (issue 24 item 6): abort the object store's incomplete
multipart uploads that no upload can still complete. A writer stopped while it published (a
session's parts sent as they arrived, or the staging at `complete` or of a one-shot upload)
leaves one at its blob's key: invisible, its parts taking room. The bucket's
AbortIncompleteMultipartUpload lifecycle rule stays the second line of defence (docs/operations.md).

An upload to a blob key (PREFIX/blobs/sha256/...; any other key is not ours) is aborted when:
- it began at least the grace period ago, by the store's clock (its Initiated against the Date
  of the listing that showed it);
- no open upload session declares its digest: only such a session feeds a publication while
  its parts arrive (writer/uploads/sessions.py `PrefixHash`), for as long as it stays open,
  however long it waits between parts. The sessions are read after the page was listed, so a
  session opened since then can only feed an upload begun after the listing, not one of it;
  one completed since has completed its upload (the abort then finds it gone);
- no part of it arrived for the grace period either, at most IDLE_CAP_S (ListParts): a staging
  under way (whose digest no session row names) sends part after part, and obstore gives up on
  a part within its request timeout (2 min, ~6 with its retries), so ten minutes without one
  means no writer is sending it.

Racing a live writer is safe either way: an aborted upload takes no further part and cannot be
completed (NoSuchUpload), so nothing partial ever becomes visible; a publication fed while the
parts arrived is dropped and `complete` publishes from the session's file, a staging fails and
its upload answers 503 `unavailable`, resumable (SPEC §11). Only a grace shorter than a
staging's pauses can do that.

Cost: one listing request per page of 1,000 uploads, one ListParts per candidate and one abort
each. An abort is one item and one cost unit, with the bytes of its parts; the store's work is
outside any transaction, so a batch's usage is reserved before it (`ctx.reserving`) and counted
by one progress call. No transaction or digest lock is held across a store request (the sessions
are read in a short query of their own). A store that cannot list or abort them (no static keys,
a refusal, no support) skips the step with a warning; one that fails fails the task, as in any
other step. The pacing and budget helpers are cleanup.py's.
"""

from __future__ import annotations

import logging
from typing import Any

from arkvory.shared.db import pooled
from arkvory.shared.storage import BlobNotFound, StorageRefused
from arkvory.writer.tasks.budgets import cost_units

from .cleanup import QUERY_TIMEOUT_S, _on_disk, _paced, _refuse_next, _room, _spare_transition, _stop_if_cancelled

log = logging.getLogger("arkvory.cleanup")

IDLE_CAP_S = 600
ABORT_BATCH = 100  # candidates looked at (ListParts), then aborted, per budget reservation
ABORT_COST = cost_units(files=1)

# The digests that open sessions declare, of those given: their publications may be fed still.
_OWNED = "SELECT DISTINCT sha256 FROM arkvory_uploads WHERE status = 'open' AND sha256 = ANY($1::text[])"


async def abort_abandoned_uploads(ctx: Any, grace: int) -> dict:
    """The step: counts of the uploads listed, aborted (with their parts' bytes) and kept."""
    storage = ctx.storage
    counts = {"listed": 0, "aborted": 0, "bytes": 0, "kept_for_sessions": 0, "kept_recent": 0}
    if not hasattr(storage, "incomplete_publications"):
        return counts  # a directory: a publication is a link, nothing is left half made
    unlisted = storage.publications_unlisted
    if unlisted is not None:
        return _skipped(counts, unlisted)
    pages = storage.incomplete_publications(offload=_on_disk)
    try:
        while True:
            _stop_if_cancelled(ctx)
            async with _paced():
                page = await anext(pages, None)
            if page is None:
                break
            counts["listed"] += len(page)
            old = [p for p in page if p.age_s >= grace]
            counts["kept_recent"] += len(page) - len(old)
            if not old:
                continue
            async with pooled(ctx.pool) as conn:
                rows = await conn.fetch(_OWNED, sorted({p.sha256 for p in old}), timeout=QUERY_TIMEOUT_S)
            owned = {row["sha256"] for row in rows}
            orphans = [p for p in old if p.sha256 not in owned]
            counts["kept_for_sessions"] += len(old) - len(orphans)
            for start in range(0, len(orphans), ABORT_BATCH):
                await _abort_idle(ctx, orphans[start:start + ABORT_BATCH], min(grace, IDLE_CAP_S), counts)
    except StorageRefused as exc:
        return _skipped(counts, exc.message)
    finally:
        await pages.aclose()
    if not counts["aborted"] and _spare_transition(ctx):
        await ctx.progress(message=f"abandoned multipart uploads: {counts['listed']} listed, none to abort")
    return counts


async def _abort_idle(ctx: Any, candidates: list, idle_s: float, counts: dict) -> None:
    """Abort those of `candidates` that took no part for `idle_s`, as far as the budget goes."""
    storage = ctx.storage
    due = []
    for publication in candidates:
        _stop_if_cancelled(ctx)
        try:
            async with _paced():
                parts = await storage.publication_parts(publication, offload=_on_disk)
        except BlobNotFound:
            continue  # completed or aborted since it was listed
        if parts.idle_s < idle_s:
            counts["kept_recent"] += 1
        else:
            due.append((publication, parts))
    if not due:
        return
    sizes = [parts.bytes for _, parts in due]
    room = _room(ctx, len(due), ABORT_COST, sizes)
    if room == 0:
        _refuse_next(ctx, ABORT_COST, sizes[0])
    due, left = due[:room], due[room:]
    freed = sum(parts.bytes for _, parts in due)
    async with ctx.reserving(items=len(due), bytes=freed, cost_units=len(due) * ABORT_COST, transitions=1):
        for publication, parts in due:
            async with _paced():
                await storage.abort_publication(publication, offload=_on_disk)
            log.info(
                "cleanup: aborted the incomplete multipart upload of %s (%d part(s), %d bytes, begun %.0f s ago)",
                publication.sha256, parts.count, parts.bytes, publication.age_s,
            )
        await ctx.progress(
            items=len(due), bytes=freed, cost_units=len(due) * ABORT_COST,
            message=f"abandoned multipart uploads: {counts['aborted'] + len(due)} aborted,"
                    f" {counts['bytes'] + freed} bytes of parts freed",
        )
    counts["aborted"] += len(due)
    counts["bytes"] += freed
    ctx.metrics.cleanup_aborted_uploads.inc(len(due))
    if left:
        _refuse_next(ctx, ABORT_COST, left[0][1].bytes)  # the budget stopped the step, not the end of the work


def _skipped(counts: dict, why: str) -> dict:
    log.warning(
        "cleanup: not aborting the object store's incomplete multipart uploads: %s; the bucket's"
        " AbortIncompleteMultipartUpload lifecycle rule must remove them (docs/operations.md)", why,
    )
    return {**counts, "skipped": why}
