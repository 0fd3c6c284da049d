"""Writer routes for repositories (SPEC §6), and what the catalog's changes share: the repository
checked for writing, found in a change's transaction, its artifact, its JSON form."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import (
    Repository,
    check_repository_name,
    parse_uuid,
    repository_for_read,
)
from arkvory.shared.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized

from .. import openapi
from ..idempotency import Result, idempotent
from ..pagination import ListQuery, SortColumn, page_cursor, page_limit, text_filter
from ..request_inputs import flag, json_body, principal_of, runtime_of

MAX_REPOSITORY_NAME = 100  # shared/download/catalog.py's REPOSITORY_NAME


def forget_cached_lookups(request: Request) -> None:
    """Our own next request must see a change at once; other processes hear of it by NOTIFY."""
    runtime_of(request).catalog.invalidate()


async def repository_for_write(request: Request, principal: Principal) -> Repository:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    repo = await repository_for_read(runtime.pool, request.path_params["repo"], principal)
    if not principal.may_write(repo.name):
        raise Forbidden(f"no write permission on {repo.name!r}")
    return repo


async def administered_repository(request: Request, what: str) -> tuple[Principal, Repository]:
    """(principal, repository of the path) once the caller may administer it: 401 without
    credentials, 404 for one it may not read (as if it did not exist), 403 without its admin
    permission ("`what` of 'name' needs its admin permission")."""
    principal = await principal_of(request)
    if principal.is_anonymous:
        raise Unauthorized("this request needs credentials")
    repo = await repository_for_read(runtime_of(request).pool, request.path_params["repo"], principal)
    if not principal.may_administer(repo.name):
        raise Forbidden(f"{what} of {repo.name!r} needs its admin permission")
    return principal, repo


async def writable_name(request: Request, principal: Principal) -> str:
    """The path's repository name once the principal's scopes allow writing it. No query: the
    repository itself is found by the change (`repository_in`), so that a retry replays its
    recorded result with one lookup, even after the change deleted the repository. A refusal
    is exactly `repository_for_write`'s (401/404 that hide existence, or 403)."""
    name = check_repository_name(request.path_params["repo"])
    if not principal.may_write(name):
        await repository_for_write(request, principal)
        raise Forbidden(f"no write permission on {name!r}")
    return name


async def repository_in(conn: asyncpg.Connection, name: str) -> Repository:
    """The repository a change applies to, found in the change's transaction."""
    row = await conn.fetchrow(
        "SELECT id, name, public FROM arkvory_repositories WHERE name = $1", name, timeout=POOLED_QUERY_TIMEOUT_S
    )
    if row is None:
        raise NotFound(f"no repository {name!r}")
    return Repository(**row)


async def artifact_in(conn: asyncpg.Connection, repo: Repository, value: Any) -> uuid.UUID:
    """The `artifactId` of a body, which must name an artifact of `repo`."""
    if not isinstance(value, str):
        raise InvalidInput("'artifactId' is required")
    artifact_id = parse_uuid(value, "artifactId")
    found = await conn.fetchval(
        "SELECT 1 FROM arkvory_artifacts WHERE id = $1 AND repository_id = $2",
        artifact_id, repo.id,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    if not found:
        raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
    return artifact_id


def repository_json(repo: Repository | asyncpg.Record) -> dict[str, Any]:
    if not isinstance(repo, Repository):
        repo = Repository(**repo)
    return {"id": str(repo.id), "name": repo.name, "public": repo.public}


def repository_location(name: str) -> str:
    return f"/api/v1/repositories/{name}"


def may_write_somewhere(principal: Principal) -> bool:
    return principal.is_admin or any(scope.startswith("write:") for scope in principal.scopes)


async def create_repository(request: Request) -> Response:
    principal = await principal_of(request)
    # Refused before the body is read: who may create nothing sends nothing we must parse.
    if principal.is_anonymous:
        raise Unauthorized("this request needs credentials")
    if not may_write_somewhere(principal):
        raise Forbidden("no permission to create repositories")
    body = await json_body(request)
    name, public = body.get("name"), body.get("public", False)
    if not isinstance(name, str):
        raise InvalidInput("'name' is required")
    check_repository_name(name)
    if not isinstance(public, bool):
        raise InvalidInput("'public' must be true or false")
    if not principal.may_write(name):
        raise Forbidden(f"no permission to create {name!r}")
    if public:
        require_publishing_right(principal, name)

    async def work(conn: asyncpg.Connection) -> Result:
        try:
            row = await conn.fetchrow(
                "INSERT INTO arkvory_repositories (id, name, public) VALUES ($1, $2, $3)"
                " RETURNING id, name, public",
                uuid.uuid4(), name, public,
                timeout=POOLED_QUERY_TIMEOUT_S,
            )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"repository {name!r} already exists") from None
        return Result(201, repository_json(row), {"Location": repository_location(name)})

    return await idempotent(request, principal, {"name": name, "public": public}, work)


