"""Repositories and what they hold: lists with paging, create, visibility, delete (its members
are members.py's); an artifact's page (metadata, SHA-256, where it is used) and its download.

Every read and change is the API's (internal.py), as the signed-in account: a repository the
account may not read answers 404 as in the API, a refusal (a repository that still holds
artifacts, an artifact a package version still uses) is shown on the page with the API's message.
What forms a page offers follows the principal's own permission methods (`may_write`,
`may_administer`); the API decides anyway.

The download link is `/console/.../download`, under /console/ so the balancer sends it to the
writer (SPEC §9), and carries no key: the session cookie authorizes it, and the console hands
the request to the writer's content route with that session as the bearer, so ranges,
conditional requests, the bandwidth budget and the admission queue are the content route's.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import check_repository_name, parse_uuid, repository_for_read
from arkvory.shared.errors import ApiError, InvalidInput

from . import confirm
from .confirm import asks_first
from .downloads import artifact_lines
from .forms import Form
from .internal import Refused, api_path
from .list_filters import fetch_listing, filters_of
from .session import (
    ConsoleUser,
    action,
    api_for,
    page,
    refusal_status,
    render,
    runtime_of,
    see_other,
    signed_in,
    sign_in_redirect,
)
from .views import repository_path

USES_SHOWN = 100


def _repo(request: Request) -> str:
    return request.path_params["repo"]


def _base(repo: str) -> str:
    return repository_path(repo)


def _abilities(user: ConsoleUser, repo: str) -> dict[str, bool]:
    return user.abilities(repo)


# -- the list --------------------------------------------------------------------------------


async def _repositories(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                        form: Form | None = None) -> Response:
    filters = filters_of(request, "repositories", "/console/repositories", "Find repositories")
    listing, refused = await fetch_listing(api_for(request, user), "/api/v1/repositories", request, filters)
    error = error or refused
    may_create = user.admin or any(scope.startswith("write:") for scope in user.principal.scopes)
    return render(
        request, user, "repositories.html",
        {"listing": listing, "may_create": may_create, "form": form.fields if form else {}, "list_filters": filters},
        status=refusal_status(error) if error else 200, error=error.message if error else None,
    )


@page
async def repositories_page(request: Request, user: ConsoleUser) -> Response:
    return await _repositories(request, user)


@action
async def create_repository(request: Request, user: ConsoleUser, form: Form) -> Response:
    body = {"name": form.text("name"), "public": form.checked("public")}
    try:
        await api_for(request, user).change("POST", "/api/v1/repositories", body, key=form.optional("key"))
    except Refused as refusal:
        return await _repositories(request, user, error=refusal, form=form)
    return see_other(f"/console/repositories/{form.text('name')}", "repository-created")


# -- one repository ------------------------------------------------------------------------------


async def _repository(request: Request, user: ConsoleUser, tab: str, *, error: Refused | ApiError | None = None) -> Response:
    name = _repo(request)
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", name))
    base = _base(repository["name"])
    filters = filters_of(request, tab, base if tab == "artifacts" else f"{base}/{tab}", f"Find {tab}")
    listing, refused = await fetch_listing(api, api_path("repositories", name, tab), request, filters)
    error = error or refused
    context = {
        "repository": repository,
        "base": base,
        "tab": tab,
        "listing": listing,
        "list_filters": filters,
        **_abilities(user, repository["name"]),
    }
    return render(
        request, user, f"repository_{tab}.html", context,
        status=refusal_status(error) if error else 200, error=error.message if error else None,
    )


@page
async def repository_page(request: Request, user: ConsoleUser) -> Response:
    return await _repository(request, user, "artifacts")


@page
async def packages_page(request: Request, user: ConsoleUser) -> Response:
    return await _repository(request, user, "packages")


@page
async def assets_page(request: Request, user: ConsoleUser) -> Response:
    return await _repository(request, user, "assets")


@action
async def set_visibility(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = _repo(request)
    public = form.text("public")
    if public not in ("true", "false"):
        raise InvalidInput("'public' must be true or false")
    try:
        await api_for(request, user).change(
            "PATCH", api_path("repositories", name), {"public": public == "true"}, key=form.optional("key")
        )
    except Refused as refusal:
        return await _repository(request, user, "artifacts", error=refusal)
    return see_other(f"/console/repositories/{name}", "repository-updated")


@action
@asks_first(confirm.delete_repository)
async def delete_repository(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = _repo(request)
    query = {"force": "true"} if form.checked("force") else None
    try:
        await api_for(request, user).change("DELETE", api_path("repositories", name), key=form.optional("key"), query=query)
    except Refused as refusal:
        return await _repository(request, user, "artifacts", error=refusal)
    return see_other("/console/repositories", "repository-deleted")


@action
@asks_first(confirm.delete_package)
async def delete_package(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = _repo(request)
    query = {field: form.text(field) for field in ("group", "name", "version")}
    try:
        await api_for(request, user).change("DELETE", api_path("repositories", name, "package"), key=form.optional("key"), query=query)
    except Refused as refusal:
        return await _repository(request, user, "packages", error=refusal)
    return see_other(f"/console/repositories/{name}/packages", "package-deleted")


@action
@asks_first(confirm.delete_asset)
async def delete_asset(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = _repo(request)
    try:
        await api_for(request, user).change(
            "DELETE", api_path("repositories", name, "asset"), key=form.optional("key"), query={"path": form.text("path")}
        )
    except Refused as refusal:
        return await _repository(request, user, "assets", error=refusal)
    return see_other(f"/console/repositories/{name}/assets", "asset-deleted")


# -- one artifact ------------------------------------------------------------------------------------


async def _uses(request: Request, user: ConsoleUser, repo: str, artifact_id: str) -> dict[str, Any]:
    """The package versions and assets of `repo` that point at the artifact (the API lists
    neither by artifact). Read only after the API's own check that the account may read `repo`."""
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        repository = await repository_for_read(conn, repo, user.principal)
        packages = await conn.fetch(
            "SELECT group_name, name, version FROM arkvory_packages WHERE repository_id = $1 AND artifact_id = $2"
            " ORDER BY group_name, name, version LIMIT $3",
            repository.id, parse_uuid(artifact_id, "artifact id"), USES_SHOWN + 1, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        assets = await conn.fetch(
            "SELECT path FROM arkvory_assets WHERE repository_id = $1 AND artifact_id = $2 ORDER BY path LIMIT $3",
            repository.id, parse_uuid(artifact_id, "artifact id"), USES_SHOWN + 1, timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return {
        "packages": [dict(row) for row in packages[:USES_SHOWN]],
        "assets": [row["path"] for row in assets[:USES_SHOWN]],
        "more_uses": len(packages) > USES_SHOWN or len(assets) > USES_SHOWN,
    }


async def _artifact(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None) -> Response:
    repo, artifact_id = _repo(request), request.path_params["artifact_id"]
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    artifact = await api.fetch(api_path("repositories", repo, "artifacts", artifact_id))
    uses = await _uses(request, user, repository["name"], artifact["id"])
    return render(
        request, user, "artifact.html",
        {"repository": repository, "base": _base(repository["name"]), "artifact": artifact, **uses,
         "lines": artifact_lines(request, repository, artifact), **_abilities(user, repository["name"])},
        status=refusal_status(error) if error else 200, error=error.message if error else None,
    )


@page
async def artifact_page(request: Request, user: ConsoleUser) -> Response:
    return await _artifact(request, user)


@action
@asks_first(confirm.delete_artifact)
async def delete_artifact(request: Request, user: ConsoleUser, form: Form) -> Response:
    repo, artifact_id = _repo(request), request.path_params["artifact_id"]
    try:
        await api_for(request, user).change(
            "DELETE", api_path("repositories", repo, "artifacts", artifact_id), key=form.optional("key")
        )
    except Refused as refusal:
        return await _artifact(request, user, error=refusal)
    return see_other(f"/console/repositories/{repo}", "artifact-deleted")


class Download:
    """GET/HEAD `/console/repositories/{repo}/artifacts/{artifact_id}/download`: the content
    route's answer, as the signed-in session (module docstring). A plain ASGI endpoint: the
    body goes to the client as the content route sends it, never through the console."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        user = await signed_in(request)
        if user is None:
            await sign_in_redirect(request)(scope, receive, send)
            return
        repo = check_repository_name(scope["path_params"]["repo"])
        artifact_id = str(parse_uuid(scope["path_params"]["artifact_id"], "artifact id"))
        path = f"/api/v1/repositories/{repo}/artifacts/{artifact_id}/content"
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"cookie", b"authorization")]
        headers.append((b"authorization", f"Bearer {user.token}".encode("latin-1")))
        inner = {
            key: value for key, value in scope.items()
            if key not in ("app", "router", "route", "endpoint", "path_params", "root_path")
        }
        inner.update(path=path, raw_path=path.encode("ascii"), query_string=b"", headers=headers, root_path="")
        failed: list[Message] = []

        async def send_or_keep_error(message: Message) -> None:
            # A refusal (JSON) becomes a page; a success goes straight through.
            if failed or (message["type"] == "http.response.start" and message["status"] >= 400):
                failed.append(message)
                return
            await send(message)

        await request.app.state.writer_app(inner, receive, send_or_keep_error)
        if failed:
            await _download_refused(request, user, failed)(scope, receive, send)


def _download_refused(request: Request, user: ConsoleUser, messages: list[Message]) -> Response:
    start = messages[0]
    body = b"".join(m.get("body", b"") for m in messages[1:] if m["type"] == "http.response.body")
    try:
        answer = json.loads(body)
        message = f"{answer['message']} ({answer['code']}, {start['status']})"
    except (ValueError, KeyError, TypeError):
        message = f"the download failed ({start['status']})"
    response = render(request, user, "error.html", {"title": "Download refused"}, status=start["status"], error=message)
    for key, value in start.get("headers", []):
        if key.lower() == b"retry-after":
            response.headers["retry-after"] = value.decode("latin-1")
    return response
