"""Database access: the request pool, dedicated connections and the numbered migrations.

Every call carries a timeout so a hung database cannot hang a request forever. The lease and
the advisory locks use dedicated connections (`connect`), never the pool: asyncpg's pool runs
`pg_advisory_unlock_all()` when it takes a connection back. Every connection, pooled or
dedicated, is opened by `open_connection`, which gives each host of a multi-host URL (a primary
and its standby, `?target_session_attrs=read-write`) a timeout of its own.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import re
import urllib.parse

import asyncpg

from .errors import DatabaseRefused, DatabaseUnavailable, StartupRefused
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


CODE_SCHEMA_VERSION = 20  # the highest migration this code knows (tests/test_startup checks it)


# What a restart cannot cure: the server answered and refused this client. SQLSTATE class 28 (a
# wrong password 28P01; an unknown role, a role that may not log in, no pg_hba.conf line for this
# host, user and database, with or without SSL: 28000), 3D000 (no such database), 42501 (no CONNECT
# right on it). Anything else (refused or timed-out connections, too many clients, a server
# starting or shutting down) may pass: a retry may help.
_REFUSALS = (
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.InsufficientPrivilegeError,
)
CONNECT_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError)


def connect_failed(url: str, exc: BaseException) -> DatabaseUnavailable:
    """The start-up error for a failed connection to `url` (one of CONNECT_ERRORS): refused
    (exit 78) or unavailable (69), in one line naming ARKVORY_DATABASE_URL, its password masked."""
    # One line: a server's refusal may carry a DETAIL line.
    why = f"{exc.__class__.__name__}: {' '.join(str(exc).split())}"
    if isinstance(exc, _REFUSALS):
        return DatabaseRefused(
            f"the database at {mask_url(url)} (ARKVORY_DATABASE_URL) refuses us: {why}; fix the"
            " URL or the server's roles, databases or pg_hba.conf, then start again"
        )
    return DatabaseUnavailable(
        f"cannot connect to the database at {mask_url(url)} (ARKVORY_DATABASE_URL): {why}"
    )


class NoUsableHost(ConnectionError):
    """No host of ARKVORY_DATABASE_URL took the connection: each one's reason, in one line.
    An OSError, so that every caller treats it as the unreachable database it is."""


# Whatever makes one host of several unusable for now: the next host is tried.
_HOST_FAILURES = (
    OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # TargetServerAttributeNotMatched: a standby, for read-write
)
# URL -> the one-host URL to try first: the last that took a connection, or the one after the
# last that failed (or was given up on by the caller: a lease renewal's deadline, say).
_first_host: dict[str, str] = {}


def host_urls(url: str) -> list[str]:
    """One URL per host of a multi-host URL (`postgresql://u:p@h1:5432,h2:5433/db?...`), in
    its order; [url] itself when it names one host, or its hosts in a form not split here."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return [url]
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [url]
    return [
        urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}"))
        for host in hosts.split(",")
    ]


async def open_connection(url: str, *, timeout: float = CONNECT_TIMEOUT_S, **kwargs) -> asyncpg.Connection:
    """asyncpg.connect, with each host of a multi-host URL given `timeout` of its own, as
    libpq's connect_timeout is: asyncpg spends one timeout on all of them, so a primary that
    vanished without a reset (a host powered off) takes it all and the new primary listed
    after it is never tried (MagicStack/asyncpg#1155). The host that answered last is tried
    first, and after a host fails, the next one. Raises asyncpg's own errors for a one-host
    URL, and when every host of several refused us (a wrong password everywhere); otherwise
    NoUsableHost once every host failed: one that refuses us while another may yet become the
    primary is no reason to stop trying."""
    hosts = host_urls(url)
    first = _first_host.get(url)
    if first in hosts:
        at = hosts.index(first)
        hosts = hosts[at:] + hosts[:at]
    failures, refusals = [], []
    for index, host in enumerate(hosts):
        after = hosts[(index + 1) % len(hosts)]
        try:
            conn = await asyncpg.connect(host, timeout=timeout, **kwargs)
        except asyncpg.ClientConfigurationError:
            raise  # the URL's own fault: no other host would do better
        except _HOST_FAILURES as exc:
            _first_host[url] = after
            if len(hosts) == 1 and not isinstance(exc, asyncpg.InternalClientError):
                raise
            failures.append(f"{_host_of(host)}: {_reason(exc)}")
            if isinstance(exc, _REFUSALS):
                refusals.append(exc)
            continue
        except asyncio.CancelledError:
            _first_host[url] = after
            raise
        _first_host[url] = host
        return conn
    if len(refusals) == len(hosts):
        raise refusals[0]
    raise NoUsableHost("; ".join(failures))


def _host_of(url: str) -> str:
    return url.partition("://")[2].partition("/")[0].rpartition("@")[2]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
        return "not the server target_session_attrs asks for (a standby?)"
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__


async def connect(url: str, *, timeout: float = CONNECT_TIMEOUT_S, **kwargs) -> asyncpg.Connection:
    try:
        return await open_connection(url, timeout=timeout, command_timeout=QUERY_TIMEOUT_S, **kwargs)
    except CONNECT_ERRORS as exc:
        raise connect_failed(url, exc) from exc
    except ValueError as exc:  # asyncpg's ClientConfigurationError: an option of the URL it refuses
        raise StartupRefused(
            f"invalid setting ARKVORY_DATABASE_URL: {exc}, got {mask_url(url)!r}"
        ) from None


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset that sends nothing: pooled connections never hold session state (advisory
    locks, LISTEN, SET live on dedicated connections), and asyncpg itself still rolls back a
    transaction left open. The default reset costs a round trip on every release."""


async def create_pool(settings: Settings) -> asyncpg.Pool:
    try:
        return await asyncpg.create_pool(
            settings.database_url,
            connect=open_connection,  # each host of a multi-host URL with its own timeout
            reset=_keep_session,
            min_size=1,
            max_size=settings.database_pool_size,
            timeout=CONNECT_TIMEOUT_S,
            command_timeout=QUERY_TIMEOUT_S,
            max_inactive_connection_lifetime=60.0,
        )
    except CONNECT_ERRORS as exc:
        raise connect_failed(settings.database_url, exc) from exc


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


def _migration_refused(name: str, exc: asyncpg.RaiseError) -> StartupRefused:
    """A migration that RAISEs on purpose (0012: accounts whose names differ only in case) found
    data that an operator must change first: a refusal on one line, with what to do (its HINT),
    not a database failure a restart could cure."""
    text = exc.message + (f"; {exc.hint}" if exc.hint else "")
    # One line in the log whatever the data held (an account name inserted by hand, say).
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return StartupRefused(f"migration {name} cannot be applied: {text}")


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
            try:
                await conn.execute(sql, timeout=60.0)
            except asyncpg.RaiseError as exc:
                raise _migration_refused(name, exc) from None
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