def _readable_filter(principal: Principal) -> tuple[bool, list[str]]:
    """(sees every repository, names its scopes name): a pre-filter for SQL; `may_read` decides."""
    every = principal.is_admin or bool(principal.scopes & {"read:*", "write:*"})
    names = [s.split(":", 1)[1] for s in principal.scopes if ":" in s and not s.endswith(":*")]
    return every, names


NAME_ORDER = (SortColumn('name COLLATE "C"', "name"),)  # byte order: the prefix is a range of the index


async def list_repositories(request: Request) -> Response:
    """Sorted by name; `prefix` narrows the list."""
    principal = await principal_of(request)
    limit = page_limit(request)
    listing = ListQuery("SELECT id, name, public FROM arkvory_repositories", NAME_ORDER)
    every, names = _readable_filter(principal)
    if not every:
        listing.where("(public OR name = ANY({}::text[]))", names)
    listing.starts_with('name COLLATE "C"', text_filter(request, "prefix", MAX_REPOSITORY_NAME))
    listing.after(page_cursor(request, listing.key))
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, repository_json, keep=lambda r: r["public"] or principal.may_read(r["name"])))


async def show_repository(request: Request) -> Response:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    principal = await principal_of(request)
    repo = await repository_for_read(runtime.pool, request.path_params["repo"], principal)
    return JSONResponse(repository_json(repo))


def require_publishing_right(principal: Principal, name: str) -> None:
    """Public means anonymous read for everyone, so choosing it is a permission decision like
    granting `read` to all: it needs the repository's admin (or a global admin), not `write`."""
    if not principal.may_administer(name):
        raise Forbidden(f"making {name!r} public or private needs its admin permission")


async def update_repository(request: Request) -> Response:
    principal = await principal_of(request)
    name = await writable_name(request, principal)  # a repository you may not read stays hidden
    require_publishing_right(principal, name)
    body = await json_body(request)
    public = body.get("public")
    if not isinstance(public, bool):
        raise InvalidInput("'public' must be true or false")

    async def work(conn: asyncpg.Connection) -> Result:
        row = await conn.fetchrow(
            "UPDATE arkvory_repositories SET public = $2 WHERE name = $1 RETURNING id, name, public",
            name, public,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no repository {name!r}")
        return Result(200, repository_json(row))

    response = await idempotent(request, principal, {"public": public}, work)
    forget_cached_lookups(request)
    return response


async def delete_repository(request: Request) -> Response:
    """Deleting removes the metadata at once (artifacts, packages, assets); blobs stay for the
    cleanup task. A repository that holds artifacts needs `?force=true`."""
    principal = await principal_of(request)
    name = await writable_name(request, principal)
    if not principal.is_admin:
        raise Forbidden("deleting a repository needs the admin scope")
    force = flag(request, "force")

    async def work(conn: asyncpg.Connection) -> Result:
        # The row lock orders us after uploads in flight: their artifact INSERT holds a key-share
        # lock on it (foreign key), so the count below sees every artifact that will exist.
        row = await conn.fetchrow(
            "SELECT id, name, public FROM arkvory_repositories WHERE name = $1 FOR UPDATE", name,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no repository {name!r}")
        repo = Repository(**row)
        if not force:
            held = await conn.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM arkvory_artifacts WHERE repository_id = $1 LIMIT 1001) a",
                repo.id,
                timeout=POOLED_QUERY_TIMEOUT_S,
            )
            if held:
                many = "more than 1000" if held > 1000 else str(held)
                raise Conflict(
                    f"repository {repo.name!r} still holds {many} artifact(s): delete them first, "
                    "or send DELETE with ?force=true to delete it with everything in it"
                )
        await conn.execute("DELETE FROM arkvory_repositories WHERE id = $1", repo.id, timeout=POOLED_QUERY_TIMEOUT_S)
        return Result(204)

    response = await idempotent(request, principal, {"force": force}, work)
    forget_cached_lookups(request)
    return response


