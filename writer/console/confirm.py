"""Every delete, revoke, disable and task cancel asks first (issue 25 §7: one click deleted an
artifact).

A danger button is a link to its confirmation page (GET the same path as the change): it says
what will happen and holds the form that does it, with the CSRF token, an idempotency key (the
unconfirmed form's, else a fresh one) and `confirm=yes`. The change itself (POST) runs only with
`confirm=yes`; a form without it, an old page's or a script's, gets the same confirmation page
and changes nothing. There is no script in it: with or without JavaScript it is the same page.

What each page says is a `describe` function below: it reads what is about to go through the
API, as the signed-in account (so a page for something the account may not see is the API's
404, never a hint that it exists), refuses (403) what the API would refuse this account anyway,
as the API words it, and names the fields the confirmed form carries.
"""

from __future__ import annotations

import dataclasses
import functools
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Conflict, Forbidden, InvalidInput, NotFound

from ..identity.account_names import fold
from ..request_inputs import require_admin_scope
from ..tasks.store import FINISHED
from .forms import Form
from .internal import api_path
from .session import ConsoleUser, Handler, api_for, page, render, runtime_of
from .views import form_key, repository_path, size

CONFIRM_FIELD = "confirm"
CONFIRMED = "yes"


@dataclasses.dataclass(frozen=True)
class Danger:
    """One confirmation page: its question, what will happen, and the form that does it."""

    title: str
    action: str  # where the confirmed form posts (the change's own path)
    button: str
    back: str  # the page the Cancel link returns to
    facts: tuple[str, ...] = ()
    fields: Mapping[str, str] = dataclasses.field(default_factory=dict)  # carried as hidden fields
    option: tuple[str, str] | None = None  # (field, label): a checkbox the page offers, unticked
    back_label: str = "Cancel"  # the link that leaves without the change


Describe = Callable[[Request, ConsoleUser, Mapping[str, str]], Awaitable[Danger]]


async def _confirmation(request: Request, user: ConsoleUser, describe: Describe, fields: Mapping[str, str],
                        key: str | None) -> Response:
    danger = await describe(request, user, fields)
    return render(request, user, "confirm.html", {"danger": danger, "key": key or form_key()})


