"""The disk that open upload sessions reserve, and one principal's share of it.

A session's file is preallocated at creation (writer/uploads/sessions.py), so an open session
holds its whole size until it completes, is deleted or expires. One principal's open sessions
may hold at most ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL (by default one largest artifact) and
MAX_OPEN_SESSIONS sessions: without it one user reserved all the free disk with empty sessions
and every other upload got 507 until they expired.

The check and the new row are one step: the creating transaction takes a lock on the principal
before it sums, so a concurrent create of the same principal waits for this commit and counts
this session. (The free-space check and the preallocation are one step across principals too:
`allocate_session_file` holds a process lock over both.)
"""

from __future__ import annotations

import hashlib

import asyncpg

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.errors import Conflict, PayloadTooLarge

# Open sessions per principal: a bound on its rows whatever their sizes.
MAX_OPEN_SESSIONS = 100
# "ARKR": the two-int advisory lock namespace of a principal's reservations, fixed forever (it
# shows in pg_locks); two principals sharing a key only wait for each other.
RESERVATION_NAMESPACE = 0x41524B52


def _principal_key(principal_id: str) -> int:
    return int.from_bytes(hashlib.sha256(principal_id.encode()).digest()[:4], "big", signed=True)


def check_reservable(size: int, limit: int) -> None:
    """A session that alone is more than the principal may reserve can never be created (413)."""
    if size > limit:
        raise PayloadTooLarge(
            f"an upload session of {size} bytes is more than one principal may reserve"
            f" ({limit} bytes, ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL)"
        )


async def reserved_by(conn: asyncpg.Connection, principal_id: str) -> tuple[int, int]:
    """(open sessions, bytes they reserve) of this principal."""
    row = await conn.fetchrow(
        "SELECT count(*) AS sessions, coalesce(sum(size), 0)::bigint AS reserved FROM arkvory_uploads"
        " WHERE principal_id = $1 AND status = 'open'",
        principal_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return row["sessions"], row["reserved"]


async def claim_reservation(conn: asyncpg.Connection, principal_id: str, size: int, limit: int) -> None:
    """Inside the transaction that inserts the session, before the insert: 409 if this session
    would take the principal past its share (or past MAX_OPEN_SESSIONS); the principal stays
    locked until the commit."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, $2)", RESERVATION_NAMESPACE, _principal_key(principal_id),
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    sessions, reserved = await reserved_by(conn, principal_id)
    if sessions >= MAX_OPEN_SESSIONS:
        raise Conflict(
            f"{sessions} upload sessions of yours are open (at most {MAX_OPEN_SESSIONS}):"
            " complete or delete some first"
        )
    if reserved + size > limit:
        raise Conflict(
            f"your {sessions} open upload session(s) reserve {reserved} bytes; {size} more would pass"
            f" the {limit} one principal may reserve (ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL):"
            " complete or delete some first (GET …/uploads lists them)"
        )
