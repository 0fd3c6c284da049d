"""Read-side catalog queries shared by every process: repositories and what content routes name.

Permission rule (decided here once, documented in docs/api.md "Permissions"): a principal who may
not read a private repository cannot tell it from a missing one. Anonymous callers get 401
(`unauthorized`: send credentials) and authenticated ones 404 (`not_found`), whether the
repository exists or not. 403 `forbidden` is kept for a repository the caller may read but
tries to change.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

import asyncpg

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Busy, InvalidInput, NotFound, Unauthorized, Unavailable

from .catalog_cache import CatalogCache

REPOSITORY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_PACKAGE_FIELD = 255
MAX_ASSET_PATH = 1024
# C0 and C1 controls, DEL, and lone surrogates (which cannot even be encoded for the database).
_UNSAFE_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclasses.dataclass(frozen=True)
class Repository:
    id: uuid.UUID
    name: str
    public: bool


@dataclasses.dataclass(frozen=True)
class Artifact:
    id: uuid.UUID
    name: str
    sha256: str
    size: int
    media_type: str


def check_repository_name(name: str) -> str:
    if not REPOSITORY_NAME.fullmatch(name):
        raise InvalidInput(
            "repository names are 1-100 characters of letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def check_text(value: str, what: str, max_length: int) -> str:
    """Names and paths from clients, checked before any query: PostgreSQL refuses NUL (a 500
    if it got that far) and control characters have no place in a name shown to people."""
    if not value or len(value) > max_length or _UNSAFE_TEXT.search(value):
        raise InvalidInput(
            f"{what} must be 1-{max_length} characters without control characters"
        )
    return value


def parse_uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"{what} must be a UUID") from None


def _readable(repo: Repository | None, name: str, principal: Principal) -> Repository:
    if repo is not None and (repo.public or principal.may_read(name)):
        return repo
    if principal.is_anonymous:
        raise Unauthorized("this repository needs credentials")
    raise NotFound(f"no repository {name!r}")


async def repository_for_read(
    conn: asyncpg.Pool | asyncpg.Connection, name: str, principal: Principal
) -> Repository:
    check_repository_name(name)
    if isinstance(conn, asyncpg.Pool):
        async with pooled(conn) as pooled_conn:
            return await repository_for_read(pooled_conn, name, principal)
    row = await conn.fetchrow(
        "SELECT id, name, public FROM arkvory_repositories WHERE name = $1",
        name,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return _readable(Repository(**row) if row else None, name, principal)


@dataclasses.dataclass(frozen=True)
class ContentKey:
    """How a content route names its artifact: the join that finds it, and its arguments.
    `identity` names it in the catalog cache: strings only, whose hashes Python computes in C
    and keeps (hashing the key itself ran two Python `__hash__` calls, its own and the UUID's,
    on every download)."""

    join: str
    args: tuple
    description: str
    identity: tuple[str, ...]


def by_artifact_id(artifact_id: uuid.UUID) -> ContentKey:
    return ContentKey(
        "LEFT JOIN arkvory_artifacts a ON a.repository_id = r.id AND a.id = $2",
        (artifact_id,),
        f"artifact {artifact_id}",
        ("artifact", str(artifact_id)),
    )


def by_package(group: str, name: str, version: str) -> ContentKey:
    check_text(group, "'group'", MAX_PACKAGE_FIELD)
    check_text(name, "'name'", MAX_PACKAGE_FIELD)
    check_text(version, "'version'", MAX_PACKAGE_FIELD)
    return ContentKey(
        "LEFT JOIN arkvory_packages p ON p.repository_id = r.id"
        " AND p.group_name = $2 AND p.name = $3 AND p.version = $4"
        " LEFT JOIN arkvory_artifacts a ON a.id = p.artifact_id",
        (group, name, version),
        f"package {group}/{name}/{version}",
        ("package", group, name, version),
    )


def check_asset_path(path: str) -> str:
    return check_text(path, "'path'", MAX_ASSET_PATH)


def by_asset(path: str) -> ContentKey:
    check_asset_path(path)
    return ContentKey(
        "LEFT JOIN arkvory_assets s ON s.repository_id = r.id AND s.path = $2"
        " LEFT JOIN arkvory_artifacts a ON a.id = s.artifact_id",
        (path,),
        f"asset {path!r}",
        ("asset", path),
    )


def find_content_now(
    cache: CatalogCache, repo_name: str, principal: Principal, key: ContentKey
) -> tuple[Repository, Artifact] | None:
    """`find_content` from the cache alone: the repository (permission checked) and the
    artifact, or None when the database must be asked. A plain call: the content routes run it
    for every download, small ones included, and await the query only on a miss."""
    check_repository_name(repo_name)
    found = cache.get((repo_name, key.identity))
    if found is None:
        return None
    repo, artifact = found
    return _readable(repo, repo_name, principal), artifact


async def find_content(
    pool: asyncpg.Pool,
    repo_name: str,
    principal: Principal,
    key: ContentKey,
    cache: CatalogCache,
) -> tuple[Repository, Artifact]:
    """The repository (permission checked on every call) and the artifact: from the cache, or
    in one query, since this runs for every download, small ones included."""
    found = find_content_now(cache, repo_name, principal, key)
    if found is not None:
        return found
    generation = cache.generation
    repo, artifact = await _lookup_content(pool, repo_name, principal, key)
    cache.put((repo_name, key.identity), (repo, artifact), generation)
    return repo, artifact


async def _lookup_content(
    pool: asyncpg.Pool, repo_name: str, principal: Principal, key: ContentKey
) -> tuple[Repository, Artifact]:
    async with pooled(pool) as conn:
        row = await conn.fetchrow(
            "SELECT r.id AS repository_id, r.public, a.id, a.name, a.sha256, a.size, a.media_type"
            f" FROM arkvory_repositories r {key.join} WHERE r.name = $1",
            repo_name,
            *key.args,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    repo = Repository(row["repository_id"], repo_name, row["public"]) if row else None
    repo = _readable(repo, repo_name, principal)
    if row["id"] is None:
        raise NotFound(f"no {key.description} in {repo_name!r}")
    return repo, Artifact(row["id"], row["name"], row["sha256"], row["size"], row["media_type"])


async def require_artifact(pool: asyncpg.Pool | None, artifact_id: uuid.UUID) -> None:
    """After a blob was found missing: ask the database, not the cache, whether its artifact
    still exists. Gone → 404 (deleted while we looked); a database that does not answer →
    503 busy/unavailable; else the caller decides what missing content means."""
    assert pool is not None
    try:
        async with pooled(pool) as conn:
            exists = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM arkvory_artifacts WHERE id = $1)",
                artifact_id, timeout=POOLED_QUERY_TIMEOUT_S,
            )
    except TimeoutError:
        raise Busy("no database connection became free in time") from None
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        raise Unavailable("the database cannot be reached now") from None
    if not exists:
        raise NotFound(f"artifact {artifact_id} was deleted")
