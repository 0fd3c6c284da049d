"""Read-side catalog queries shared by every process: repositories and what content routes name.

Permission rule (decided here once, documented in README "Permissions"): a principal who may
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

from .errors import InvalidInput, NotFound, Unauthorized
from .identity import Principal

QUERY_TIMEOUT_S = 5.0
REPOSITORY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


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
    if not REPOSITORY_NAME.match(name):
        raise InvalidInput(
            "repository names are 1-100 characters of letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def parse_uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"{what} must be a UUID") from None


async def repository_for_read(pool: asyncpg.Pool, name: str, principal: Principal) -> Repository:
    check_repository_name(name)
    row = await pool.fetchrow(
        "SELECT id, name, public FROM arkvory_repositories WHERE name = $1",
        name,
        timeout=QUERY_TIMEOUT_S,
    )
    if row is not None and (row["public"] or principal.may_read(name)):
        return Repository(**row)
    if principal.is_anonymous:
        raise Unauthorized("this repository needs credentials")
    raise NotFound(f"no repository {name!r}")


_ARTIFACT_COLUMNS = "a.id, a.name, a.sha256, a.size, a.media_type"


async def artifact_by_id(pool: asyncpg.Pool, repo: Repository, artifact_id: uuid.UUID) -> Artifact:
    row = await pool.fetchrow(
        f"SELECT {_ARTIFACT_COLUMNS} FROM arkvory_artifacts a"
        " WHERE a.repository_id = $1 AND a.id = $2",
        repo.id,
        artifact_id,
        timeout=QUERY_TIMEOUT_S,
    )
    if row is None:
        raise NotFound(f"no artifact {artifact_id} in {repo.name!r}")
    return Artifact(**row)


async def artifact_by_package(
    pool: asyncpg.Pool, repo: Repository, group: str, name: str, version: str
) -> Artifact:
    row = await pool.fetchrow(
        f"SELECT {_ARTIFACT_COLUMNS} FROM arkvory_packages p"
        " JOIN arkvory_artifacts a ON a.id = p.artifact_id"
        " WHERE p.repository_id = $1 AND p.group_name = $2 AND p.name = $3 AND p.version = $4",
        repo.id,
        group,
        name,
        version,
        timeout=QUERY_TIMEOUT_S,
    )
    if row is None:
        raise NotFound(f"no package {group}/{name}/{version} in {repo.name!r}")
    return Artifact(**row)


async def artifact_by_asset(pool: asyncpg.Pool, repo: Repository, path: str) -> Artifact:
    row = await pool.fetchrow(
        f"SELECT {_ARTIFACT_COLUMNS} FROM arkvory_assets s"
        " JOIN arkvory_artifacts a ON a.id = s.artifact_id"
        " WHERE s.repository_id = $1 AND s.path = $2",
        repo.id,
        path,
        timeout=QUERY_TIMEOUT_S,
    )
    if row is None:
        raise NotFound(f"no asset {path!r} in {repo.name!r}")
    return Artifact(**row)
