"""Digest claims: the lock that keeps an upload and the cleanup task from racing on one blob.

The danger: an upload places its file as `blobs/sha256/ab/cd/<hex>` (over an old, unreferenced
blob with the same bytes) and commits its artifact, while cleanup, which checked a moment
earlier that nothing referenced that blob, unlinks the file. The result would be a
committed artifact without content.

The rule that prevents it, with a transaction-level advisory lock per digest:

- an upload's publishing transaction takes the digest's lock **shared** first, then places the
  blob (over any file there), inserts the blob row and the artifact, and commits: the lock is
  held from before the file is looked at until the reference is visible;
- cleanup takes the digest's lock **exclusively**, re-checks under it that no artifact
  references the blob (and no live read pin, and that it is older than the grace period),
  deletes the row, unlinks the file, and commits: the lock is held from before the check until
  the file is gone.

- verify takes the digest's lock **exclusively**, waiting, to record a blob missing or corrupt
  once it has looked again that no file is under the digest: an upload that places good bytes
  clears that diagnostic in its publishing transaction (writer/artifacts.py), so the record
  and the clearing never interleave into a diagnostic of a blob that is good again.

Both are transaction locks, so they last exactly until the commit. Either cleanup held the lock
first (the upload then waits, finds no file and places its own) or the upload did (cleanup's
re-check, a new statement after the lock was granted, sees the committed artifact). Uploads
share the lock with each other, so identical concurrent uploads never wait on one another.

Keys use the two-int form `(namespace, key)`: PostgreSQL keeps two-int and one-bigint advisory
keys apart, so these never collide with the process locks of shared/db.py. The key is the first
32 bits of the digest; two digests sharing a key only serialise each other, never unlock.
"""

from __future__ import annotations

import asyncpg

# "ARKB": arbitrary but fixed forever (operators' tools may look for it in pg_locks).
DIGEST_NAMESPACE = 0x41524B42
LOCK_TIMEOUT_S = 10.0


def digest_key(sha256: str) -> int:
    """The digest's lock key: its first 32 bits as a signed int4 (what PostgreSQL takes)."""
    value = int(sha256[:8], 16)
    return value - (1 << 32) if value >= (1 << 31) else value


async def claim_for_upload(conn: asyncpg.Connection, sha256: str) -> None:
    """Inside the publishing transaction, before the blob file is placed or looked at."""
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
    """Inside verify's transaction, before it looks again for the file and records a diagnostic;
    waits for the uploads publishing that digest (each holds it a short transaction long)."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, $2)", DIGEST_NAMESPACE, digest_key(sha256), timeout=LOCK_TIMEOUT_S
    )
