"""GET /api/v1/audit: the audit trail for administrators, newest first (or oldest first, to
export it), filtered (filters.py) and paged like every list (pagination.py), by (time, id).

An entry appears when its change commits; one whose transaction began earlier may commit after
a later one, so a page of the newest entries is final only for times a little in the past
(docs/operations.md says how to export).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled

from .. import openapi
from ..pagination import SortColumn, page, page_cursor, page_limit
from ..request_inputs import principal_of, query, require_admin_scope, runtime_of
from .actions import ACTION_NAMES, FAMILIES
from .filters import NAMES, ORDERS, OUTCOMES, AuditFilters

PATH = "/api/v1/audit"


def entry_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": row["id"],
        "at": row["at"].isoformat(),
        "actor": {
            "kind": row["actor_kind"],
            "id": row["actor_id"],
            "name": row["actor_name"],
            "credentialKind": row["credential_kind"],
            "credentialId": None if row["credential_id"] is None else str(row["credential_id"]),
        },
        "action": row["action"],
        "outcome": row["outcome"],
        "status": row["status"],
        "repository": row["repository"],
        "target": row["target"],
        "details": json.loads(row["details"]),
        "clientAddress": row["client_address"],
        "requestId": row["request_id"],
    }


_KEY = (SortColumn("at", "at", "timestamptz"), SortColumn("id", "id", "bigint"))


def _cursor(request: Request) -> tuple[datetime.datetime, int] | None:
    return page_cursor(request, _KEY)  # a time in UTC and a bigint, or 400


async def fetch_page(conn: asyncpg.Connection, filters: AuditFilters, after: tuple | None, limit: int) -> list:
    """Up to `limit + 1` entries after the cursor `after` (its (at, id)), as the filters pick."""
    conditions, arguments = filters.conditions()
    if after is not None:
        arguments += list(after)
        pick = "<" if filters.newest_first else ">"
        conditions.append(f"(at, id) {pick} (${len(arguments) - 1}, ${len(arguments)})")
    direction = "DESC" if filters.newest_first else "ASC"
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return await conn.fetch(
        f"SELECT * FROM arkvory_audit{where} ORDER BY at {direction}, id {direction} LIMIT ${len(arguments) + 1}",
        *arguments, limit + 1,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )


async def list_audit(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "the audit trail")
    # Unknown and repeated parameters are refused before (request_inputs.with_declared_query).
    filters = AuditFilters.from_query(
        (name, value) for name in NAMES if (value := query(request, name)) is not None
    )
    limit = page_limit(request)
    after = _cursor(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await fetch_page(conn, filters, after, limit)
    return JSONResponse(page(rows, limit, entry_json, lambda row: [row["at"].isoformat(), str(row["id"])]))


routes = [Route(PATH, list_audit, methods=["GET"])]


_ENTRY = {
    "type": "object",
    "required": ["id", "at", "actor", "action", "outcome", "status", "repository", "target", "details",
                 "clientAddress", "requestId"],
    "properties": {
        "id": {"type": "integer"},
        "at": {"type": "string", "format": "date-time", "description": "when the change was made (its transaction)"},
        "actor": {
            "type": "object",
            "required": ["kind", "id", "name", "credentialKind", "credentialId"],
            "properties": {
                "kind": {"type": "string", "enum": ["account", "service", "key", "anonymous", "tool"]},
                "id": {"type": "string", "description": "account:<uuid>, service:<uuid>, key:<id>, anonymous,"
                       " or tool:<command> for an admin tool"},
                "name": {"type": ["string", "null"], "description": "the account's name, the keys-file key's id,"
                         " the managed key's label, or user@host of a tool"},
                "credentialKind": {"type": ["string", "null"], "enum": ["session", "pat", "service_key", None]},
                "credentialId": {"type": ["string", "null"], "format": "uuid",
                                 "description": "the credential's id (never its token)"},
            },
        },
        "action": {"type": "string", "description": "family.verb, e.g. repository.delete"},
        "outcome": {"type": "string", "enum": list(OUTCOMES)},
        "status": {"type": ["integer", "null"], "description": "the answer's status; null for a tool"},
        "repository": {"type": ["string", "null"]},
        "target": {"type": ["string", "null"], "description": "what changed: an id, a name, group/name/version,"
                   " an asset's path"},
        "details": {"type": "object", "description": "a bounded summary of the parameters, without secrets"},
        "clientAddress": {"type": ["string", "null"], "description": "as seen through ARKVORY_TRUSTED_PROXIES"},
        "requestId": {"type": ["string", "null"]},
    },
}

OPENAPI_PATHS: dict[str, Any] = {
    PATH: {"get": {
        "summary": "The audit trail (admin): every change, who made it with which credential, from where,"
        " and how it ended; failed sign-ins and permission refusals too (bounded per principal or address)",
        "description": "Newest first unless `order=oldest`. Filters combine (all must match); an unknown"
        f" query parameter is 400. Known: {', '.join(NAMES)}.",
        "parameters": [
            openapi.query_param("principal", "A principal id (account:<uuid>, service:<uuid>, key:<id>,"
                                " tool:<command>) or a name (account, key id, key label), any case."),
            openapi.query_param("action", "An action, or a family of them.", schema={
                "type": "string", "enum": [*FAMILIES, *ACTION_NAMES]}),
            openapi.query_param("repository", "The repository the change was in."),
            openapi.query_param("target", "What changed: an artifact, task, upload or credential id, an"
                                " account name, group/name/version, an asset's path."),
            openapi.query_param("outcome", "ok, or refused.", schema={"type": "string", "enum": list(OUTCOMES)}),
            openapi.query_param("since", "Entries at or after this time (ISO 8601; UTC without an offset).",
                                schema={"type": "string", "format": "date-time"}),
            openapi.query_param("until", "Entries before this time.", schema={"type": "string", "format": "date-time"}),
            openapi.query_param("order", "newest (default) or oldest first.",
                                schema={"type": "string", "enum": list(ORDERS)}),
            *openapi.page_params(),
        ],
        "responses": {
            "200": {"description": "One page", "content": openapi.json_content(openapi.page_of(_ENTRY))},
            **openapi.errors(400, 401, 403),
        },
    }},
}
