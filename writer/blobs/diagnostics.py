"""Storage diagnostics: what the verify task found wrong with stored blobs, and the
administrators' list of it (`GET /api/v1/storage/diagnostics`).

A row says a blob is `missing` (no file under its digest) or `corrupt` (its bytes are not its
digest or its size: the file was moved to quarantine, see quarantine.py). Either way the store
has no file under that digest, so an upload that places the right bytes again clears the row in
its publishing transaction (`clear_diagnostic`, from writer/uploads/publishing.py `place_claimed_blob`),
and a later verify that finds the blob good clears it too.
"""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Forbidden, InvalidInput, Unauthorized

from .. import openapi
from ..pagination import NEWEST, OLDEST, ListQuery, SortColumn, choice_filter, page_cursor, page_limit, page_order
from ..request_inputs import principal_of, query, runtime_of

PROBLEMS = ("missing", "corrupt")
ARTIFACTS_SHOWN = 10  # per entry: enough to find what is affected; the rest via `moreArtifacts`
MAX_DETAIL = 1000


async def record_diagnostic(
    conn: asyncpg.Connection, sha256: str, problem: str, detail: str, task_id: uuid.UUID | None
) -> None:
    """Insert or update the blob's diagnostic; `detected_at` stays the first detection of the
    same problem, so an operator sees since when it is broken."""
    await conn.execute(
        "INSERT INTO arkvory_storage_diagnostics AS d (sha256, problem, detail, task_id)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT (sha256) DO UPDATE SET"
        " problem = EXCLUDED.problem, detail = EXCLUDED.detail, task_id = EXCLUDED.task_id,"
        " detected_at = CASE WHEN d.problem = EXCLUDED.problem THEN d.detected_at ELSE now() END",
        sha256, problem, detail[:MAX_DETAIL], task_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )


async def clear_diagnostic(conn: asyncpg.Connection, sha256: str) -> bool:
    """Forget the blob's diagnostic: call it once a good file is under the digest again (a
    verify found it good, or an upload placed the bytes it hashed). True if there was one."""
    status = await conn.execute(
        "DELETE FROM arkvory_storage_diagnostics WHERE sha256 = $1", sha256, timeout=POOLED_QUERY_TIMEOUT_S
    )
    return status != "DELETE 0"


