"""Writer routes for a repository's retention rule (issue 25 item 10): show, set, delete, and the
preview (the dry run) that lists, a page at a time, the artifacts the next cleanup would delete.

Only an administrator or the repository's own admins see and change its rule; a repository the
caller may not read answers 404 as everywhere. A rule is stored disabled unless the PUT says
`"enabled": true`, so a rule is previewed before it deletes anything, and changing an enabled
rule's limits takes `"enabled": true` again. The cleanup task applies enabled rules
(writer/maintenance/retention.py); retention_rules.py says what a rule deletes.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.db import pooled
from arkvory.shared.download.catalog import Repository
from arkvory.shared.errors import InvalidInput, NotFound

from .. import openapi
from ..idempotency import idempotent
from ..pagination import TIME_ID, page, page_cursor, page_limit
from ..request_inputs import json_body, query, runtime_of
from .artifacts import ARTIFACT_SCHEMA, artifact_json
from .repositories import administered_repository
from .retention_rules import (
    MAX_AGE_S,
    MAX_KEEP_NEWEST,
    MIN_AGE_S,
    Limits,
    checked_limits,
    delete_rule,
    doomed_artifacts,
    load_rule,
    rule_from_body,
    rule_json,
    save_rule,
)



async def _administered(request: Request):
    return await administered_repository(request, "the retention rule")


def _no_rule(repo: Repository) -> NotFound:
    return NotFound(f"{repo.name!r} has no retention rule")


async def show_rule(request: Request) -> Response:
    _, repo = await _administered(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        row = await load_rule(conn, repo.id)
    if row is None:
        raise _no_rule(repo)
    return JSONResponse(rule_json(row, repo.name))


async def set_rule(request: Request) -> Response:
    principal, repo = await _administered(request)
    body = await json_body(request)
    limits, enabled = rule_from_body(body)

    async def work(conn: asyncpg.Connection):
        return 200, rule_json(await save_rule(conn, repo.id, limits, enabled), repo.name)

    return await idempotent(request, principal, {"rule": {**limits.json(), "enabled": enabled}}, work)


async def remove_rule(request: Request) -> Response:
    principal, repo = await _administered(request)

    async def work(conn: asyncpg.Connection):
        if not await delete_rule(conn, repo.id):
            raise _no_rule(repo)
        return 204, None

    return await idempotent(request, principal, {}, work)


def _count(request: Request, name: str, low: int, high: int) -> int | None:
    raw = query(request, name)
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12):
        raise InvalidInput(f"query parameter '{name}' must be a whole number from {low} to {high}")
    return int(raw)


def _previewed_limits(request: Request) -> Limits | None:
    """The limits the query asks to preview instead of the saved rule's, if it names any."""
    if query(request, "keepNewest") is None and query(request, "keepYoungerThanSeconds") is None:
        return None
    return checked_limits(
        _count(request, "keepNewest", 1, MAX_KEEP_NEWEST),
        _count(request, "keepYoungerThanSeconds", MIN_AGE_S, MAX_AGE_S),
    )


async def preview(request: Request) -> Response:
    """The artifacts the next cleanup would delete, oldest first: of the saved rule (enabled or
    not), or of the limits the query gives. Deletes nothing."""
    _, repo = await _administered(request)
    limit = page_limit(request)
    after = page_cursor(request, TIME_ID)  # (created_at, id) or None
    asked = _previewed_limits(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        if asked is None:
            row = await load_rule(conn, repo.id)
            if row is None:
                raise NotFound(
                    f"{repo.name!r} has no retention rule: set one, or preview limits with ?keepNewest= "
                    "and ?keepYoungerThanSeconds="
                )
            limits, enabled = Limits(row["keep_newest"], row["keep_younger_than_s"]), row["enabled"]
        else:
            limits, enabled = asked, None
        rows = await doomed_artifacts(conn, repo.id, limits, limit + 1, after)
    answer = page(rows, limit, artifact_json, lambda r: [r["created_at"].isoformat(), str(r["id"])])
    return JSONResponse({**answer, "rule": {**limits.json(), "enabled": enabled}})


routes = [
    Route("/api/v1/repositories/{repo}/retention", show_rule, methods=["GET"]),
    Route("/api/v1/repositories/{repo}/retention", set_rule, methods=["PUT"]),
    Route("/api/v1/repositories/{repo}/retention", remove_rule, methods=["DELETE"]),
    Route("/api/v1/repositories/{repo}/retention/preview", preview, methods=["GET"]),
]


_KEEP_NEWEST = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_KEEP_NEWEST,
                "description": "Keep the repository's newest N artifacts (by createdAt, then id)."}
