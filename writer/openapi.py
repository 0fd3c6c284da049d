"""The OpenAPI 3.1 document of the writer (`GET /api/v1/openapi.json`, SPEC §6).

Each writer module with routes exposes `OPENAPI_PATHS`, the `paths` fragment of exactly its own
routes; `build_document` merges them with the fragments of the routes every process serves
(content, health; written here because only the writer publishes the document) and the shared
components below. Fragments refer to:

- `#/components/schemas/Error`            the error JSON of every 4xx/5xx
- `#/components/responses/Error`          any error answer with that schema
- `#/components/parameters/IdempotencyKey` the `Idempotency-Key` request header
- the security scheme `bearer`            `Authorization: Bearer <token>`; `build_document` adds
  `basic` (a token as the password) beside it wherever it stands, as every process takes both

tests/test_openapi.py compares the document with the app's route table, so neither can drift.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PATH = "/api/v1/openapi.json"
ERROR = {"$ref": "#/components/responses/Error"}
IDEMPOTENCY_KEY = {"$ref": "#/components/parameters/IdempotencyKey"}
ANONYMOUS_TOO: list[dict] = [{}, {"bearer": []}]  # public repositories are read anonymously


def errors(*statuses: int) -> dict[str, Any]:
    """Error responses for `statuses` (and the 503s every API route may answer)."""
    return {str(status): ERROR for status in sorted({*statuses, 503})}


def repo_param() -> dict[str, Any]:
    return {
        "name": "repo",
        "in": "path",
        "required": True,
        "description": "Repository name.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"},
    }


def query_param(name: str, description: str, *, required: bool = False, schema: dict | None = None) -> dict:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema or {"type": "string", "minLength": 1},
    }


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": json_content(schema)}


def page_params() -> list[dict[str, Any]]:
    return [
        query_param(
            "limit", "Items per page (default 100).", schema={"type": "integer", "minimum": 1, "maximum": 1000}
        ),
        query_param("cursor", "The `nextCursor` of the previous page."),
    ]


def order_param(default: str, choices: tuple[str, ...] = ("newest", "oldest"), sorted_by: str = "") -> dict[str, Any]:
    """`?order=` of a list: newest or oldest first (by `sorted_by`'s time), or the list's own."""
    return query_param(
        "order",
        f"`newest` or `oldest` first{f' (by {sorted_by})' if sorted_by else ''}; default `{default}`. "
        "Send the same order (and filters) with each cursor.",
        schema={"type": "string", "enum": list(choices), "default": default},
    )


def prefix_param(what: str, max_length: int) -> dict[str, Any]:
    """`?prefix=`: only items whose `what` starts with it (byte for byte; `%` and `_` are plain)."""
    return query_param(
        "prefix",
        f"Only items whose {what} starts with this (byte for byte, case-sensitive; `%` and `_` are plain characters).",
        schema={"type": "string", "minLength": 1, "maxLength": max_length},
    )


def page_of(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["items", "nextCursor"],
        "properties": {
            "items": {"type": "array", "items": item},
            "nextCursor": {"type": ["string", "null"], "description": "null on the last page"},
        },
    }


COMPONENTS: dict[str, Any] = {
    "securitySchemes": {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A service key, personal token (`pat_...`) or session (`dps_...`); never in a URL.",
        },
        "basic": {
            "type": "http",
            "scheme": "basic",
            "description": "Any user name and a token (as for `bearer`) as the password, for tools that "
            "speak only Basic; never an account's password (refused as a wrong token).",
        },
    },
    "schemas": {
        "Error": {
            "type": "object",
            "required": ["code", "message", "requestId"],
            "properties": {
                "code": {
                    "type": "string",
                    "description": "invalid_input, unauthorized, forbidden, password_change_required, not_found, read_only, "
                    "method_not_allowed, request_timeout, conflict, idempotency_key_in_use, "
                    "payload_too_large, unsupported_media_type, IdempotentParameterMismatch, "
                    "digest_mismatch, range_not_satisfiable, "
                    "request_header_too_large, rate_limited, insufficient_storage, busy, unavailable, "
                    "content_unavailable, internal",
                },
                "message": {"type": "string"},
                "requestId": {"type": "string"},
            },
        },
    },
    "parameters": {
        "IdempotencyKey": {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "Client token (1-64 printable ASCII, case-sensitive) that makes a retry safe: "
            "the same key and request replay the first result (`Idempotent-Replayed: true`); "
            "other parameters answer 422 IdempotentParameterMismatch; a duplicate while the first "
            "runs answers 409 idempotency_key_in_use. Kept for ARKVORY_IDEMPOTENCY_RETENTION.",
            "schema": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[\\x20-\\x7e]{1,64}$"},
        },
    },
    "headers": {
        "IdempotentReplayed": {
            "description": "`true` when this answer is the recorded result of an earlier request with the same Idempotency-Key.",
            "schema": {"type": "string", "enum": ["true"]},
        },
    },
    "responses": {
        "Error": {
            "description": "An error (see `code`); 429 and 503 carry `Retry-After`.",
            "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "on 429 and 503"}},
            "content": json_content({"$ref": "#/components/schemas/Error"}),
        },
    },
}

_CONTENT_HEADERS = {
    "ETag": {"schema": {"type": "string"}, "description": "strong, from the SHA-256"},
    "Content-Length": {"schema": {"type": "integer"}},
    "Accept-Ranges": {"schema": {"type": "string", "enum": ["bytes"]}},
    "Digest": {"schema": {"type": "string"}, "description": "sha-256=<base64>"},
    "Repr-Digest": {"schema": {"type": "string"}, "description": "sha-256=:<base64>:"},
}


def _content_operation(summary: str, extra_params: list[dict[str, Any]]) -> dict[str, Any]:
    params = [
        repo_param(),
        *extra_params,
        {"name": "Range", "in": "header", "required": False, "description": "One byte range: `bytes=a-b`, `bytes=a-`, `bytes=-n`.",
         "schema": {"type": "string"}},
        {"name": "If-Range", "in": "header", "required": False, "description": "An ETag: on mismatch the whole file (200).",
         "schema": {"type": "string"}},
        {"name": "If-None-Match", "in": "header", "required": False, "description": "An ETag: on match 304.",
         "schema": {"type": "string"}},
    ]
    binary = {"application/octet-stream": {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}}}
    responses = {
        "200": {"description": "The whole content (media type of the artifact).", "headers": _CONTENT_HEADERS, "content": binary},
        "206": {"description": "One byte range.", "headers": {**_CONTENT_HEADERS, "Content-Range": {"schema": {"type": "string"}}},
                "content": binary},
        "304": {"description": "If-None-Match matched."},
        **errors(400, 401, 404, 416),
    }
    get = {"summary": summary, "security": ANONYMOUS_TOO, "parameters": params, "responses": responses}
    head = {**copy.deepcopy(get), "summary": summary + " (headers only)",
            "responses": {k: {kk: vv for kk, vv in v.items() if kk != "content"} if "$ref" not in v else v for k, v in responses.items()}}
    return {"get": {**get, "operationId": None}, "head": {**head, "operationId": None}}


def _content_paths() -> dict[str, Any]:
    return {
        "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content": _content_operation(
            "Download an artifact by id (every process)",
            [{"name": "artifact_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}],
        ),
        "/api/v1/repositories/{repo}/packages/content": _content_operation(
            "Download a package version (every process)",
            [query_param(n, f"Package {n}.", required=True, schema={"type": "string", "minLength": 1, "maxLength": 255})
             for n in ("group", "name", "version")],
        ),
        "/api/v1/repositories/{repo}/asset/content": _content_operation(
            "Download what an asset path points at (every process)",
            [query_param("path", "Asset path.", required=True, schema={"type": "string", "minLength": 1, "maxLength": 1024})],
        ),
    }


def _health(summary: str, needs_key: bool, body: dict[str, Any], text: bool = False) -> dict[str, Any]:
    content = {"text/plain": {"schema": {"type": "string"}}} if text else json_content(body)
    responses = {"200": {"description": summary, "content": content}}
    if needs_key:
        responses["401"] = ERROR
    responses["503"] = {"description": "not ready (unavailable or draining), with Retry-After: 2", "content": json_content(body)}
    get = {"summary": summary, "security": [{"bearer": []}] if needs_key else [{}], "responses": responses}
    head = {**get, "summary": summary + " (headers only)", "responses": {k: {"description": v.get("description", "error")} for k, v in responses.items()}}
    return {"get": get, "head": head}


_STATUS = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}


def _health_paths() -> dict[str, Any]:
    live = _health("Liveness: the HTTP process runs", False, _STATUS)
    del live["get"]["responses"]["503"], live["head"]["responses"]["503"]
    ready = _health("Readiness: role, leases, admission, bandwidth, schema version, which parts work (SPEC §8)", True,
                    {"type": "object", "required": ["status", "role", "writable"], "properties": {
                        "status": {"type": "string", "enum": ["ready", "degraded", "unavailable", "draining"]},
                        "role": {"type": "string", "enum": ["api", "reader"]},
                        "parts": {"type": "object", "description": "database, lease, storage and readCache, "
                                  "each in a word (available, trusted, off...)",
                                  "additionalProperties": {"type": "string"}},
                        "readCache": {"type": ["object", "null"], "description": "files, bytes and maxBytes "
                                      "of the read cache; null without one"},
                        "writable": {"type": "boolean"}, "sharedDownloads": {"type": ["object", "null"]},
                        "transfers": {"type": "object"}, "schemaVersion": {"type": ["integer", "null"]},
                        "storageDiagnostics": {
                            "type": ["object", "null"], "properties": {
                                "missing": {"type": "integer"}, "corrupt": {"type": "integer"}},
                            "description": "blobs the verify task found missing or corrupt (cached a few "
                            "seconds); null when the database did not answer in time"},
                        "database": {
                            "type": "object", "properties": {
                                "synchronousStandby": {"type": ["boolean", "null"]},
                                "replication": {"type": "string", "enum": ["synchronous", "asynchronous", "none", "unknown"]},
                                "standbys": {"type": ["integer", "null"]},
                                "synchronousStandbys": {"type": ["integer", "null"]},
                                "problem": {"type": ["string", "null"]}},
                            "description": "whether the database's primary has a synchronous standby, so that a "
                            "failover keeps every lease renewal (read every 2 s); null/unknown when this role "
                            "may not see it (GRANT pg_read_all_stats)"}}})
    metrics = _health("Prometheus metrics of this process (needs a key unless ARKVORY_PUBLIC_METRICS)", True, {}, text=True)
    del metrics["get"]["responses"]["503"], metrics["head"]["responses"]["503"]
    return {
        "/health/status": _health("For the balancer: keep the process (200: ready, or degraded while its object "
                                  "store does not answer) or take it out (503)", False, _STATUS),
        "/health/live": live,
        "/health/ready": ready,
        "/health/metrics": metrics,
    }


OPENAPI_PATHS: dict[str, Any] = {
    PATH: {
        "get": {
            "summary": "This document",
            "security": [{}],
            "responses": {"200": {"description": "OpenAPI 3.1", "content": json_content({"type": "object"})}},
        }
    }
}


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.removeprefix("/api/v1/").split("/") if w]
    return method + "".join(w[:1].upper() + w[1:].replace("_", "") for w in words) or method


def _document_idempotency(operation: dict[str, Any]) -> None:
    """What every operation taking an Idempotency-Key may answer because of it."""
    responses = operation["responses"]
    for status, response in responses.items():
        if status.startswith("2") and "$ref" not in response:
            response.setdefault("headers", {})["Idempotent-Replayed"] = {"$ref": "#/components/headers/IdempotentReplayed"}
    for status in ("400", "409", "422"):  # malformed key, key in use, other parameters
        responses.setdefault(status, ERROR)


def _basic_beside_bearer(security: list[dict]) -> list[dict]:
    """A token works as Basic's password wherever it works as a bearer token
    (shared/auth/authorization.py)."""
    return security + [{"basic": []}] if {"bearer": []} in security else security


def build_document(modules: Iterable[ModuleType]) -> dict[str, Any]:
    """The whole document: shared fragments, then every module's `OPENAPI_PATHS` (this module's
    own route is one of them when it is in `modules`, as in the writer app)."""
    paths: dict[str, dict[str, Any]] = {}
    fragments: list[Mapping[str, Any]] = [_health_paths(), _content_paths()]
    fragments += [getattr(module, "OPENAPI_PATHS", {}) for module in modules]
    for fragment in fragments:
        for path, operations in fragment.items():
            merged = paths.setdefault(path, {})
            for method, operation in copy.deepcopy(dict(operations)).items():
                if method in merged:
                    raise ValueError(f"OpenAPI: {method.upper()} {path} is described twice")
                if method in ("get", "put", "post", "delete", "patch", "head", "options"):
                    operation["security"] = _basic_beside_bearer(operation.get("security", [{"bearer": []}]))
                    if not operation.get("operationId"):
                        operation["operationId"] = _operation_id(method, path)
                    if IDEMPOTENCY_KEY in operation.get("parameters", []):
                        _document_idempotency(operation)
                merged[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Arkvory",
            "version": "1",
            "description": "Self-hosted artifact server. Every change goes to the writer; content "
            "GET/HEAD is served by every process. Errors are JSON with `code`, `message`, `requestId`; "
            "every answer carries `X-Request-Id`.",
        },
        "servers": [{"url": "/"}],
        "security": _basic_beside_bearer([{"bearer": []}]),
        "paths": paths,
        "components": COMPONENTS,
    }


async def serve_document(request: Request) -> Response:
    return Response(request.app.state.openapi_json, media_type="application/json")


def document_json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


routes = [Route(PATH, serve_document, methods=["GET"])]
