"""Task routes of the writer (SPEC §7): dispatch, list, status, events (JSON or a live
`text/event-stream`), cancel. Every task route is for administrators only: tasks act on the
whole storage and their params and results describe it.

    POST /api/v1/tasks                     dispatch (202 + Location once the row is committed)
    GET  /api/v1/tasks                     list, newest first (?kind= &status= &limit= &cursor=)
    GET  /api/v1/tasks/{task_id}           status
    GET  /api/v1/tasks/{task_id}/events    ?after=N&limit=M; Accept: text/event-stream follows live
    POST /api/v1/tasks/{task_id}/cancel    one conditional transition (store.transition)
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import parse_uuid
from arkvory.shared.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized

from . import store
from .api_openapi import OPENAPI_PATHS  # noqa: F401  (served next to `routes`)
from .budgets import budget_json, validate_budget
from .definition import definition_hash, normalise
from .dispatch import Definition, dispatch
from .kinds import Kinds
from .stream import EventStreamResponse, TaskEventHub, event_json, frames
from ..audit.actions import record_request
from ..audit.trail import actor_of
from ..idempotency import REPLAYED_HEADER, Result, idempotent, key_of
from ..pagination import NEWEST, TIME_ID, ListQuery, choice_filter, page_cursor, page_limit, page_order
from ..request_inputs import json_body, principal_of, query, runtime_of

ON_RESTART = ("fail", "retry", "resume")
# Without `on_restart`, a kind gets the policy that suits it: cleanup is safe to run again
# from the start, verify continues from its checkpoint. An unknown future kind fails.
DEFAULT_ON_RESTART = {"cleanup": "retry", "verify": "resume"}
MAX_VERSION = 64
RESERVED_KEY_PREFIX = "schedule:"  # the writer's own schedule (schedule.py) uses these keys
MAX_EVENT_NUMBER = 2**31 - 1
_BODY_FIELDS = frozenset({"kind", "params", "on_restart", "version", "budget", "max_attempts"})


# -- who may ------------------------------------------------------------------------------------


async def administrator(request: Request, *, changing: bool) -> Principal:
    principal = await principal_of(request)
    if principal.is_anonymous:
        raise Unauthorized("this request needs credentials")
    if not principal.is_admin:
        raise Forbidden("tasks are for administrators (the admin scope)")
    if changing and principal.read_only:
        raise Forbidden("a read-only token cannot dispatch or cancel tasks")
    return principal


# -- JSON ---------------------------------------------------------------------------------------


def _time(value: datetime.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def task_json(task: dict[str, Any]) -> dict[str, Any]:
    error = None
    if task["error_code"] is not None:
        error = {"code": task["error_code"], "message": task["error_message"] or ""}
    return {
        "id": str(task["id"]),
        "kind": task["kind"],
        "status": task["status"],
        "on_restart": task["on_restart"],
        "definition_version": task["definition_version"],
        "definition_hash": task["definition_hash"],
        "idempotency_key": task["idempotency_key"],
        "params": task["params"],
        "budget": budget_json(task["budget"] or {}, task["usage"] or {}),
        "result": task["result"],
        "error": error,
        "attempts": task["attempts"],
        "max_attempts": task["max_attempts"],
        "created_by": task["created_by"],
        "created_at": _time(task["created_at"]),
        "started_at": _time(task["started_at"]),
        "finished_at": _time(task["finished_at"]),
        "updated_at": _time(task["updated_at"]),
        "last_event": task["last_event"],
    }


def task_location(task_id: uuid.UUID | str) -> str:
    return f"/api/v1/tasks/{task_id}"


# -- dispatch -----------------------------------------------------------------------------------


def definition_from(body: dict[str, Any], kinds: Kinds) -> Definition:
    """The checked definition of a dispatch body (400 on anything wrong). An optional field is
    left out or given a value of its type: `null` is refused, as the OpenAPI document says."""
    unknown = sorted(set(body) - _BODY_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}; known: {', '.join(sorted(_BODY_FIELDS))}")
    given_null = sorted(name for name, value in body.items() if value is None)
    if given_null:
        raise InvalidInput(f"{given_null[0]!r} must not be null: leave it out for its default")
    kind = body.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise InvalidInput(f"'kind' must be one of: {', '.join(sorted(kinds))}")
    on_restart = body.get("on_restart", DEFAULT_ON_RESTART.get(kind, "fail"))
    if on_restart not in ON_RESTART:
        raise InvalidInput(f"'on_restart' must be one of: {', '.join(ON_RESTART)}")
    version = body.get("version")
    if version is not None and not (
        isinstance(version, str) and 1 <= len(version) <= MAX_VERSION and version.isprintable()
    ):
        raise InvalidInput(f"'version' must be 1-{MAX_VERSION} printable characters")
    params = normalise(body.get("params"), "params")
    if params is not None and not isinstance(params, dict):
        raise InvalidInput("'params' must be an object")
    try:
        checked = kinds[kind].validate_params(params or {})
    except (TypeError, ValueError, KeyError) as exc:
        # A kind's check tripping over hostile params is still the client's input: 400, not 500.
        raise InvalidInput(f"'params' are not valid for {kind}: {exc}") from None
    params = normalise(checked, "params")
    budget = validate_budget(normalise(body.get("budget", {}), "budget"))
    max_attempts = _max_attempts(body.get("max_attempts", store.DEFAULT_MAX_ATTEMPTS))
    return Definition(
        kind, params, on_restart, version, budget, definition_hash(kind, version, params, budget), max_attempts
    )


def _max_attempts(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3.0 is 3, as in the definition (definition.py)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= store.MAX_ATTEMPTS:
        raise InvalidInput(f"'max_attempts' must be an integer from 1 to {store.MAX_ATTEMPTS}")
    return value


def dispatch_key(request: Request) -> str | None:
    key = key_of(request)  # 1-64 printable ASCII, at most one header
    if key is not None and key.startswith(RESERVED_KEY_PREFIX):
        raise InvalidInput(f"Idempotency-Key values starting with {RESERVED_KEY_PREFIX!r} are the writer's own")
    return key


async def dispatch_task(request: Request) -> Response:
    principal = await administrator(request, changing=True)
    key = dispatch_key(request)
    definition = definition_from(await json_body(request), request.app.state.task_kinds)
    pool = runtime_of(request).pool
    assert pool is not None
    actor = actor_of(principal)

    async def audited(conn: asyncpg.Connection, task: dict[str, Any]) -> None:
        await record_request(conn, request, actor, 202, body=task_json(task), details={
            "kind": definition.kind, "params": definition.params, "version": definition.version,
            "budget": definition.budget, "onRestart": definition.on_restart})

    outcome = await dispatch(pool, definition, key, principal.id, audited)
    # Committed: whoever follows the Location finds the task (and its `task.queued` event).
    headers = {"Location": task_location(outcome.task["id"])}
    if outcome.replayed:
        headers[REPLAYED_HEADER] = "true"
    return JSONResponse(task_json(outcome.task), status_code=202, headers=headers)


# -- reading ------------------------------------------------------------------------------------


def tasks_listing(*, order: str = NEWEST, kind: str | None = None, status: str | None = None,
                  cursor: tuple | None = None) -> ListQuery:
    """One page of tasks, newest first unless `order` is oldest: (created_at, id) serves either."""
    listing = ListQuery("SELECT * FROM arkvory_tasks", TIME_ID, descending=order == NEWEST)
    if kind is not None:
        listing.where("kind = {}", kind)
    if status is not None:
        listing.where("status = {}", status)
    return listing.after(cursor)


async def list_tasks(request: Request) -> Response:
    await administrator(request, changing=False)
    listing = tasks_listing(
        order=page_order(request, NEWEST), kind=choice_filter(request, "kind", request.app.state.task_kinds),
        status=choice_filter(request, "status", store.STATUSES), cursor=page_cursor(request, TIME_ID),
    )
    limit = page_limit(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await listing.fetch(conn, limit)
    tasks = [store.decode(row) for row in rows]
    return JSONResponse(listing.page(tasks, limit, task_json))


def _task_id(request: Request) -> uuid.UUID:
    return parse_uuid(request.path_params["task_id"], "the task id")


async def show_task(request: Request) -> Response:
    await administrator(request, changing=False)
    task_id = _task_id(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        task = await store.fetch_task(conn, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return JSONResponse(task_json(task))


def _event_number(raw: str | None, what: str) -> int | None:
    if raw is None:
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and int(raw) <= MAX_EVENT_NUMBER):
        raise InvalidInput(f"{what} must be an event number from 0 to {MAX_EVENT_NUMBER}")
    return int(raw)


def wants_event_stream(request: Request) -> bool:
    # HEAD gets the JSON form's headers: a stream without a body would hold its place for nothing.
    return request.method == "GET" and "text/event-stream" in request.headers.get("accept", "").lower()


async def task_events(request: Request) -> Response:
    await administrator(request, changing=False)
    task_id = _task_id(request)
    after = _event_number(query(request, "after"), "query parameter 'after'") or 0
    # Checked for either form, as the document declares it: only a stream uses it.
    resumed = _event_number(request.headers.get("last-event-id"), "Last-Event-ID")
    runtime = runtime_of(request)
    pool = runtime.pool
    assert pool is not None
    if wants_event_stream(request):
        # An EventSource that reconnects sends the last id it saw; that wins over `after`.
        return await _event_stream(request, pool, task_id, after if resumed is None else resumed)
    limit = page_limit(request)
    async with pooled(pool) as conn:
        state = await conn.fetchrow(
            "SELECT status, last_event FROM arkvory_tasks WHERE id = $1", task_id, timeout=POOLED_QUERY_TIMEOUT_S
        )
        events = await store.fetch_events(conn, task_id, after, limit) if state is not None else []
    if state is None:
        raise NotFound(f"no task {task_id}")
    return JSONResponse(
        {
            "items": [event_json(event) for event in events],
            "next_after": events[-1]["seq"] if events else after,
            "status": state["status"],
            "last_event": state["last_event"],
        }
    )


async def _event_stream(request: Request, pool: asyncpg.Pool, task_id: uuid.UUID, after: int) -> Response:
    async with pooled(pool) as conn:
        exists = await conn.fetchval("SELECT 1 FROM arkvory_tasks WHERE id = $1", task_id, timeout=POOLED_QUERY_TIMEOUT_S)
    if not exists:
        raise NotFound(f"no task {task_id}")
    hub: TaskEventHub = request.app.state.task_events
    subscription = hub.subscribe(task_id)  # 503 busy beyond the bound
    return EventStreamResponse(frames(pool, subscription, after), subscription, {})


# -- cancel -------------------------------------------------------------------------------------


async def cancel_in(conn: asyncpg.Connection, task_id: uuid.UUID, by: str) -> Result:
    """One conditional transition decides: a task not yet running is cancelled at once (200);
    a running one becomes `cancelling` and its worker ends it (202); a finished one is 409."""
    for _ in range(3):  # the status may move between our tries; each try is atomic
        task = await store.transition(
            conn, task_id, allowed_from=("queued", "loading"), to="cancelled",
            event="task.cancelled", data={"by": by},
        )
        if task is not None:
            return Result(200, task_json(task))
        task = await store.transition(
            conn, task_id, allowed_from=("running",), to="cancelling", event="task.cancelling", data={"by": by},
        )
        if task is not None:
            return Result(202, task_json(task))
        task = await store.fetch_task(conn, task_id)
        if task is None:
            raise NotFound(f"no task {task_id}")
        if task["status"] == "cancelling":
            return Result(202, task_json(task))  # asked before: the same answer
        if task["status"] in store.FINISHED:
            raise Conflict(f"task {task_id} is already {task['status']}; it cannot be cancelled")
    raise Conflict(f"task {task_id} kept changing status; read it and retry")


async def cancel_task(request: Request) -> Response:
    principal = await administrator(request, changing=True)
    task_id = _task_id(request)

    async def work(conn: asyncpg.Connection) -> Result:
        return await cancel_in(conn, task_id, principal.id)

    return await idempotent(request, principal, {}, work)


routes = [
    Route("/api/v1/tasks", dispatch_task, methods=["POST"]),
    Route("/api/v1/tasks", list_tasks, methods=["GET"]),
    Route("/api/v1/tasks/{task_id}", show_task, methods=["GET"]),
    Route("/api/v1/tasks/{task_id}/events", task_events, methods=["GET"]),
    Route("/api/v1/tasks/{task_id}/cancel", cancel_task, methods=["POST"]),
]
