"""A repository's retention rule (issue 25 item 10): what it keeps, how it is checked and stored,
and the one query that says which artifacts it deletes, shared by the preview (the API's dry
run) and the cleanup task, so that the preview lists exactly what the next cleanup deletes.

How the two limits combine, as Nexus's and Artifactory's cleanup policies and Harbor's and
GitLab's tag retention do: each limit *keeps*, and an artifact goes only when neither keeps
it. An artifact is deleted when it is beyond the newest `keep_newest` of its repository **and**
older than `keep_younger_than_s`; a rule with one limit keeps by that one alone. So adding a
limit never deletes more: "the newest 10, and whatever is younger than 30 days" keeps at least
10 artifacts through a quiet month, and every build of a busy week.

- Newest means by `created_at`, then by id (artifacts uploaded in the same microsecond rank in
  a fixed order), among all the repository's artifacts: those a package version or an asset
  holds count among the newest too.
- A package version or an asset pointing at an artifact always keeps it, whatever its age or
  rank. An asset's *history* keeps nothing: an asset re-pointed at every build would otherwise
  keep every build for ever. Deleting an artifact deletes the history entries that named it
  (catalog/artifacts.py `delete_unused_artifacts`), so no history entry is left pointing at
  nothing.
- Age is measured against the database's clock (`now()` of the statement's transaction).
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import asyncpg

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.errors import InvalidInput

MAX_KEEP_NEWEST = 100_000  # the preview and each turn read this many index entries to find the rest
MIN_AGE_S = 60
MAX_AGE_S = 100 * 365 * 86400  # 100 years: past every artifact's age
FIELDS = ("keepNewest", "keepYoungerThanSeconds", "enabled")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a rule keeps; at least one of the two is set."""

    keep_newest: int | None
    keep_younger_than_s: int | None

    def json(self) -> dict[str, Any]:
        return {"keepNewest": self.keep_newest, "keepYoungerThanSeconds": self.keep_younger_than_s}


def _whole_number(value: Any, field: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"'{field}' must be null or a whole number from {low} to {high}, got {value!r}"[:300])
    return value


def checked_limits(keep_newest: Any, keep_younger_than_s: Any) -> Limits:
    limits = Limits(
        _whole_number(keep_newest, "keepNewest", 1, MAX_KEEP_NEWEST),
        _whole_number(keep_younger_than_s, "keepYoungerThanSeconds", MIN_AGE_S, MAX_AGE_S),
    )
    if limits.keep_newest is None and limits.keep_younger_than_s is None:
        raise InvalidInput("a retention rule needs 'keepNewest', 'keepYoungerThanSeconds' or both")
    return limits


def rule_from_body(body: dict[str, Any]) -> tuple[Limits, bool]:
    """The limits and `enabled` of a PUT body. `enabled` is false unless the body says true:
    a rule starts deleting only when someone asks for that in so many words."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown[:5]}: a retention rule has {list(FIELDS)}"[:300])
    enabled = body.get("enabled", False)
    if not isinstance(enabled, bool):
        raise InvalidInput("'enabled' must be true or false")
    return checked_limits(body.get("keepNewest"), body.get("keepYoungerThanSeconds")), enabled


def rule_json(row: asyncpg.Record, repository: str) -> dict[str, Any]:
    turn = row["turn_at"]
    return {
        "repository": repository,
        **Limits(row["keep_newest"], row["keep_younger_than_s"]).json(),
        "enabled": row["enabled"],
        "updatedAt": row["updated_at"].isoformat(),
        "lastAppliedAt": turn.isoformat() if turn else None,
        "deletedTotal": row["deleted_total"],
    }


_COLUMNS = "keep_newest, keep_younger_than_s, enabled, updated_at, turn_at, deleted_total"


async def load_rule(conn: asyncpg.Connection, repository_id: uuid.UUID, *, lock: bool = False) -> asyncpg.Record | None:
    """The repository's rule row, or None; `lock` holds it until the transaction ends (the
    cleanup's turn: a change to the rule waits for it, and applies from the next turn on)."""
    return await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM arkvory_retention_rules WHERE repository_id = $1"
        + (" FOR NO KEY UPDATE" if lock else ""),
        repository_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )


async def save_rule(conn: asyncpg.Connection, repository_id: uuid.UUID, limits: Limits, enabled: bool) -> asyncpg.Record:
    return await conn.fetchrow(
        "INSERT INTO arkvory_retention_rules (repository_id, keep_newest, keep_younger_than_s, enabled)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT (repository_id) DO UPDATE SET keep_newest = excluded.keep_newest,"
        " keep_younger_than_s = excluded.keep_younger_than_s, enabled = excluded.enabled, updated_at = now()"
        f" RETURNING {_COLUMNS}",
        repository_id, limits.keep_newest, limits.keep_younger_than_s, enabled,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )


async def delete_rule(conn: asyncpg.Connection, repository_id: uuid.UUID) -> bool:
    gone = await conn.fetchval(
        "DELETE FROM arkvory_retention_rules WHERE repository_id = $1 RETURNING 1",
        repository_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return bool(gone)


# The first artifact beyond the newest N (by created_at, then id); the rest of the repository is
# older than it. Found by the (repository_id, created_at) index, reading N + 1 entries.
_DOOMED = """
WITH first_beyond AS (
    SELECT created_at, id FROM arkvory_artifacts
    WHERE repository_id = $1 AND $2::integer IS NOT NULL
    ORDER BY created_at DESC, id DESC OFFSET coalesce($2::integer, 0) LIMIT 1
)
SELECT a.id, a.name, a.sha256, a.size, a.media_type, a.created_at,
       a.uploaded_by_kind, a.uploaded_by_id, a.uploaded_by_name FROM arkvory_artifacts a
WHERE a.repository_id = $1
  AND ($2::integer IS NULL OR (a.created_at, a.id) <= (SELECT created_at, id FROM first_beyond))
  AND ($3::bigint IS NULL OR a.created_at < now() - make_interval(secs => $3::float8))
  AND ($4::timestamptz IS NULL OR (a.created_at, a.id) > ($4::timestamptz, $5::uuid))
  AND NOT EXISTS (SELECT 1 FROM arkvory_packages p WHERE p.artifact_id = a.id)
  AND NOT EXISTS (SELECT 1 FROM arkvory_assets s WHERE s.artifact_id = a.id)
ORDER BY a.created_at, a.id
LIMIT $6
"""


async def doomed_artifacts(
    conn: asyncpg.Connection,
    repository_id: uuid.UUID,
    limits: Limits,
    at_most: int,
    after: tuple[datetime.datetime, uuid.UUID] | None = None,
    *,
    timeout: float = POOLED_QUERY_TIMEOUT_S,
) -> list[asyncpg.Record]:
    """The repository's artifacts `limits` deletes, oldest first (by created_at, then id), at
    most `at_most` of them, after `after` (a (created_at, id) key) when given."""
    after_time, after_id = after if after is not None else (None, None)
    return await conn.fetch(
        _DOOMED, repository_id, limits.keep_newest, limits.keep_younger_than_s, after_time, after_id, at_most,
        timeout=timeout,
    )
