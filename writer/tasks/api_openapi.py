"""The OpenAPI fragment of the task routes (writer/tasks/api.py)."""

from __future__ import annotations

from typing import Any

from ..openapi import IDEMPOTENCY_KEY, errors, json_body, json_content, order_param, page_of, page_params, query_param
from .budgets import LIMITS, MAX_LIMIT
from .kinds import KIND_NAMES
from .store import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS, STATUSES

_KINDS = sorted(KIND_NAMES)
_TIME = {"type": ["string", "null"], "format": "date-time"}
_COUNTERS = {"type": "object", "additionalProperties": {"type": "integer"}}

TASK: dict[str, Any] = {
    "type": "object",
    "required": [
        "id", "kind", "status", "on_restart", "definition_version", "definition_hash", "idempotency_key",
        "params", "budget", "result", "error", "attempts", "max_attempts", "created_by", "created_at", "started_at",
        "finished_at", "updated_at", "last_event",
    ],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "kind": {"type": "string"},
        "status": {"type": "string", "enum": list(STATUSES)},
        "on_restart": {"type": "string", "enum": ["fail", "retry", "resume"]},
        "definition_version": {"type": ["string", "null"]},
        "definition_hash": {
            "type": "string", "pattern": "^[0-9a-f]{64}$",
            "description": "SHA-256 of the canonical JSON of {kind, version, params, budget}",
        },
        "idempotency_key": {"type": ["string", "null"]},
        "params": {"type": "object"},
        "budget": {
            "type": "object", "required": ["limits", "usage"],
            "properties": {"limits": _COUNTERS, "usage": _COUNTERS},
        },
        "result": {},
        "error": {
            "type": ["object", "null"], "required": ["code", "message"],
            "properties": {
                "code": {
                    "type": "string",
                    "description": "budget_exceeded, server_restarted, attempts_exhausted, internal, "
                    "invalid_input, unknown_kind",
                },
                "message": {"type": "string"},
            },
        },
        "attempts": {
            "type": "integer",
            "description": "runs started (a run stopped by a planned stop of the worker gives its attempt back)",
        },
        "max_attempts": {
            "type": "integer",
            "description": "runs the task may start: restart recovery fails it with `attempts_exhausted` "
            "rather than run it again after that many",
        },
        "created_by": {"type": ["string", "null"], "description": "the dispatching principal, or `schedule`"},
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": _TIME,
        "finished_at": _TIME,
        "updated_at": {"type": "string", "format": "date-time"},
        "last_event": {"type": "integer", "description": "the number of the task's newest event"},
    },
}

EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["seq", "type", "data", "created_at"],
    "properties": {
        "seq": {"type": "integer", "minimum": 1},
        "type": {"type": "string", "description": "task.queued, task.loading, task.running, task.progress, "
                 "task.checkpoint, task.cancelling, task.completed, task.failed, task.cancelled"},
        "data": {"type": "object"},
        "created_at": {"type": "string", "format": "date-time"},
    },
}

_TASK_OK = {"content": json_content(TASK)}
_LOCATION = {"Location": {"schema": {"type": "string"}, "description": "/api/v1/tasks/{id}"}}
_TASK_ID = {
    "name": "task_id", "in": "path", "required": True, "description": "Task id.",
    "schema": {"type": "string", "format": "uuid"},
}

