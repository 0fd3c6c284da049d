"""The writer's change routes and what the audit records of each: the action's name, what it
changed (its target) and a summary of its parameters.

One table, keyed by the route (method and path template), so that one code path records every
change: writer/idempotency.py calls `record_request` in the transaction of each change it runs,
and the routes that do not go through it call it in their own. A change route missing here is
still recorded, under `METHOD /path/template` (tests/test_audit.py fails until it is named).

Not audited: downloads and every other read; the parts and content of an upload session (its
completion is the change, one entry however many parts); the writer's own scheduled tasks (the
tasks table records them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg
from starlette.requests import Request

from .trail import Actor, Entry, Origin, origin_of, record


@dataclasses.dataclass(frozen=True)
class Change:
    """What a target or a summary is read from: the route's path parameters, the parameters it
    named for its Idempotency-Key (`parts`), and its answer's JSON body."""

    path: Mapping[str, str]
    parts: Any
    body: Any

    def part(self, name: str) -> Any:
        return self.parts.get(name) if isinstance(self.parts, dict) else None

    def answer(self, name: str) -> Any:
        return self.body.get(name) if isinstance(self.body, dict) else None


Read = Callable[[Change], Any]


def _path(name: str) -> Read:
    return lambda change: change.path.get(name)


def _part(name: str) -> Read:
    return lambda change: change.part(name)


def _answer(name: str) -> Read:
    return lambda change: change.answer(name)


def _package(change: Change) -> str | None:
    coordinates = [change.part(name) for name in ("group", "name", "version")]
    return "/".join(coordinates) if all(isinstance(c, str) for c in coordinates) else None


def _parts(change: Change) -> Any:
    return change.parts


def _uploaded(change: Change) -> Any:
    return {key: change.answer(key) for key in ("name", "size", "sha256", "mediaType")}


@dataclasses.dataclass(frozen=True)
class Action:
    name: str
    target: Read = lambda change: None
    details: Read = _parts


_REPO = "/api/v1/repositories/{repo}"
_UPLOAD = _REPO + "/uploads/{upload_id}"

ACTIONS: dict[tuple[str, str], Action] = {
    # sign-in and accounts (writer/identity/accounts.py)
    ("POST", "/api/v1/login"): Action("account.sign-in"),
    ("POST", "/api/v1/logout"): Action("account.sign-out"),
    ("POST", "/api/v1/register"): Action("account.register", _part("name")),
    ("POST", "/api/v1/account/password"): Action("account.password-change", _part("account")),
    ("POST", "/api/v1/accounts"): Action("account.create", _part("name")),
    ("POST", "/api/v1/accounts/{name}/disable"): Action("account.disable", _path("name")),
    ("POST", "/api/v1/accounts/{name}/enable"): Action("account.enable", _path("name")),
    ("POST", "/api/v1/accounts/{name}/password"): Action("account.password-reset", _path("name")),
    ("DELETE", "/api/v1/accounts/{name}"): Action("account.delete", _path("name")),
    # personal tokens and managed service keys (tokens.py, service_keys.py)
    ("POST", "/api/v1/tokens"): Action("token.create", _answer("id")),
    ("DELETE", "/api/v1/tokens/{id}"): Action("token.revoke", _path("id")),
    ("POST", "/api/v1/keys"): Action("key.create", _answer("id")),
    ("DELETE", "/api/v1/keys/{id}"): Action("key.revoke", _path("id")),
    ("POST", "/api/v1/keys/{id}/adopt"): Action("key.adopt", _path("id")),
    # the catalog (writer/catalog/)
    ("POST", "/api/v1/repositories"): Action("repository.create", _part("name")),
    ("PATCH", _REPO): Action("repository.update", _path("repo")),
    ("DELETE", _REPO): Action("repository.delete", _path("repo")),
    ("PUT", _REPO + "/permissions/{account}"): Action("permission.set", _path("account")),
    ("DELETE", _REPO + "/permissions/{account}"): Action("permission.remove", _path("account")),
    ("PUT", _REPO + "/members/{account}"): Action("permission.set", _path("account")),
    ("DELETE", _REPO + "/members/{account}"): Action("permission.remove", _path("account")),
    ("PUT", _REPO + "/retention"): Action("retention.set", _path("repo")),
    ("DELETE", _REPO + "/retention"): Action("retention.delete", _path("repo")),
    ("DELETE", _REPO + "/artifacts/{artifact_id}"): Action("artifact.delete", _path("artifact_id")),
    ("PUT", _REPO + "/packages"): Action("package.register", _package),
    ("POST", _REPO + "/packages"): Action("package.register", _package),
    ("DELETE", _REPO + "/package"): Action("package.delete", _package),
    ("PUT", _REPO + "/assets"): Action("asset.point", _part("path")),
    ("POST", _REPO + "/asset/restore"): Action("asset.restore", _part("path")),
    ("DELETE", _REPO + "/asset"): Action("asset.delete", _part("path")),
    # uploads (writer/uploads/)
    ("POST", _REPO + "/artifacts"): Action("artifact.upload", _answer("id"), _uploaded),
    ("POST", _REPO + "/uploads"): Action("upload.create", _answer("id"), lambda change: change.part("body")),
    ("DELETE", _UPLOAD): Action("upload.delete", _path("upload_id")),
    ("POST", _UPLOAD + "/complete"): Action(
        "upload.complete", _answer("id"), lambda change: {**_uploaded(change), "upload": change.path.get("upload_id")}),
    # tasks (writer/tasks/api.py)
    ("POST", "/api/v1/tasks"): Action("task.dispatch", _answer("id")),
    ("POST", "/api/v1/tasks/{task_id}/cancel"): Action("task.cancel", _path("task_id")),
}

