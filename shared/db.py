"""Database access: the request pool, dedicated connections and the numbered migrations.

Every call carries a timeout so a hung database cannot hang a request forever. The lease and
the advisory locks use dedicated connections (`connect`), never the pool: asyncpg's pool runs
`pg_advisory_unlock_all()` when it takes a connection back.
"""

from __future__ import annotations

import importlib.resources
import logging
import re

import asyncpg

from .errors import DatabaseUnavailable, StartupRefused
from .settings import Settings, mask_url

log = logging.getLogger("arkvory.db")

QUERY_TIMEOUT_S = 10.0  # dedicated connections' queries, and every connection's backstop
CONNECT_TIMEOUT_S = 5.0
# A query on a pooled connection, for a request or a task (past it, a request answers 503 busy).
POOLED_QUERY_TIMEOUT_S = 5.0
POOL_WAIT_S = 5.0  # a request that cannot get a connection by then answers 503 busy

# Advisory lock keys; the values are arbitrary but fixed forever (operators' tools use them).
WRITER_LOCK = 0x41524B01
WORKER_LOCK = 0x41524B02
MAINTENANCE_LOCK = 0x41524B03  # gateways share it; offline repair tools take it exclusively
MIGRATION_LOCK = 0x41524B04

_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every file in shared/migrations, in order."""
    found = []
    for entry in importlib.resources.files("arkvory.shared.migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    found.sort()
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise RuntimeError(f"migration {name} is out of sequence: expected {expected:04d}")
    return found


CODE_SCHEMA_VERSION = 16  # the highest migration this code knows (tests/test_startup checks it)


async def connect(url: str, *, timeout: float = CONNECT_TIMEOUT_S, **kwargs) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(url, timeout=timeout, command_timeout=QUERY_TIMEOUT_S, **kwargs)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise DatabaseUnavailable(
            f"cannot connect to the database at {mask_url(url)} "
            f"(ARKVORY_DATABASE_URL): {exc.__class__.__name__}: {exc}"
        ) from exc
    except ValueError as exc:  # asyncpg's ClientConfigurationError: an option of the URL it refuses
        raise StartupRefused(
            f"invalid setting ARKVORY_DATABASE_URL: {exc}, got {mask_url(url)!r}"
        ) from None


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset that sends nothing: pooled connections never hold session state (advisory
    locks, LISTEN, SET live on dedicated connections), and asyncpg itself still rolls back a
    transaction left open. The default reset costs a round trip on every release."""


async def create_pool(settings: Settings) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        settings.database_url,
        reset=_keep_session,
        min_size=1,
        max_size=settings.database_pool_size,
        timeout=CONNECT_TIMEOUT_S,
        command_timeout=QUERY_TIMEOUT_S,
        max_inactive_connection_lifetime=60.0,
    )


def pooled(pool: asyncpg.Pool):
    """A pool connection, waited for at most POOL_WAIT_S (then TimeoutError: 503 busy).
    The acquire timeout also bounds the release, which waits for a cancelled query to end."""
    return pool.acquire(timeout=POOL_WAIT_S)


async def schema_version(conn: asyncpg.Connection) -> int | None:
    """The database's schema version, or None when Arkvory never migrated it."""
    exists = await conn.fetchval(
        "SELECT to_regclass('arkvory_schema_version') IS NOT NULL", timeout=QUERY_TIMEOUT_S
    )
    if not exists:
        return None
    return await conn.fetchval(
        "SELECT coalesce(max(version), 0) FROM arkvory_schema_version", timeout=QUERY_TIMEOUT_S
    )


async def migrate(conn: asyncpg.Connection) -> int:
    """Apply pending migrations (writer only); safe to run again and from racing writers."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS arkvory_schema_version ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())",
        timeout=QUERY_TIMEOUT_S,
    )
    for version, name, sql in migrations():
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            done = await conn.fetchval(
                "SELECT 1 FROM arkvory_schema_version WHERE version = $1", version
            )
            if done:
                continue
            log.info("applying migration %s", name)
            await conn.execute(sql, timeout=60.0)
            await conn.execute(
                "INSERT INTO arkvory_schema_version (version, name) VALUES ($1, $2)", version, name
            )
    current = await schema_version(conn)
    assert current is not None
    if current > CODE_SCHEMA_VERSION:
        raise StartupRefused(
            f"the database schema is version {current} but this writer knows only "
            f"{CODE_SCHEMA_VERSION}: run the newer Arkvory version"
        )
    return current
