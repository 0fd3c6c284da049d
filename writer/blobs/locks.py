"""Digest claims and removal marks: how uploads, cleanup and verify share one blob without
racing, and without any of them holding a transaction or a lock while the storage works.

The danger: an upload stores its bytes under `blobs/sha256/ab/cd/<hex>` (an object store
receives them before the publishing transaction; a directory links the file inside it), and
commits its artifact, while cleanup, which checked a moment earlier that nothing referenced an
old blob with those bytes, deletes it. The result would be a committed artifact without content.
And the storage may take long (an object store's DELETE: up to its 120 s timeout and retries),
so nobody may hold a transaction or a digest lock while it works (issue 22): an upload of the
same bytes would wait on it and fail.

Two tools. A **digest claim** is a transaction-level advisory lock per digest, held only for
short transactions that make no storage call: uploads take it shared (`claim_for_upload`),
cleanup and verify exclusively. A **removal mark** is a row of `arkvory_blob_removals`: it is
inserted, under the exclusive claim, by the transaction that decides to remove a stored blob
(`mark_removals`), the storage is asked to remove it after that commit, and the mark is
*settled* once the storage said it is gone (`settle_removals`). A pending mark means "whatever
is stored under this digest may vanish at any moment"; marks have increasing ids.

The rules:

- **cleanup** (writer/maintenance/cleanup.py) takes the exclusive claims without waiting
  (`try_claim_for_removal`: a digest being published is left for the next run), re-checks in a
  statement that starts after they are granted (no artifact references the blob, it is older
  than the grace period, no live read pin, no pending mark), deletes the row, marks, commits;
  then deletes from the storage, outside any transaction, and settles. A removal stopped in
  between (a crash, a failing store, a cancel) stays pending until the next run finishes it:
  deleting again is harmless.
- **an upload** (writer/uploads/publishing.py `publish_blob`) first reads, under the shared claim, the
  newest mark id (`before_staging`); if a removal of its digest is pending it waits for it to
  settle (at most REMOVAL_WAIT_S, then `RemovalUnderWay`: a 503). Then it stages its bytes and,
  in the publishing transaction under the shared claim, checks that no removal of the digest
  is pending or was marked since (`check_not_removed_since`): if one was, it rolls back, waits
  for it and stages again.
- **verify** (writer/maintenance/verify.py) quarantines a corrupt object the same way as
  cleanup removes one (mark under the claim, move it, then record and settle), and records a
  blob missing under the exclusive claim (`claim_for_diagnosis`, which waits for the uploads'
  short transactions), then looks for it once more outside and withdraws the finding if it is
  there again.

Why an upload's artifact always has its bytes: take its publishing transaction P and any
removal R of the digest (its marking transaction M). Both hold the digest's claim, so they are
ordered. If M comes after P, M's re-check sees P's artifact and R never happens. If M comes
before P, then either R was still pending at P (P refuses) or M came after the upload's
`before_staging` read (R's id is newer than what it read: P refuses), or R was settled before
that read, so its storage call was over before the upload staged. The read needs the claim: a
mark committed after it then has an id taken after it, so newer than anything it read (ids
come from a sequence, committed in any order). Settled marks are kept SETTLED_KEPT_S; an upload
whose staging took longer stages again. The one assumption: a store acts on a request before
it answers it (and not after a later request for the same key was answered).

The directory backend needs the same rules: its publish links the file inside P (a local rename
is no storage call in this sense), and a pending unlink may come after it.

Keys use the two-int form `(namespace, key)`: PostgreSQL keeps two-int and one-bigint advisory
keys apart, so these never collide with the process locks of shared/db.py. The key is the first
32 bits of the digest; two digests sharing a key only serialise each other, never unlock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
import uuid
from collections.abc import Iterable

import asyncpg

from arkvory.shared.db import pooled
from arkvory.writer.tasks.store import UNFINISHED

# "ARKB": arbitrary but fixed forever (operators' tools may look for it in pg_locks).
DIGEST_NAMESPACE = 0x41524B42
LOCK_TIMEOUT_S = 10.0
QUERY_TIMEOUT_S = 10.0
# How long settled marks are kept: the longest an upload's staging may take and still publish.
SETTLED_KEPT_S = 86400
# How long an upload waits for a pending removal of its digest before answering 503.
REMOVAL_WAIT_S = 30.0
REMOVAL_POLL_S = 0.2


def digest_key(sha256: str) -> int:
    """The digest's lock key: its first 32 bits as a signed int4 (what PostgreSQL takes)."""
    value = int(sha256[:8], 16)
    return value - (1 << 32) if value >= (1 << 31) else value


