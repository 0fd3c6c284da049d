"""Writer routes for repositories, packages and assets (SPEC §6)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.bodies import read_json_object
from shared.catalog import (
    MAX_PACKAGE_FIELD,
    QUERY_TIMEOUT_S,
    Repository,
    check_asset_path,
    check_repository_name,
    check_text,
    parse_uuid,
    pooled,
    repository_for_read,
)
from shared.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from shared.credentials import SESSION_COOKIE, resolve
from shared.identity import Principal
from shared.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


def forget_cached_lookups(request: Request) -> None:
    """Our own next request must see a change at once; other processes hear of it by NOTIFY."""
    runtime_of(request).catalog.invalidate()


async def principal_of(request: Request) -> Principal:
    """Any credential kind (shared/credentials.py); on the writer also the session cookie of the
    console (SameSite=Strict, so other sites cannot make a browser send it)."""
    return await resolve(
        runtime_of(request),
        request.headers.get("authorization"),
        request.cookies.get(SESSION_COOKIE),
    )


async def json_body(request: Request) -> dict[str, Any]:
    """The JSON object body, bounded in size, depth and time; read only after the caller
    was authenticated (and, where the route can tell, authorized)."""
    return await read_json_object(request, runtime_of(request).settings.receive_timeout_s)


async def repository_for_write(request: Request, principal: Principal) -> Repository:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    repo = await repository_for_read(runtime.pool, request.path_params["repo"], principal)
    if not principal.may_write(repo.name):
        raise Forbidden(f"no write permission on {repo.name!r}")
    return repo


def repository_json(repo: Repository | asyncpg.Record) -> dict[str, Any]:
    if not isinstance(repo, Repository):
        repo = Repository(**repo)
    return {"id": str(repo.id), "name": repo.name, "public": repo.public}


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
    pool = runtime_of(request).pool
    assert pool is not None
    try:
        async with pooled(pool) as conn:
            row = await conn.fetchrow(
                "INSERT INTO arkvory_repositories (id, name, public) VALUES ($1, $2, $3)"
                " RETURNING id, name, public",
                uuid.uuid4(),
                name,
                public,
                timeout=QUERY_TIMEOUT_S,
            )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"repository {name!r} already exists") from None
    return JSONResponse(repository_json(row), status_code=201)


async def list_repositories(request: Request) -> Response:
    principal = await principal_of(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await conn.fetch(
            "SELECT id, name, public FROM arkvory_repositories ORDER BY name", timeout=QUERY_TIMEOUT_S
        )
    visible = [repository_json(r) for r in rows if r["public"] or principal.may_read(r["name"])]
    return JSONResponse({"items": visible})


async def show_repository(request: Request) -> Response:
    runtime = runtime_of(request)
    assert runtime.pool is not None
    repo = await repository_for_read(runtime.pool, request.path_params["repo"], await principal_of(request))
    return JSONResponse(repository_json(repo))


async def update_repository(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    body = await json_body(request)
    public = body.get("public")
    if not isinstance(public, bool):
        raise InvalidInput("'public' must be true or false")
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        await conn.execute(
            "UPDATE arkvory_repositories SET public = $2 WHERE id = $1", repo.id, public,
            timeout=QUERY_TIMEOUT_S,
        )
    forget_cached_lookups(request)
    return JSONResponse({**repository_json(repo), "public": public})


async def delete_repository(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    if not principal.is_admin:
        raise Forbidden("deleting a repository needs the admin scope")
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        await conn.execute("DELETE FROM arkvory_repositories WHERE id = $1", repo.id, timeout=QUERY_TIMEOUT_S)
    forget_cached_lookups(request)
    return Response(status_code=204)


async def _artifact_in(conn: asyncpg.Connection, repo: Repository, value: Any) -> uuid.UUID:
    if not isinstance(value, str):
        raise InvalidInput("'artifactId' is required")
    artifact_id = parse_uuid(value, "artifactId")
    found = await conn.fetchval(
        "SELECT 1 FROM arkvory_artifacts WHERE id = $1 AND repository_id = $2",
        artifact_id,
        repo.id,
        timeout=QUERY_TIMEOUT_S,
    )
    if not found:
        raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
    return artifact_id


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise InvalidInput(f"'{name}' must be a string")
    return check_text(value, f"'{name}'", MAX_PACKAGE_FIELD)


async def register_package(request: Request) -> Response:
    """A version is immutable once published: re-registering the same artifact is harmless."""
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    body = await json_body(request)
    group, name, version = (_text(body, k) for k in ("group", "name", "version"))
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        artifact_id = await _artifact_in(conn, repo, body.get("artifactId"))
        row = await conn.fetchrow(
            "INSERT INTO arkvory_packages (repository_id, group_name, name, version, artifact_id)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING artifact_id",
            repo.id, group, name, version, artifact_id,
            timeout=QUERY_TIMEOUT_S,
        )
        existing = None if row is not None else await conn.fetchval(
            "SELECT artifact_id FROM arkvory_packages WHERE repository_id = $1"
            " AND group_name = $2 AND name = $3 AND version = $4",
            repo.id, group, name, version,
            timeout=QUERY_TIMEOUT_S,
        )
    status = 201
    if row is None:
        if existing != artifact_id:
            raise Conflict(f"{group}/{name}/{version} is already published with another artifact")
        status = 200
    return JSONResponse(
        {"group": group, "name": name, "version": version, "artifactId": str(artifact_id)},
        status_code=status,
    )


async def point_asset(request: Request) -> Response:
    principal = await principal_of(request)
    repo = await repository_for_write(request, principal)
    path = check_asset_path(request.query_params.get("path") or "")
    body = await json_body(request)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn, conn.transaction():
        artifact_id = await _artifact_in(conn, repo, body.get("artifactId"))
        await conn.execute(
            "INSERT INTO arkvory_assets (repository_id, path, artifact_id) VALUES ($1, $2, $3)"
            " ON CONFLICT (repository_id, path) DO UPDATE"
            " SET artifact_id = excluded.artifact_id, updated_at = now()",
            repo.id, path, artifact_id,
            timeout=QUERY_TIMEOUT_S,
        )
        await conn.execute(
            "INSERT INTO arkvory_asset_history (repository_id, path, artifact_id) VALUES ($1, $2, $3)",
            repo.id, path, artifact_id,
            timeout=QUERY_TIMEOUT_S,
        )
    forget_cached_lookups(request)
    return JSONResponse({"path": path, "artifactId": str(artifact_id)})


routes = [
    Route("/api/v1/repositories", create_repository, methods=["POST"]),
    Route("/api/v1/repositories", list_repositories, methods=["GET"]),
    Route("/api/v1/repositories/{repo}", show_repository, methods=["GET"]),
    Route("/api/v1/repositories/{repo}", update_repository, methods=["PATCH"]),
    Route("/api/v1/repositories/{repo}", delete_repository, methods=["DELETE"]),
    Route("/api/v1/repositories/{repo}/packages", register_package, methods=["PUT", "POST"]),
    Route("/api/v1/repositories/{repo}/assets", point_asset, methods=["PUT"]),
]
