"""The OpenAPI fragment of the resumable-upload routes (writer/uploads/routes.py)."""

from __future__ import annotations

from typing import Any

from ..catalog.artifacts import ARTIFACT_SCHEMA
from ..openapi import ERROR, IDEMPOTENCY_KEY, errors, json_content, repo_param
from ..openapi import json_body as body_of
from .reservations import MAX_OPEN_SESSIONS
from .sessions import DEFAULT_PART, MAX_PART, MAX_PARTS, MIN_PART

_BASE = "/api/v1/repositories/{repo}/uploads"


def _openapi_paths() -> dict[str, Any]:
    upload_id = {"name": "upload_id", "in": "path", "required": True, "description": "Upload session id.",
                 "schema": {"type": "string", "format": "uuid"}}
    sha256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
    session = {
        "type": "object",
        "required": ["id", "name", "size", "partSize", "partCount", "receivedParts", "status", "expiresAt"],
        "properties": {
            "id": {"type": "string", "format": "uuid"}, "repository": {"type": "string"},
            "name": {"type": "string"}, "size": {"type": "integer"}, "sha256": {"type": ["string", "null"]},
            "mediaType": {"type": "string"}, "partSize": {"type": "integer"}, "partCount": {"type": "integer"},
            "receivedParts": {"type": "array", "items": {"type": "integer"}},
            "status": {"type": "string", "enum": ["open", "completed"]},
            "artifactId": {"type": ["string", "null"], "format": "uuid"},
            "createdAt": {"type": "string", "format": "date-time"},
            "expiresAt": {"type": "string", "format": "date-time"},
        },
    }
    summary = {**session, "required": [f for f in session["required"] if f != "receivedParts"] + ["receivedPartCount"],
               "properties": {**{k: v for k, v in session["properties"].items() if k != "receivedParts"},
                              "receivedPartCount": {"type": "integer"}}}
    artifact = ARTIFACT_SCHEMA
    raw = {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
    key_required = {**IDEMPOTENCY_KEY}
    base = [repo_param(), upload_id]
    return {
        _BASE: {"post": {
            "summary": "Start a resumable upload (needs an Idempotency-Key)",
            "description": f"Parts are `partSize` bytes ({MIN_PART}..{MAX_PART}, default {DEFAULT_PART} or more, "
                           f"at most {MAX_PARTS} parts), the last one shorter. The file's space is reserved now: "
                           "a full disk or one that would fall below ARKVORY_MIN_FREE_BYTES is 507. One principal's "
                           "open sessions reserve at most ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL bytes and "
                           f"{MAX_OPEN_SESSIONS} sessions: a session beyond that is 409 (413 when it alone is larger); "
                           "GET lists what holds the share. An unknown field is 400. A session expires "
                           "ARKVORY_UPLOAD_EXPIRY after its last received part.",
            "parameters": [repo_param(), key_required],
            "requestBody": body_of({"type": "object", "required": ["name", "size"], "additionalProperties": False,
                                    "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 255}, "size": {"type": "integer", "minimum": 0},
                "sha256": sha256, "mediaType": {"type": "string"},
                "partSize": {"type": "integer", "minimum": MIN_PART, "maximum": MAX_PART}}}),
            "responses": {"201": {"description": "The session (a replay has `Idempotent-Replayed: true`).",
                                  "headers": {"Location": {"schema": {"type": "string"}}},
                                  "content": json_content(session)},
                          **errors(400, 401, 403, 404, 409, 413, 422, 507)},
        },
            "get": {
                "summary": "Your open upload sessions in this repository, and the disk all yours reserve",
                "description": "At most the open sessions one principal may have (no pages); each with "
                               "`receivedPartCount` instead of `receivedParts`. Needs write permission.",
                "parameters": [repo_param()],
                "responses": {"200": {"description": "The sessions.", "content": json_content({
                    "type": "object", "required": ["items", "reservedBytes", "maxReservedBytes"], "properties": {
                        "items": {"type": "array", "items": summary},
                        "reservedBytes": {"type": "integer",
                                          "description": "What all your open sessions reserve (every repository)."},
                        "maxReservedBytes": {"type": "integer",
                                             "description": "ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL."}}})},
                              **errors(400, 401, 403, 404)},
            }},
        _BASE + "/{upload_id}": {
            "get": {"summary": "An upload session and the parts it has", "parameters": base,
                    "responses": {"200": {"description": "The session.", "content": json_content(session)},
                                  **errors(400, 401, 403, 404)}},
            "delete": {"summary": "Abandon an open upload session and its bytes (a completed one is 409: "
                                  "it stays so that a repeated complete returns its artifact)",
                       "parameters": [*base, IDEMPOTENCY_KEY],
                       "responses": {"204": {"description": "Removed."}, **errors(400, 401, 403, 404, 409)}},
        },
        _BASE + "/{upload_id}/content": {"put": {
            "summary": "Send the whole file at once (recorded part by part: a cut one resumes with parts)",
            "description": "Other bytes than the session's declared `sha256` are 422 and keep nothing. A body that "
                           "goes silent (ARKVORY_RECEIVE_TIMEOUT_SECONDS) or falls below "
                           "ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND is 408 and keeps the parts that fully arrived. "
                           "503 busy when no upload place is free or this principal holds "
                           "ARKVORY_MAX_UPLOADS_PER_PRINCIPAL already.",
            "parameters": [*base, IDEMPOTENCY_KEY], "requestBody": raw,
            "responses": {"200": {"description": "The session.", "content": json_content(session)},
                          "415": ERROR, **errors(400, 401, 403, 404, 408, 409, 413, 422)},
        }},
        _BASE + "/{upload_id}/parts/{index}": {"put": {
            "summary": "Send one part (any order; an identical re-send is harmless, other bytes are 409)",
            "parameters": [*base, {"name": "index", "in": "path", "required": True,
                                   "schema": {"type": "integer", "minimum": 0, "maximum": MAX_PARTS - 1}},
                           {"name": "X-Content-SHA256", "in": "header", "required": True,
                            "description": "SHA-256 of the part (hex); a mismatch is 422 digest_mismatch.",
                            "schema": sha256}, IDEMPOTENCY_KEY],
            "requestBody": raw,
            "responses": {"200": {"description": "The part is stored.", "content": json_content({
                "type": "object", "properties": {"index": {"type": "integer"}, "size": {"type": "integer"},
                                                 "sha256": sha256, "alreadyReceived": {"type": "boolean"}}})},
                          "415": ERROR, **errors(400, 401, 403, 404, 408, 409, 413, 422)},
        }},
        _BASE + "/{upload_id}/complete": {"post": {
            "summary": "Check coverage, size and SHA-256, and publish the artifact (a repeat returns it again)",
            "parameters": [*base, IDEMPOTENCY_KEY],
            "responses": {"201": {"description": "Published.", "content": json_content(artifact)},
                          "200": {"description": "Published before (`Idempotent-Replayed: true`).",
                                  "content": json_content(artifact)},
                          **errors(400, 401, 403, 404, 409, 422, 507)},
        }},
    }


OPENAPI_PATHS = _openapi_paths()