# -- claims ----------------------------------------------------------------------------------


async def claim_for_upload(conn: asyncpg.Connection, sha256: str) -> None:
    """Inside a transaction of an upload's, before it looks at removal marks or publishes."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock_shared($1, $2)",
        DIGEST_NAMESPACE, digest_key(sha256), timeout=LOCK_TIMEOUT_S,
    )


async def try_claim_for_removal(conn: asyncpg.Connection, digests: list[str]) -> list[str]:
    """Inside cleanup's transaction: take the exclusive lock of each digest that nobody is
    uploading right now; returns the digests locked. Cleanup never waits for an upload: a
    digest being published is simply left for the next run."""
    if not digests:
        return []
    keys = [digest_key(d) for d in digests]
    rows = await conn.fetch(
        "SELECT k, pg_try_advisory_xact_lock($1, k) AS locked"
        " FROM (SELECT DISTINCT k FROM unnest($2::int[]) AS k ORDER BY k) AS keys",
        DIGEST_NAMESPACE, keys, timeout=LOCK_TIMEOUT_S,
    )
    locked = {row["k"] for row in rows if row["locked"]}
    return [d for d, k in zip(digests, keys) if k in locked]


async def claim_for_diagnosis(conn: asyncpg.Connection, sha256: str) -> None:
    """Inside verify's transaction, before it marks a quarantine or records a diagnostic;
    waits for the uploads publishing that digest (each holds it a short transaction long)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, $2)", DIGEST_NAMESPACE, digest_key(sha256), timeout=LOCK_TIMEOUT_S
    )


# -- removal marks (cleanup, verify) ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Removal:
    id: int
    sha256: str


# SQL: no removal of the digest `d` is pending.
NONE_PENDING = "NOT EXISTS (SELECT 1 FROM arkvory_blob_removals r WHERE r.sha256 = {d} AND r.settled_at IS NULL)"


async def mark_removals(
    conn: asyncpg.Connection, digests: Iterable[str], reason: str, task_id: uuid.UUID | None
) -> list[Removal]:
    """In the transaction that holds the digests' exclusive claims and found (in a statement
    after they were granted, with NONE_PENDING) that they are to go: the marks, committed with it."""
    rows = await conn.fetch(
        "INSERT INTO arkvory_blob_removals (sha256, reason, task_id)"
        " SELECT d, $2, $3 FROM unnest($1::text[]) AS d RETURNING id, sha256",
        list(digests), reason, task_id, timeout=QUERY_TIMEOUT_S,
    )
    return [Removal(row["id"], row["sha256"]) for row in rows]


async def settle_removals(conn: asyncpg.Connection, removals: Iterable[Removal]) -> None:
    """Once the storage said the blobs are gone (any transaction, or none)."""
    await conn.execute(
        "UPDATE arkvory_blob_removals SET settled_at = now() WHERE id = ANY($1::bigint[]) AND settled_at IS NULL",
        [r.id for r in removals], timeout=QUERY_TIMEOUT_S,
    )