async def prune_diagnostics_without_blob(conn: asyncpg.Connection) -> int:
    """Drop diagnostics of blobs cleanup has removed since: nothing is left to repair."""
    status = await conn.execute(
        "DELETE FROM arkvory_storage_diagnostics d"
        " WHERE NOT EXISTS (SELECT 1 FROM arkvory_blobs b WHERE b.sha256 = d.sha256)",
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return int(status.split()[-1])


async def diagnostic_counts(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT problem, count(*) AS n FROM arkvory_storage_diagnostics GROUP BY problem",
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    counts = dict.fromkeys(PROBLEMS, 0)
    counts.update({row["problem"]: row["n"] for row in rows})
    return counts


# -- the list --------------------------------------------------------------------------------

_SELECT = f"""
SELECT d.sha256, d.problem, d.detail, d.task_id, d.detected_at, b.size,
       ARRAY(
           SELECT r.name || '/' || a.id::text
           FROM arkvory_artifacts a JOIN arkvory_repositories r ON r.id = a.repository_id
           WHERE a.sha256 = d.sha256
           ORDER BY a.created_at, a.id
           LIMIT {ARTIFACTS_SHOWN + 1}
       ) AS artifacts
FROM arkvory_storage_diagnostics d LEFT JOIN arkvory_blobs b ON b.sha256 = d.sha256
"""
# By digest (the primary key), or newest or oldest detection first ((detected_at, sha256)).
DIGEST_ORDER = (SortColumn("d.sha256", "sha256"),)
TIME_ORDER = (SortColumn("d.detected_at", "detected_at", "timestamptz"), *DIGEST_ORDER)
ORDERS = ("sha256", NEWEST, OLDEST)
_HEX = re.compile(r"[0-9a-fA-F]{1,64}")


def diagnostics_listing(*, order: str = "sha256", problem: str | None = None, prefix: str | None = None,
                        cursor: tuple | None = None) -> ListQuery:
    listing = ListQuery(_SELECT, DIGEST_ORDER if order == "sha256" else TIME_ORDER, descending=order == NEWEST)
    if problem is not None:
        listing.where("d.problem = {}", problem)
    # Lowercase hex sorts alike in every collation: the primary key's range serves the prefix.
    return listing.starts_with("d.sha256", prefix).after(cursor)


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat()


def diagnostic_json(row: asyncpg.Record) -> dict[str, Any]:
    # A repository name has no '/', so the first one splits name from id.
    artifacts = [dict(zip(("repository", "id"), ref.split("/", 1))) for ref in row["artifacts"]]
    return {
        "sha256": row["sha256"],
        "problem": row["problem"],
        "detail": row["detail"],
        "size": row["size"],
        "taskId": None if row["task_id"] is None else str(row["task_id"]),
        "detectedAt": _iso(row["detected_at"]),
        "artifacts": artifacts[:ARTIFACTS_SHOWN],
        "moreArtifacts": len(artifacts) > ARTIFACTS_SHOWN,
    }


async def list_diagnostics(request: Request) -> Response:
    """By digest (or newest or oldest first), `?problem=` to keep one kind, `?prefix=` of the
    digest, `?limit=`/`?cursor=` to page (administrators)."""
    principal = await principal_of(request)
    if principal.is_anonymous:
        raise Unauthorized("this request needs credentials")
    if not principal.is_admin:
        raise Forbidden("storage diagnostics need the admin scope")
    problem = choice_filter(request, "problem", PROBLEMS)
    prefix = query(request, "prefix")
    if prefix is not None and not _HEX.fullmatch(prefix):
        raise InvalidInput("query parameter 'prefix' must be 1-64 hexadecimal digits of a SHA-256")
    order = page_order(request, "sha256", ORDERS)
    limit = page_limit(request)
    listing = diagnostics_listing(
        order=order, problem=problem, prefix=None if prefix is None else prefix.lower(),
        cursor=page_cursor(request, DIGEST_ORDER if order == "sha256" else TIME_ORDER),
    )
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, diagnostic_json))


routes = [Route("/api/v1/storage/diagnostics", list_diagnostics, methods=["GET"])]

_DIAGNOSTIC = {
    "type": "object",
    "required": ["sha256", "problem", "detail", "size", "taskId", "detectedAt", "artifacts", "moreArtifacts"],
    "properties": {
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "problem": {
            "type": "string",
            "enum": list(PROBLEMS),
            "description": "missing: no file under the digest; corrupt: wrong bytes or size, moved to "
            "<data>/quarantine/sha256/. Either way downloads answer 503 content_unavailable until the "
            "content is uploaded again.",
        },
        "detail": {"type": "string"},
        "size": {"type": ["integer", "null"], "description": "recorded size; null once cleanup removed the blob"},
        "taskId": {"type": ["string", "null"], "format": "uuid", "description": "the verify task that found it"},
        "detectedAt": {"type": "string", "format": "date-time", "description": "first detection of this problem"},
        "artifacts": {
            "type": "array",
            "maxItems": ARTIFACTS_SHOWN,
            "items": {
                "type": "object",
                "required": ["repository", "id"],
                "properties": {"repository": {"type": "string"}, "id": {"type": "string", "format": "uuid"}},
            },
            "description": "artifacts whose content this is (oldest first)",
        },
        "moreArtifacts": {"type": "boolean", "description": "more artifacts use it than listed"},
    },
}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/storage/diagnostics": {
        "get": {
            "summary": "Blobs the verify task found missing or corrupt (administrators)",
            "parameters": [
                openapi.query_param(
                    "problem", "Only this problem.", schema={"type": "string", "enum": list(PROBLEMS)}
                ),
                openapi.query_param("prefix", "Only digests that start with these hexadecimal digits.",
                                    schema={"type": "string", "pattern": "^[0-9a-fA-F]{1,64}$"}),
                openapi.order_param("sha256", ORDERS, sorted_by="detection; `sha256`: by digest"),
                *openapi.page_params(),
            ],
            "responses": {
                "200": {"description": "A page, by digest or detection time", "content": openapi.json_content(openapi.page_of(_DIAGNOSTIC))},
                **openapi.errors(400, 401, 403),
            },
        }
    }
}
