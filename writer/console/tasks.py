"""Tasks (administrators, as in the API): the list with its filters, dispatching a cleanup or a
verify with its params and budget, cancelling, and a task's page.

A task's page shows its status, budget use and the events so far; its script
(static/task-events.js) then follows the API's live stream (`GET /api/v1/tasks/{id}/events`
with `Accept: text/event-stream`, authorized by the session cookie: a GET needs no CSRF
token) from the last event shown, adds each event as it comes, and reads the task again for
its status and budget use. Without the script the page is complete as of its loading.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.errors import ApiError

from ..tasks.budgets import LIMITS
from ..tasks.kinds import KIND_NAMES
from ..tasks.store import FINISHED
from . import confirm
from .confirm import asks_first
from .forms import Form
from .internal import Refused, api_path
from .list_filters import fetch_listing, filters_of
from .session import ConsoleUser, action, api_for, page, refusal_status, render, see_other
from .task_progress import pairs, progress, sentence

EVENTS_SHOWN = "1000"
ON_RESTART = ("fail", "retry", "resume")
# Each kind's params as the dispatch form offers them (the kinds' own checks bound them).
PARAMS = {"cleanup": ("grace_seconds",), "verify": ("bytes_per_second",)}


async def _tasks(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                 form: Form | None = None) -> Response:
    filters = filters_of(request, "tasks", "/console/tasks", "Filter the tasks")
    listing, refused = await fetch_listing(api_for(request, user), "/api/v1/tasks", request, filters)
    error = error or refused
    return render(
        request, user, "tasks.html",
        {
            "listing": listing, "list_filters": filters, "kinds": sorted(KIND_NAMES),
            "limits": list(LIMITS), "on_restart": ON_RESTART, "params": PARAMS,
            "form": form.fields if form else {},
        },
        status=refusal_status(error) if error else 200, error=error.message if error else None,
    )


@page
async def tasks_page(request: Request, user: ConsoleUser) -> Response:
    return await _tasks(request, user)


def _definition(form: Form) -> dict[str, Any]:
    """The dispatch body from the form: only what was filled in (the API supplies defaults)."""
    kind = form.text("kind")
    body: dict[str, Any] = {"kind": kind}
    params: dict[str, Any] = {}
    for name in sorted({name for names in PARAMS.values() for name in names}):
        value = form.whole_number(f"param_{name}", name)
        if value is not None:
            params[name] = value
    if params:
        body["params"] = params
    budget = {}
    for limit in LIMITS:
        value = form.whole_number(f"budget_{limit}", f"budget {limit}")
        if value is not None:
            budget[limit] = value
    if budget:
        body["budget"] = budget
    if form.optional("on_restart") is not None:
        body["on_restart"] = form.text("on_restart")
    if form.optional("version") is not None:
        body["version"] = form.text("version")
    attempts = form.whole_number("max_attempts", "max attempts")
    if attempts is not None:
        body["max_attempts"] = attempts
    return body


@action
async def dispatch_task(request: Request, user: ConsoleUser, form: Form) -> Response:
    try:
        body = _definition(form)
        answer = await api_for(request, user).change("POST", "/api/v1/tasks", body, key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        return await _tasks(request, user, error=refusal, form=form)
    return see_other(f"/console/tasks/{answer.json()['id']}")


async def _task(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None) -> Response:
    task_id = request.path_params["task_id"]
    api = api_for(request, user)
    task = await api.fetch(api_path("tasks", task_id))
    events = await api.fetch(api_path("tasks", task_id, "events"), {"limit": EVENTS_SHOWN})
    budget = task["budget"]
    rows = [
        {"limit": limit, "counter": counter, "allowed": budget["limits"].get(limit), "used": budget["usage"].get(counter, 0)}
        for limit, counter in LIMITS.items()
    ]
    lines = [{**event, "text": sentence(event)} for event in events["items"]]
    return render(
        request, user, "task.html",
        {"task": task, "events": events, "lines": lines, "progress": await progress(request, task), "budget_rows": rows,
         "params_words": pairs(task["params"]), "result_words": pairs(task["result"]),
         "finished": task["status"] in FINISHED},
        status=refusal_status(error) if error else 200, error=error.message if error else None,
    )


@page
async def task_page(request: Request, user: ConsoleUser) -> Response:
    return await _task(request, user)


@action
@asks_first(confirm.cancel_task)
async def cancel_task(request: Request, user: ConsoleUser, form: Form) -> Response:
    task_id = request.path_params["task_id"]
    try:
        await api_for(request, user).change("POST", api_path("tasks", task_id, "cancel"), key=form.optional("key"))
    except Refused as refusal:
        return await _task(request, user, error=refusal)
    return see_other(f"/console/tasks/{task_id}", "task-cancelled")