async def pending_removals(conn: asyncpg.Connection, reasons: Iterable[str]) -> list[Removal]:
    """Removals for these reasons that a stopped run left pending (oldest first)."""
    rows = await conn.fetch(
        "SELECT id, sha256 FROM arkvory_blob_removals WHERE settled_at IS NULL AND reason = ANY($1::text[])"
        " ORDER BY id",
        list(reasons), timeout=QUERY_TIMEOUT_S,
    )
    return [Removal(row["id"], row["sha256"]) for row in rows]


async def ended_quarantines(conn: asyncpg.Connection) -> list[Removal]:
    """Quarantines whose verify task has ended without settling them (the store failed it):
    cleanup settles them, so that uploads of those bytes need not wait for the next verify."""
    rows = await conn.fetch(
        "SELECT r.id, r.sha256 FROM arkvory_blob_removals r"
        " WHERE r.settled_at IS NULL AND r.reason = 'quarantine' AND NOT EXISTS ("
        "     SELECT 1 FROM arkvory_tasks t WHERE t.id = r.task_id AND t.status = ANY($1::text[]))",
        list(UNFINISHED), timeout=QUERY_TIMEOUT_S,
    )
    return [Removal(row["id"], row["sha256"]) for row in rows]


async def prune_settled_removals(conn: asyncpg.Connection) -> int:
    status = await conn.execute(
        "DELETE FROM arkvory_blob_removals WHERE settled_at < now() - make_interval(secs => $1)",
        float(SETTLED_KEPT_S), timeout=QUERY_TIMEOUT_S,
    )
    return int(status.split()[-1])


# -- uploads -------------------------------------------------------------------------------


class RemovalUnderWay(Exception):
    """A removal of the digest did not settle within REMOVAL_WAIT_S (the storage is slow or
    failing, or the run that marked it stopped): nothing was published; retry later."""


class RemovedSinceStaging(Exception):
    """Raised in a publishing transaction: a removal of the digest is pending or was marked
    after the upload staged its bytes, which may be gone. Roll back and publish again."""


@dataclasses.dataclass(frozen=True)
class Staging:
    """What an upload saw just before staging: the newest removal mark, and when."""

    last_removal: int
    at: datetime.datetime


_BEFORE_STAGING = f"""
SELECT (SELECT coalesce(max(id), 0) FROM arkvory_blob_removals) AS last_removal,
       NOT {NONE_PENDING.format(d="$1")} AS pending, now() AS at
"""


async def before_staging(pool: asyncpg.Pool, sha256: str) -> Staging:
    """Before an upload stages its bytes: waits for a pending removal of the digest to settle
    (RemovalUnderWay after REMOVAL_WAIT_S), and notes the newest mark, under the shared claim.
    No transaction is held while it waits."""
    deadline = time.monotonic() + REMOVAL_WAIT_S
    while True:
        async with pooled(pool) as conn, conn.transaction():
            await claim_for_upload(conn, sha256)
            row = await conn.fetchrow(_BEFORE_STAGING, sha256, timeout=QUERY_TIMEOUT_S)
        if not row["pending"]:
            return Staging(row["last_removal"], row["at"])
        if time.monotonic() >= deadline:
            raise RemovalUnderWay(f"a removal of the stored blob {sha256} from the storage is still under way")
        await asyncio.sleep(REMOVAL_POLL_S)


async def check_not_removed_since(conn: asyncpg.Connection, sha256: str, staging: Staging) -> None:
    """In the publishing transaction, after `claim_for_upload`: RemovedSinceStaging when the
    staged bytes may be gone (a removal pending or marked since `staging`, or settled marks
    older than `staging` may be pruned already)."""
    removed = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM arkvory_blob_removals WHERE sha256 = $1"
        "               AND (settled_at IS NULL OR id > $2))"
        " OR now() - $3::timestamptz > make_interval(secs => $4)",
        sha256, staging.last_removal, staging.at, float(SETTLED_KEPT_S), timeout=QUERY_TIMEOUT_S,
    )
    if removed:
        raise RemovedSinceStaging(f"the stored blob {sha256} was being removed while this upload staged it")
