"""Running a task kind offline (`arkvory admin gc`, `arkvory admin scrub`): the locks that prove
every server is down, and a TaskContext that prints progress instead of recording events.

The proof is PostgreSQL's advisory locks, not a process list: every gateway holds the
maintenance lock shared on its control connection for as long as it runs, the writer holds the
writer lock, the worker the worker lock (shared/db.py). The tool takes all three, exclusively, on
one dedicated connection; while it holds them no gateway, writer or worker can start either
(each refuses or waits). A lock it cannot take is named with its holders: the slot leases of
`arkvory_gateway_leases` (slot, pid, host) for the processes that hold slots, and the database
backends (`pg_stat_activity`) for the rest. If the lock connection is lost the locks are gone
too, so the run stops at its next batch.

Exit statuses: 0 done; 1 the task failed; 2 usage or settings; 69 database unreachable;
75 refused because a server is up (try again once it is stopped); 78 storage does not match.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TextIO

import asyncpg
from prometheus_client import CollectorRegistry

from arkvory.shared import db
from arkvory.shared.settings import Settings

from ..audit.trail import Entry, record_tool_change

# The admin command that runs each kind offline (shared/cli/offline.py), as the audit names it.
_COMMANDS = {"cleanup": "gc", "verify": "scrub"}
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 75
APPLICATION_NAME = "arkvory-admin-offline"


@dataclass(frozen=True)
class _Lock:
    key: int
    name: str
    who: str  # what kind of process normally holds it


_LOCKS = (
    _Lock(db.MAINTENANCE_LOCK, "the maintenance lock", "gateway"),
    _Lock(db.WRITER_LOCK, "the writer lock", "writer"),
    _Lock(db.WORKER_LOCK, "the worker lock", "worker"),
)

_HOLDERS = """
SELECT l.pid, l.mode, coalesce(a.application_name, '') AS application_name,
       host(a.client_addr) AS client_addr
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
  AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY l.pid
