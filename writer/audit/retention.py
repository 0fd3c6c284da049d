"""Entries older than ARKVORY_AUDIT_RETENTION go: the worker's cleanup deletes them in batches
within its budget (writer/maintenance/cleanup.py `_audit_entries`), oldest first, through the
index on (at, id)."""

from __future__ import annotations

import asyncpg

QUERY_TIMEOUT_S = 60.0

_OLD = "at < now() - make_interval(secs => $1)"


async def prune_batch(conn: asyncpg.Connection, retention_s: int, at_most: int) -> int:
    """Delete up to `at_most` entries past the retention, the oldest first; how many went."""
    status = await conn.execute(
        f"DELETE FROM arkvory_audit WHERE id IN (SELECT id FROM arkvory_audit WHERE {_OLD} ORDER BY at, id LIMIT $2)",
        float(retention_s), at_most,
        timeout=QUERY_TIMEOUT_S,
    )
    return int(status.split()[-1])


async def any_to_prune(conn: asyncpg.Connection, retention_s: int) -> bool:
    return await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM arkvory_audit WHERE {_OLD})", float(retention_s), timeout=QUERY_TIMEOUT_S
    )