# Changes routes make that the audit leaves out (see the module docstring).
UNAUDITED = frozenset({("PUT", _UPLOAD + "/content"), ("PUT", _UPLOAD + "/parts/{index}")})

# What the admin tools record (shared/cli/admin.py, migrate_storage.py, writer/worker/offline.py),
# with the tool as the actor; `account.create` too (create-user).
TOOL_ACTIONS = ("installation.init", "policy.reset", "storage.migrate", "maintenance.gc", "maintenance.scrub")

ACTION_NAMES = tuple(sorted({action.name for action in ACTIONS.values()} | set(TOOL_ACTIONS)))
FAMILIES = tuple(sorted({name.split(".", 1)[0] for name in ACTION_NAMES}))


def route_of(request: Request) -> tuple[str, str]:
    route = request.scope.get("route")
    return request.method, route.path if route is not None else request.url.path


def action_of(request: Request) -> Action | None:
    """The action of the request's change route; None for a route that changes nothing (or
    whose changes the audit leaves out)."""
    key = route_of(request)
    if key in UNAUDITED or request.method in ("GET", "HEAD", "OPTIONS") or not key[1].startswith("/api/"):
        return None  # (the console's own pages call the API, which records)
    return ACTIONS.get(key) or Action(f"{key[0]} {key[1]}")


def entry_for(request: Request, status: int | None, parts: Any = None, body: Any = None, *,
              outcome: str = "ok", target: str | None = None, details: Any = None) -> Entry | None:
    """The entry of this request's change (None when the route is not audited): the route's
    action reads its target and details from the request, `parts` and the answer `body`, unless
    given here."""
    action = action_of(request)
    if action is None:
        return None
    change = Change(request.path_params, parts, body)
    found = target if target is not None else action.target(change)
    repository = request.path_params.get("repo")
    if repository is None and action.name == "repository.create":
        repository = change.part("name")
    return Entry(
        action.name, status, outcome,
        repository=repository if isinstance(repository, str) else None,
        target=None if found is None else str(found),
        details=action.details(change) if details is None else details,
    )


async def record_request(
    conn: asyncpg.Connection, request: Request, actor: Actor, status: int, parts: Any = None, body: Any = None,
    *, target: str | None = None, details: Any = None,
) -> None:
    """Record the change this request made, on `conn` (in its transaction)."""
    entry = entry_for(request, status, parts, body, target=target, details=details)
    if entry is not None:
        await record(conn, actor, entry, origin_of(request))


def refused_entry(request: Request, status: int, target: str | None, details: Any) -> tuple[Entry, Origin] | None:
    entry = entry_for(request, status, outcome="refused", target=target, details=details or {})
    return None if entry is None else (entry, origin_of(request))