_KEEP_YOUNGER = {"type": ["integer", "null"], "minimum": MIN_AGE_S, "maximum": MAX_AGE_S,
                 "description": "Keep the artifacts younger than this many seconds."}
_LIMITS = {"keepNewest": _KEEP_NEWEST, "keepYoungerThanSeconds": _KEEP_YOUNGER}
_RULE = {
    "type": "object",
    "required": ["repository", *_LIMITS, "enabled", "updatedAt", "lastAppliedAt", "deletedTotal"],
    "properties": {
        "repository": {"type": "string"},
        **_LIMITS,
        "enabled": {"type": "boolean"},
        "updatedAt": {"type": "string", "format": "date-time"},
        "lastAppliedAt": {"type": ["string", "null"], "format": "date-time",
                          "description": "When the cleanup last took this repository's turn; null: never."},
        "deletedTotal": {"type": "integer", "description": "Artifacts the cleanup deleted under this rule, in all."},
    },
}
_SEMANTICS = (
    "An artifact is deleted only when it is beyond the newest `keepNewest` AND older than "
    "`keepYoungerThanSeconds` (a rule with one limit keeps by that one alone); a package version or "
    "an asset pointing at it always keeps it."
)
_PREVIEW = openapi.page_of(ARTIFACT_SCHEMA)
_PREVIEW["required"] = [*_PREVIEW["required"], "rule"]
_PREVIEW["properties"]["rule"] = {
    "type": "object", "required": [*_LIMITS, "enabled"],
    "properties": {**_LIMITS, "enabled": {"type": ["boolean", "null"],
                                          "description": "The saved rule's; null when the query gave the limits."}},
}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/repositories/{repo}/retention": {
        "get": {
            "summary": "A repository's retention rule (admin or its repository admins)",
            "parameters": [openapi.repo_param()],
            "responses": {"200": {"description": "The rule", "content": openapi.json_content(_RULE)},
                          **openapi.errors(400, 401, 403, 404)},
        },
        "put": {
            "summary": "Set a repository's retention rule; it stays disabled unless `enabled` is true",
            "description": _SEMANTICS,
            "parameters": [openapi.repo_param(), openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body({
                "type": "object", "additionalProperties": False,
                "properties": {**_LIMITS, "enabled": {"type": "boolean", "default": False}},
            }),
            "responses": {"200": {"description": "Set", "content": openapi.json_content(_RULE)},
                          **openapi.errors(400, 401, 403, 404, 409, 413, 422)},
        },
        "delete": {
            "summary": "Delete a repository's retention rule (nothing more is deleted by it)",
            "parameters": [openapi.repo_param(), openapi.IDEMPOTENCY_KEY],
            "responses": {"204": {"description": "Deleted"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
        },
    },
    "/api/v1/repositories/{repo}/retention/preview": {
        "get": {
            "summary": "The dry run: the artifacts the next cleanup would delete, oldest first, a page at a time",
            "description": _SEMANTICS + " Without `keepNewest`/`keepYoungerThanSeconds` the saved rule is "
            "previewed, enabled or not; with either, those limits are (nothing needs to be saved).",
            "parameters": [
                openapi.repo_param(),
                openapi.query_param("keepNewest", "Preview these limits instead of the saved rule's.",
                                    schema={"type": "integer", "minimum": 1, "maximum": MAX_KEEP_NEWEST}),
                openapi.query_param("keepYoungerThanSeconds", "Preview these limits instead of the saved rule's.",
                                    schema={"type": "integer", "minimum": MIN_AGE_S, "maximum": MAX_AGE_S}),
                *openapi.page_params(),
            ],
            "responses": {"200": {"description": "A page", "content": openapi.json_content(_PREVIEW)},
                          **openapi.errors(400, 401, 403, 404)},
        },
    },
}
