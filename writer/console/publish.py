"""Publishing from the console what the API does (issue 25 §5): a package version (an artifact
registered as group/name/version) and an asset (a path pointed, re-pointed, or pointed back at
an artifact of its history). Each has a page: what it points at, an asset's history, and how to
download it through the gateways (downloads.py).

Every change is the API's (`PUT .../packages`, `PUT .../assets`, `POST .../asset/restore`) as the
signed-in account, with the form's idempotency key; its refusal (an unknown artifact, a version
already published with another artifact) is shown on the form with what was typed. The forms
are offered to accounts that may write to the repository; the API decides anyway.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import repository_for_read
from arkvory.shared.errors import ApiError, Forbidden

from .downloads import asset_lines, package_lines
from .forms import Form
from .internal import InternalApi, Refused, api_path
from .session import ConsoleUser, action, api_for, page, refusal_status, render, runtime_of, see_other
from .views import repository_path

PACKAGE_FIELDS = ("group", "name", "version")
HISTORY_SHOWN = 100


def _shown(error: Refused | ApiError | None) -> dict[str, Any]:
    return {"status": refusal_status(error) if error else 200, "error": error.message if error else None}


async def _writable(request: Request, user: ConsoleUser) -> tuple[InternalApi, dict[str, Any], dict[str, bool]]:
    """The repository of the request, which the account may read (else the API's 404) and must
    be allowed to write to for a publishing form."""
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", request.path_params["repo"]))
    abilities = user.abilities(repository["name"])
    if not abilities["may_write"]:
        raise Forbidden(f"publishing to {repository['name']!r} needs the repository's write permission")
    return api, repository, abilities


async def _artifact_or_none(api: InternalApi, repo: str, artifact_id: str | None) -> dict[str, Any] | None:
    """The artifact a form names, to show which one it is; None for no such artifact."""
    if not artifact_id:
        return None
    try:
        uuid.UUID(artifact_id)
        return await api.fetch(api_path("repositories", repo, "artifacts", artifact_id))
    except (ValueError, Refused):
        return None


# -- package versions -------------------------------------------------------------------------


async def _form(request: Request, user: ConsoleUser, template: str, linked: tuple[str, ...], *,
                error: Refused | ApiError | None = None, form: Form | None = None) -> Response:
    """A publishing form: empty but for what a link filled in (`linked`: `?artifact=` from an
    artifact's page), or as it was sent, with the API's refusal."""
    api, repository, abilities = await _writable(request, user)
    if form is not None:
        fields = dict(form.fields)
    else:
        fields = {name: request.query_params.get(name, "") for name in linked}
    artifact = await _artifact_or_none(api, repository["name"], fields.get("artifact", "").strip())
    return render(
        request, user, template,
        {"repository": repository, "base": repository_path(repository["name"]), "form": fields,
         "artifact": artifact, **abilities},
        **_shown(error),
    )


def _publish_form(request: Request, user: ConsoleUser, **shown: Any) -> Awaitable[Response]:
    return _form(request, user, "publish_package.html", ("artifact",), **shown)


@page
async def publish_package_page(request: Request, user: ConsoleUser) -> Response:
    return await _publish_form(request, user)


@action
async def publish_package(request: Request, user: ConsoleUser, form: Form) -> Response:
    repo = request.path_params["repo"]
    body = {**{field: form.text(field) for field in PACKAGE_FIELDS}, "artifactId": form.text("artifact").strip()}
    try:
        answer = await api_for(request, user).change(
            "PUT", api_path("repositories", repo, "packages"), body, key=form.optional("key")
        )
    except Refused as refusal:
        return await _publish_form(request, user, error=refusal, form=form)
    package = answer.json()
    notice = "package-published" if answer.status == 201 else "package-exists"
    return see_other(f"{repository_path(repo)}/package", notice, **{field: package[field] for field in PACKAGE_FIELDS})


@page
async def package_page(request: Request, user: ConsoleUser) -> Response:
    repo = request.path_params["repo"]
    coordinates = {field: request.query_params.get(field, "") for field in PACKAGE_FIELDS}
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    package = await api.fetch(api_path("repositories", repo, "package"), coordinates)
    artifact = await api.fetch(api_path("repositories", repo, "artifacts", package["artifactId"]))
    return render(
        request, user, "package.html",
        {"repository": repository, "base": repository_path(repository["name"]), "package": package,
         "artifact": artifact, "lines": package_lines(request, repository, package),
         **user.abilities(repository["name"])},
    )


# -- assets ------------------------------------------------------------------------------------------


def _point_form(request: Request, user: ConsoleUser, **shown: Any) -> Awaitable[Response]:
    return _form(request, user, "point_asset.html", ("path", "artifact"), **shown)


@page
async def point_asset_page(request: Request, user: ConsoleUser) -> Response:
    return await _point_form(request, user)


@action
async def point_asset(request: Request, user: ConsoleUser, form: Form) -> Response:
    repo, path = request.path_params["repo"], form.text("path")
    try:
        await api_for(request, user).change(
            "PUT", api_path("repositories", repo, "assets"), {"artifactId": form.text("artifact").strip()},
            key=form.optional("key"), query={"path": path},
        )
    except Refused as refusal:
        return await _point_form(request, user, error=refusal, form=form)
    return see_other(f"{repository_path(repo)}/asset", "asset-pointed", path=path)


async def _artifacts_named(request: Request, user: ConsoleUser, repo: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Name and size of the artifacts an asset's history points at (the API shows one artifact a
    request), by id; a deleted one is missing. Read after the API let the account read `repo`."""
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        repository = await repository_for_read(conn, repo, user.principal)
        rows = await conn.fetch(
            "SELECT id, name, size FROM arkvory_artifacts WHERE repository_id = $1 AND id = ANY($2::uuid[])",
            repository.id, [uuid.UUID(artifact_id) for artifact_id in set(ids)], timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return {str(row["id"]): {"name": row["name"], "size": row["size"]} for row in rows}


async def _asset(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                 path: str | None = None) -> Response:
    repo = request.path_params["repo"]
    path = request.query_params.get("path", "") if path is None else path
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", repo))
    asset = await api.fetch(api_path("repositories", repo, "asset"), {"path": path, "historyLimit": str(HISTORY_SHOWN)})
    ids = [asset["artifactId"], *(entry["artifactId"] for entry in asset["history"])]
    artifacts = await _artifacts_named(request, user, repository["name"], ids)
    return render(
        request, user, "asset.html",
        {"repository": repository, "base": repository_path(repository["name"]), "asset": asset,
         "artifacts": artifacts, "current": artifacts.get(asset["artifactId"]),
         "lines": asset_lines(request, repository, asset["path"]), "history_shown": HISTORY_SHOWN,
         **user.abilities(repository["name"])},
        **_shown(error),
    )


@page
async def asset_page(request: Request, user: ConsoleUser) -> Response:
    return await _asset(request, user)


@action
async def restore_asset(request: Request, user: ConsoleUser, form: Form) -> Response:
    """Point the asset back at the artifact of one of its history's entries."""
    repo, path = request.path_params["repo"], form.text("path")
    try:
        entry = form.whole_number("history", "the history entry")
        await api_for(request, user).change(
            "POST", api_path("repositories", repo, "asset", "restore"), {"historyId": entry},
            key=form.optional("key"), query={"path": path},
        )
    except (Refused, ApiError) as refusal:
        return await _asset(request, user, error=refusal, path=path)
    return see_other(f"{repository_path(repo)}/asset", "asset-restored", path=path)