"""
_LIVE_LEASES = """
SELECT slot, pid, host, role FROM arkvory_gateway_leases WHERE expires_at > now() ORDER BY slot
"""


# A worker in standby holds no lock, only a connection named after it (writer/worker/lock.py):
# it would become active once the tool lets the worker lock go, with the settings it started with.
_STANDBY_WORKERS = """
SELECT pid, application_name, host(client_addr) AS client_addr FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'arkvory-worker %' AND pid <> pg_backend_pid()
ORDER BY backend_start
"""


class ServersUp(Exception):
    """A lock is held by a running server; the message names every one found."""


async def take_offline_locks(conn: asyncpg.Connection) -> None:
    """Take every process lock exclusively on `conn` (session locks: they last as long as the
    connection) or raise ServersUp naming who holds them, and any worker waiting in standby;
    nothing is kept on refusal."""
    refused: list[_Lock] = []
    for lock in _LOCKS:
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock.key, timeout=db.QUERY_TIMEOUT_S):
            refused.append(lock)
    lines = await _describe_holders(conn, refused) if refused else []
    active = set()
    if any(lock.key == db.WORKER_LOCK for lock in refused):
        active = {row["pid"] for row in await conn.fetch(_HOLDERS, db.WORKER_LOCK, timeout=db.QUERY_TIMEOUT_S)}
    for standby in await conn.fetch(_STANDBY_WORKERS, timeout=db.QUERY_TIMEOUT_S):
        if standby["pid"] in active:
            continue  # the active worker, named above
        where = f" from {standby['client_addr']}" if standby["client_addr"] else ""
        lines.append(
            f"a worker in standby ({standby['application_name']}, database backend pid {standby['pid']}{where})"
            " would take over when this tool ends"
        )
    if not lines:
        return
    await conn.execute("SELECT pg_advisory_unlock_all()", timeout=db.QUERY_TIMEOUT_S)
    raise ServersUp("\n".join(lines))


async def _describe_holders(conn: asyncpg.Connection, refused: list[_Lock]) -> list[str]:
    leases = [dict(r) for r in await conn.fetch(_LIVE_LEASES, timeout=db.QUERY_TIMEOUT_S)]
    lines = []
    for lock in refused:
        holders = await conn.fetch(_HOLDERS, lock.key, timeout=db.QUERY_TIMEOUT_S)
        role = {"gateway": "reader", "writer": "api"}.get(lock.who)
        named = [lease for lease in leases if lease["role"] == role] if role else []
        for lease in named:
            title = "gateway" if lock.who == "gateway" else "the writer"
            lines.append(
                f"{title} slot {lease['slot']} (pid {lease['pid']} on {lease['host']}) holds {lock.name}"
            )
        for holder in holders[len(named):]:
            title = "a gateway" if lock.who == "gateway" else f"the {lock.who}"
            where = f" from {holder['client_addr']}" if holder["client_addr"] else ""
            app = holder["application_name"] or "no application name"
            lines.append(
                f"{title} ({app}, database backend pid {holder['pid']}{where}) holds {lock.name}"
            )
        if not holders and not named:  # released between our try and our look
            lines.append(f"{lock.name} was held by another process a moment ago")
    return lines


class OfflineContext:
    """The TaskContext of writer/tasks/context.py for a kind run by an admin tool: progress
    lines go to `out`, checkpoints are kept in memory only (an offline run is simply run
    again), no budget applies, and SIGINT/SIGTERM or a lost lock connection ask it to stop."""

    def __init__(
        self, kind: str, params: dict, pool: asyncpg.Pool, storage, settings: Settings,
        *, out: TextIO = sys.stdout,
    ) -> None:
        from arkvory.writer.worker.metrics import WorkerMetrics

        self.task_id = uuid.uuid4()
        self.kind = kind
        self.params = params
        self.resumed_from: dict[str, Any] | None = None
        self.pool = pool
        self.storage = storage
        self.settings = settings
        self.metrics = WorkerMetrics(CollectorRegistry())
        self.usage = {"items": 0, "bytes": 0, "cost_units": 0}
        self.state: dict[str, Any] | None = None
        self.stop_reason: str | None = None
        self._out = out
        self._started = time.monotonic()

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self._print(f"stopping: {reason}")

    def cancel_requested(self) -> bool:
        return self.stop_reason is not None

    def budget_left(self) -> dict[str, int]:
        return {}  # no budget applies offline

    def require_budget(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> None:
        return None

    @contextlib.asynccontextmanager
    async def reserving(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> AsyncIterator[None]:
        yield  # nothing to keep across a crash: an offline run is simply run again

    async def progress(
        self, *, items: int = 0, bytes: int = 0, cost_units: int = 0,
        message: str | None = None, data: dict[str, Any] | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> None:
        self.usage["items"] += items
        self.usage["bytes"] += bytes
        self.usage["cost_units"] += cost_units
        if message:
            self._print(message)
        self._raise_if_stopped()

    async def checkpoint(self, state: dict[str, Any]) -> None:
        self.state = state
        self._raise_if_stopped()

    def _raise_if_stopped(self) -> None:
        if self.stop_reason is not None:
            from arkvory.writer.tasks.context import TaskCancelled

            raise TaskCancelled(self.stop_reason)

    def _print(self, line: str) -> None:
        print(f"[{time.monotonic() - self._started:7.1f}s] {self.kind}: {line}", file=self._out, flush=True)


async def run_offline(
    kind: ModuleType, kind_name: str, params: dict, settings: Settings, *, out: TextIO = sys.stdout,
) -> int:
    """Take the locks, check the storage, run `kind` with an OfflineContext; an exit status."""
    from arkvory.shared.errors import StartupError
    from arkvory.shared.storage import open_storage
    from arkvory.writer.tasks.context import TaskCancelled

    try:
        lock_conn = await db.connect(
            settings.database_url, server_settings={"application_name": APPLICATION_NAME}
        )
    except StartupError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status
    pool = None
    closing = False
    try:
        try:
            await take_offline_locks(lock_conn)
        except ServersUp as exc:
            print(f"arkvory: refusing to run {kind_name} while servers are up:\n{exc}\n"
                  "stop them (every gateway, the writer and every worker, standby ones too) and run it again",
                  file=sys.stderr)
            return EXIT_REFUSED
        try:
            storage = await open_storage(lock_conn, settings, who="an offline tool")
        except StartupError as exc:
            print(f"arkvory: {exc}", file=sys.stderr)
            return exc.exit_status
        pool = await asyncpg.create_pool(
            settings.database_url, connect=db.open_connection, min_size=1, max_size=2,
            command_timeout=db.QUERY_TIMEOUT_S,
            server_settings={"application_name": APPLICATION_NAME},
        )
        ctx = OfflineContext(kind_name, params, pool, storage, settings, out=out)
        lock_conn.add_termination_listener(
            lambda _conn: None if closing else ctx.stop("the lock connection was lost")
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, ctx.stop, f"signal {signal.Signals(signum).name}")
        ctx._print(f"started with params {json.dumps(params, sort_keys=True)}")
        try:
            result = await kind.run(ctx)
        except TaskCancelled as exc:
            print(f"arkvory: {kind_name} stopped before the end: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            print(f"arkvory: {kind_name} failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        ctx._print("done")
        print(json.dumps({"kind": kind_name, "result": result, "usage": ctx.usage}, sort_keys=True), file=out)
        async with db.pooled(pool) as conn:
            await record_tool_change(conn, f"arkvory admin {_COMMANDS[kind_name]}", Entry(
                f"maintenance.{_COMMANDS[kind_name]}", details={"params": params, "result": result}))
        return EXIT_OK
    finally:
        closing = True
        if pool is not None:
            await pool.close()
        await lock_conn.close(timeout=db.QUERY_TIMEOUT_S)