def asks_first(describe: Describe) -> Callable[[Handler], Handler]:
    """For an action handler (`@action` above it): a form without `confirm=yes` is answered
    with the confirmation page, and nothing is done."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(request: Request, user: ConsoleUser, form: Form) -> Response:
            if form.text(CONFIRM_FIELD) != CONFIRMED:
                return await _confirmation(request, user, describe, form.fields, form.optional("key"))
            return await handler(request, user, form)

        return run

    return wrap


def confirmation_page(describe: Describe) -> Handler:
    """The GET route of a danger's path: its confirmation page, from the query's fields."""

    @page
    async def show(request: Request, user: ConsoleUser) -> Response:
        return await _confirmation(request, user, describe, request.query_params, None)

    return show


# -- what each page says ----------------------------------------------------------------------


def _text(fields: Mapping[str, str], name: str) -> str:
    return fields.get(name, "")


def _may(user: ConsoleUser, ability: str, repo: str, refusal: str) -> None:
    """Refuse a page whose change the API would refuse this account (as the API words it)."""
    if not user.abilities(repo)[ability]:
        raise Forbidden(refusal)


def _uuid_or_none(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def delete_repository(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repository = await api_for(request, user).fetch(api_path("repositories", request.path_params["repo"]))
    _may(user, "may_delete", repository["name"], "deleting a repository needs the admin scope")
    base = repository_path(repository["name"])
    return Danger(
        title=f"Delete repository {repository['name']}?",
        facts=(
            "Its artifacts, package versions, assets and permissions go with it; this cannot be undone.",
            "A repository that still holds artifacts is deleted only with the box below ticked: their records"
            " go at once and cleanup reclaims their space.",
        ),
        button="Delete the repository", action=f"{base}/delete", back=base,
        option=("force", "also when it still holds artifacts"),
    )


async def delete_artifact(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repo, artifact_id = request.path_params["repo"], request.path_params["artifact_id"]
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    _may(user, "may_write", repository["name"], f"no write permission on {repository['name']!r}")
    artifact = await api.fetch(api_path("repositories", repo, "artifacts", artifact_id))
    page_path = f"{repository_path(repository['name'])}/artifacts/{artifact['id']}"
    return Danger(
        title=f"Delete artifact {artifact['name']}?",
        facts=(
            f"{size(artifact['size'])}, SHA-256 {artifact['sha256']}.",
            "Its record goes at once and its download stops; cleanup reclaims the space. This cannot be undone.",
            "The writer refuses while a package version or an asset uses it.",
        ),
        button="Delete the artifact", action=f"{page_path}/delete", back=page_path,
    )


async def delete_package(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repo = request.path_params["repo"]
    coordinates = {name: _text(fields, name) for name in ("group", "name", "version")}
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    _may(user, "may_write", repository["name"], f"no write permission on {repository['name']!r}")
    package = await api.fetch(api_path("repositories", repo, "package"), coordinates)
    base = repository_path(repository["name"])
    spelled = f"{package['group']}/{package['name']} {package['version']}"
    return Danger(
        title=f"Delete package version {spelled}?",
        facts=(
            "Its record goes at once: downloads of this version stop. The artifact stays.",
            "The version may then be published again, with any artifact.",
        ),
        button="Delete the package version", action=f"{base}/packages/delete", back=f"{base}/packages",
        fields=coordinates,
    )


async def delete_asset(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repo, path = request.path_params["repo"], _text(fields, "path")
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    _may(user, "may_write", repository["name"], f"no write permission on {repository['name']!r}")
    asset = await api.fetch(api_path("repositories", repo, "asset"), {"path": path, "historyLimit": "0"})
    base = repository_path(repository["name"])
    return Danger(
        title=f"Delete asset {asset['path']}?",
        facts=("The path and its whole history go at once: downloads of it stop. The artifacts it pointed at stay.",),
        button="Delete the asset", action=f"{base}/assets/delete", back=f"{base}/assets",
        fields={"path": asset["path"]},
    )


async def remove_member(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repo, account = request.path_params["repo"], _text(fields, "account")
    if not account:
        raise InvalidInput("the form names no account")
    repository = await api_for(request, user).fetch(api_path("repositories", repo))
    _may(user, "may_administer", repository["name"],
         f"managing permissions of {repository['name']!r} needs its admin permission")
    member = await _member(request, uuid.UUID(repository["id"]), account)
    if member is None:  # as the API's DELETE words it: no page for a removal that cannot happen
        raise NotFound(f"{account!r} has no permission on {repository['name']!r}")
    base = repository_path(repository["name"])
    return Danger(
        title=f"Remove {member['name']} from the members of {repository['name']}?",
        facts=(f"The account loses what its level ({member['level']}) allowed from its next request, on every process.",),
        button="Remove the member", action=f"{base}/members/remove", back=f"{base}/members",
        fields={"account": member["name"]},
    )


async def _member(request: Request, repository_id: uuid.UUID, account: str) -> dict[str, Any] | None:
    """The member's name as stored and level, found by `account` in any case; None when the
    account is not a member (the page is shown only to the repository's admins)."""
    return await _one_row(
        request,
        "SELECT a.name, p.level FROM arkvory_repository_permissions p"
        " JOIN arkvory_accounts a ON a.id = p.account_id"
        ' WHERE p.repository_id = $1 AND lower(a.name COLLATE "C") = $2',  # account_names.FOLDED_NAME
        repository_id, fold(account),
    )


async def _one_row(request: Request, sql: str, *args: Any) -> dict[str, Any] | None:
    """What a page names that the API does not answer with: one row read as the console."""
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        row = await conn.fetchrow(sql, *args, timeout=POOLED_QUERY_TIMEOUT_S)
    return dict(row) if row is not None else None


async def cancel_task(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    task_id = request.path_params["task_id"]
    require_admin_scope(user.principal, "tasks")
    task = await api_for(request, user).fetch(api_path("tasks", task_id))
    page_path = f"/console/tasks/{_quoted(task['id'])}"
    if task["status"] in FINISHED:  # as the API's cancel words it
        raise Conflict(f"task {task['id']} is already {task['status']}; it cannot be cancelled")
    if task["status"] in ("queued", "loading"):
        what = "It has not started: it never will."
    else:
        what = ("The worker stops it at its next step. What it has done stays done: the blobs a cleanup"
                " deleted, the findings a verify recorded; a cancelled task is not resumed.")
    return Danger(
        title=f"Cancel the {task['kind']} task {task['id']}?",
        facts=(f"It is {task['status']}.", what),
        button="Cancel the task", action=f"{page_path}/cancel", back=page_path, back_label="Keep it",
    )


async def _retention_rule(request: Request, user: ConsoleUser) -> tuple[dict[str, Any], dict[str, Any]]:
    """The repository and its rule, through the API: only the repository's admins get past it
    (the API's 403), and a repository without a rule is the API's 404."""
    repo = request.path_params["repo"]
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    return repository, await api.fetch(api_path("repositories", repo, "retention"))


async def disable_retention(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repository, _ = await _retention_rule(request, user)
    base = repository_path(repository["name"])
    return Danger(
        title=f"Disable the retention rule of {repository['name']}?",
        facts=("The cleanup task deletes nothing by it until it is enabled again; its limits stay saved.",),
        button="Disable the rule", action=f"{base}/retention/disable", back=f"{base}/retention",
    )


async def delete_retention(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    repository, _ = await _retention_rule(request, user)
    base = repository_path(repository["name"])
    return Danger(
        title=f"Delete the retention rule of {repository['name']}?",
        facts=("The rule and its limits go: the cleanup task deletes none of this repository's artifacts"
               " until a new rule is saved and enabled.",),
        button="Delete the rule", action=f"{base}/retention/delete", back=f"{base}/retention",
    )


async def disable_account(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    name = request.path_params["name"]
    require_admin_scope(user.principal, "accounts")
    return Danger(
        title=f"Disable account {name}?",
        facts=(
            "Its sessions and personal tokens end at once, on every process; the service keys it made are"
            " suspended until an administrator adopts or revokes them.",
            "Enabling it again lets it sign in; the tokens that ended stay ended.",
        ),
        button="Disable the account", action=f"/console/accounts/{_quoted(name)}/disable", back="/console/accounts",
    )


async def _credential(request: Request, user: ConsoleUser, credential_id: str, kind: str) -> dict[str, Any] | None:
    """A token's or key's label and account, when this account may revoke it (its own, or any
    for an administrator), for the page to name it; None otherwise (the API decides anyway)."""
    parsed = _uuid_or_none(credential_id)
    if parsed is None:
        return None
    return await _one_row(
        request,
        "SELECT c.label, a.name AS account FROM arkvory_credentials c"
        " LEFT JOIN arkvory_accounts a ON a.id = c.account_id"
        " WHERE c.id = $1 AND c.kind = $2 AND ($3 OR c.account_id = $4)",
        parsed, kind, user.admin, user.principal.account_id,
    )


async def revoke_token(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    token_id = request.path_params.get("token_id") or _text(fields, "id").strip()
    found = await _credential(request, user, token_id, "pat")
    named = f"{found['account']}'s token {found['label'] or token_id}" if found else f"token {token_id}"
    back = "/console/accounts" if _text(fields, "back") == "accounts" else "/console/tokens"
    carried = {"back": "accounts"} if back == "/console/accounts" else {}
    if "token_id" not in request.path_params:
        carried["id"] = token_id
    action = f"/console/tokens/{_quoted(token_id)}/revoke" if "token_id" in request.path_params else "/console/tokens/revoke"
    return Danger(
        title=f"Revoke {named}?",
        facts=("It stops working at once, on every process, and cannot be used again.",),
        button="Revoke the token", action=action, back=back, fields=carried,
    )


async def revoke_key(request: Request, user: ConsoleUser, fields: Mapping[str, str]) -> Danger:
    key_id = request.path_params["key_id"]
    require_admin_scope(user.principal, "service keys")
    found = await _credential(request, user, key_id, "service_key")
    named = f"service key {found['label'] or key_id}" if found else f"service key {key_id}"
    return Danger(
        title=f"Revoke {named}?",
        facts=("Every program that uses it is refused from its next request, on every process.",),
        button="Revoke the key", action=f"/console/keys/{_quoted(key_id)}/revoke", back="/console/keys",
    )


def _quoted(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