routes = [
    Route("/api/v1/repositories", create_repository, methods=["POST"]),
    Route("/api/v1/repositories", list_repositories, methods=["GET"]),
    Route("/api/v1/repositories/{repo}", show_repository, methods=["GET"]),
    Route("/api/v1/repositories/{repo}", update_repository, methods=["PATCH"]),
    Route("/api/v1/repositories/{repo}", delete_repository, methods=["DELETE"]),
]

_REPOSITORY = {
    "type": "object",
    "required": ["id", "name", "public"],
    "properties": {"id": {"type": "string", "format": "uuid"}, "name": {"type": "string"}, "public": {"type": "boolean"}},
}
_REPOSITORY_OK = {"content": openapi.json_content(_REPOSITORY)}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/repositories": {
        "post": {
            "summary": "Create a repository (any write scope; the name must be writable by you;"
            " `public: true` needs the admin scope)",
            "parameters": [openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body({
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"},
                    "public": {"type": "boolean", "default": False},
                },
            }),
            "responses": {
                "201": {"description": "Created", "headers": {"Location": {"schema": {"type": "string"}}}, **_REPOSITORY_OK},
                **openapi.errors(400, 401, 403, 409, 413, 422),
            },
        },
        "get": {
            "summary": "List the repositories you may read, by name (byte order)",
            "security": openapi.ANONYMOUS_TOO,
            "parameters": [openapi.prefix_param("name", MAX_REPOSITORY_NAME), *openapi.page_params()],
            "responses": {
                "200": {"description": "One page", "content": openapi.json_content(openapi.page_of(_REPOSITORY))},
                **openapi.errors(400, 401),
            },
        },
    },
    "/api/v1/repositories/{repo}": {
        "get": {
            "summary": "Show a repository",
            "security": openapi.ANONYMOUS_TOO,
            "parameters": [openapi.repo_param()],
            "responses": {"200": {"description": "The repository", **_REPOSITORY_OK}, **openapi.errors(400, 401, 404)},
        },
        "patch": {
            "summary": "Make a repository public (anonymous reads) or private: needs its repository"
            " admin permission or the admin scope (write is not enough)",
            "parameters": [openapi.repo_param(), openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body(
                {"type": "object", "required": ["public"], "properties": {"public": {"type": "boolean"}}}
            ),
            "responses": {"200": {"description": "Updated", **_REPOSITORY_OK}, **openapi.errors(400, 401, 403, 404, 409, 413, 422)},
        },
        "delete": {
            "summary": "Delete a repository (admin); one that holds artifacts needs force=true",
            "parameters": [
                openapi.repo_param(),
                openapi.query_param(
                    "force", "Delete even when it holds artifacts (their metadata goes at once).",
                    schema={"type": "string", "enum": ["true", "false"]},
                ),
                openapi.IDEMPOTENCY_KEY,
            ],
            "responses": {"204": {"description": "Deleted"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
        },
    },
}