_DISPATCH = {
    "type": "object",
    "required": ["kind"],
    "additionalProperties": False,
    "properties": {
        "kind": {"type": "string", "enum": _KINDS},
        "params": {"type": "object", "description": "the kind's parameters (checked by the kind)"},
        "on_restart": {
            "type": "string", "enum": ["fail", "retry", "resume"],
            "description": "what a restarted worker does with the unfinished task (SPEC §7); "
            "default: retry for cleanup, resume for verify",
        },
        "version": {"type": "string", "minLength": 1, "maxLength": 64, "description": "definition version label"},
        "budget": {
            "type": "object",
            "additionalProperties": False,
            "properties": {name: {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT} for name in LIMITS},
            "description": "Limits the task stops before exceeding (failed, `budget_exceeded`, never "
            "retried); the usage is the task's across its runs. `max_items`: blobs checked (verify), "
            "things removed (cleanup); `max_bytes`: bytes read (verify), freed (cleanup); "
            "`max_transitions`: progress reports and checkpoints; `max_state_bytes`: the checkpoint's "
            "size. `max_cost_units`: one unit per file opened or removed, per database row removed and "
            "per MiB read (started): a verified blob costs 1 + ceil(size / MiB); cleanup's removals "
            "cost 2 (an unreferenced blob, an upload session: row and file) or 1 (anything else).",
        },
        "max_attempts": {
            "type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS, "default": DEFAULT_MAX_ATTEMPTS,
            "description": "runs the task may start; after a crash of the worker in its last one, "
            "restart recovery fails it with `attempts_exhausted` (not part of definition_hash)",
        },
    },
}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/tasks": {
        "post": {
            "summary": "Dispatch a task (admin); answered once the task is committed",
            "description": "Idempotency-Key values are global across kinds and principals: a used key "
            "returns its task (Idempotent-Replayed: true) while that task is kept "
            "(ARKVORY_TASK_RETENTION); with another definition 422. Keys starting with `schedule:` "
            "are the writer's own.",
            "parameters": [IDEMPOTENCY_KEY],
            "requestBody": json_body(_DISPATCH),
            "responses": {
                "202": {"description": "Queued (or the task dispatched before with this key)",
                        "headers": _LOCATION, **_TASK_OK},
                **errors(400, 401, 403, 413, 422),
            },
        },
        "get": {
            "summary": "List tasks, newest (or oldest) first (admin)",
            "parameters": [
                query_param("kind", "Only tasks of this kind.", schema={"type": "string", "enum": _KINDS}),
                query_param("status", "Only tasks in this status.", schema={"type": "string", "enum": list(STATUSES)}),
                order_param("newest", sorted_by="creation"),
                *page_params(),
            ],
            "responses": {
                "200": {"description": "One page", "content": json_content(page_of(TASK))},
                **errors(400, 401, 403),
            },
        },
    },
    "/api/v1/tasks/{task_id}": {
        "get": {
            "summary": "A task's status (admin)",
            "parameters": [_TASK_ID],
            "responses": {"200": {"description": "The task", **_TASK_OK}, **errors(400, 401, 403, 404)},
        },
    },
    "/api/v1/tasks/{task_id}/events": {
        "get": {
            "summary": "A task's events after a number, as JSON or as a live text/event-stream (admin)",
            "description": "With `Accept: text/event-stream` the answer is a stream: each event as "
            "`id: <seq>`, `event: <type>`, `data: <event JSON>`, from after `after` (or after the "
            "`Last-Event-ID` header, which wins), then live until the task is finished and every "
            "event was sent; `: keep-alive` comments every 15 s. At most 64 streams per writer "
            "(then 503 busy).",
            "parameters": [
                _TASK_ID,
                query_param("after", "Events with a higher number (default 0).",
                            schema={"type": "integer", "minimum": 0, "maximum": 2**31 - 1}),
                query_param("limit", "Events per answer in the JSON form (default 100).",
                            schema={"type": "integer", "minimum": 1, "maximum": 1000}),
                {"name": "Last-Event-ID", "in": "header", "required": False,
                 "description": "Stream only: resume after this event number (checked, 400, in either form).",
                 "schema": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}},
            ],
            "responses": {
                "200": {
                    "description": "Events in order of `seq`",
                    "content": {
                        **json_content({
                            "type": "object",
                            "required": ["items", "next_after", "status", "last_event"],
                            "properties": {
                                "items": {"type": "array", "items": EVENT},
                                "next_after": {"type": "integer", "description": "`after` for the next call"},
                                "status": {"type": "string", "enum": list(STATUSES)},
                                "last_event": {"type": "integer"},
                            },
                        }),
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **errors(400, 401, 403, 404),
            },
        },
    },
    "/api/v1/tasks/{task_id}/cancel": {
        "post": {
            "summary": "Cancel a task (admin): one atomic conditional transition",
            "description": "queued or loading: cancelled at once (200). running: `cancelling` (202), "
            "the worker ends it as cancelled. cancelling: 202 again. Finished: 409 naming its status.",
            "parameters": [_TASK_ID, IDEMPOTENCY_KEY],
            "responses": {
                "200": {"description": "Cancelled", **_TASK_OK},
                "202": {"description": "Cancelling: the worker stops it", **_TASK_OK},
                **errors(400, 401, 403, 404, 409),
            },
        },
    },
}
