"""The worker lock (SPEC §8): one active worker per database, held on a dedicated connection.

A session advisory lock lives exactly as long as its backend, so the connection is never
pooled, is pinged every 2 s under a timeout (a half-open connection answers nothing), and its
loss is noticed at once when the server closes it (asyncpg's termination listener). The same
connection LISTENs on `arkvory_tasks`: the wake-ups are worth exactly as much as the lock, and
both end together.

Each time the lock is taken is a new *activation* with a fresh holder id: the worker fences
every task write with it (writer/tasks/store.py `Fence`), so an activation that lost the lock
can never again write a task that the next activation recovered. A worker that finds the lock
taken waits in standby, says so once (naming the active worker from `pg_stat_activity`), and
tries again every 2 s; a killed worker's connection closes with it, so the lock frees at once.
Database trouble is reported to `arkvory.shared.cluster.supervision.DATABASE`: one line per
outage, not per retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import socket
import uuid
from collections.abc import Callable

import asyncpg

from arkvory.shared import db
from arkvory.shared.cluster.supervision import DATABASE
from arkvory.shared.errors import DatabaseUnavailable
from arkvory.writer.tasks.store import Fence

log = logging.getLogger("arkvory.worker.lock")

CHANNEL = "arkvory_tasks"
PING_EVERY_S = 2.0
PING_TIMEOUT_S = 1.5
RETRY_EVERY_S = 2.0
CLOSE_TIMEOUT_S = 2.0
LOOP = "worker lock"  # as named in the process's database outage lines
_CONNECTION_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, DatabaseUnavailable)

_HOLDER = """
SELECT l.pid, a.application_name, a.client_addr::text AS client_addr, a.backend_start
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""

# (task id, event type) of every task event committed in the database.
OnTaskEvent = Callable[[uuid.UUID, str], None]


@dataclasses.dataclass(frozen=True)
class Activation:
    """One tenure as the active worker: the fence for its writes, when it began (the
    database's clock) and the database snapshot at that moment (`pg_current_snapshot()` as
    text): the transactions committed before the activation began, which bounds what restart
    recovery looks at (a commit is ordered against it, a start time is not)."""

    fence: Fence
    began_at: datetime.datetime
    snapshot: str


def application_name() -> str:
    # What a standby worker (and an operator's pg_stat_activity) sees of the active one.
    return f"arkvory-worker {socket.gethostname()} pid {os.getpid()}"[:63]


def parse_notification(payload: str) -> tuple[uuid.UUID, str] | None:
    """'<task id> <seq> <type>' (migration 0007's trigger); None for anything else."""
    parts = payload.split(" ")
    if len(parts) != 3 or len(payload) > 200:
        return None
    try:
        return uuid.UUID(parts[0]), parts[2]
    except ValueError:
        return None


class WorkerLock:
    def __init__(self, database_url: str, on_task_event: OnTaskEvent) -> None:
        self.database_url = database_url
        self.on_task_event = on_task_event
        self.application_name = application_name()
        self._conn: asyncpg.Connection | None = None
        self._gone = asyncio.Event()
        self._previous_backend: int | None = None
        # The lock was found taken by another worker since the last activation.
        self.standing_by = False

    async def acquire(self) -> Activation:
        """Wait in standby until this process holds the worker lock; then LISTEN and return
        the new activation. Database trouble is retried every 2 s."""
        said_standby = False
        while True:
            try:
                conn = await self._connection()
                taken = await conn.fetchval("SELECT pg_try_advisory_lock($1)", db.WORKER_LOCK, timeout=db.QUERY_TIMEOUT_S)
                DATABASE.succeeded(LOOP)
                if taken:
                    activation = await self._activate(conn)
                    self.standing_by = False
                    return activation
                holder = await conn.fetchrow(_HOLDER, db.WORKER_LOCK, timeout=db.QUERY_TIMEOUT_S)
                if holder is not None and holder["pid"] == self._previous_backend:
                    # Our own old backend, cut off but not yet noticed by the server.
                    log.info("ending our previous lock connection (backend %d), which the server still keeps", holder["pid"])
                    await conn.execute("SELECT pg_terminate_backend($1)", holder["pid"], timeout=db.QUERY_TIMEOUT_S)
                    await asyncio.sleep(0.1)
                    continue
                self.standing_by = True
                if not said_standby:
                    said_standby = True
                    log.info(
                        "standby: another worker is active (%s); only one worker runs tasks per "
                        "database, trying again every %.0f s",
                        _describe(holder),
                        RETRY_EVERY_S,
                    )
            except _CONNECTION_ERRORS as exc:
                DATABASE.failed(LOOP, exc)  # one line per outage for the process
                self._drop()
            await asyncio.sleep(RETRY_EVERY_S)

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await db.connect(
                self.database_url, server_settings={"application_name": self.application_name}
            )
            self._gone.clear()
            self._conn.add_termination_listener(self._on_terminated)
        return self._conn

    async def _activate(self, conn: asyncpg.Connection) -> Activation:
        await conn.add_listener(CHANNEL, self._on_notification)
        began = await conn.fetchrow(
            "SELECT now() AS at, pg_current_snapshot()::text AS snapshot", timeout=db.QUERY_TIMEOUT_S
        )
        fence = Fence(holder=str(uuid.uuid4()), lock_pid=conn.get_server_pid(), lock_key=db.WORKER_LOCK)
        self._previous_backend = fence.lock_pid
        log.info("worker lock taken: this worker is active (activation %s)", fence.holder)
        return Activation(fence, began["at"], began["snapshot"])

    async def wait_lost(self) -> str:
        """Return (with the reason) once the lock can no longer be trusted."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._gone.wait(), PING_EVERY_S)
            conn = self._conn
            if self._gone.is_set() or conn is None or conn.is_closed():
                return "the lock connection closed"
            try:
                await conn.fetchval("SELECT 1", timeout=PING_TIMEOUT_S)
            except TimeoutError as exc:
                DATABASE.failed(LOOP, exc)
                return f"the lock connection did not answer a ping within {PING_TIMEOUT_S} s"
            except _CONNECTION_ERRORS as exc:
                DATABASE.failed(LOOP, exc)
                return f"ping failed: {exc.__class__.__name__}: {exc}"

    def drop(self) -> None:
        """After a loss: forget the connection without waiting on it (the server frees the
        lock when it notices; `acquire` ends our old backend if it still holds it)."""
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.remove_termination_listener(self._on_terminated)
        conn.terminate()

    async def release(self) -> None:
        """Planned stop: closing the connection frees the lock for a standby worker at once."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.remove_termination_listener(self._on_terminated)
        try:
            await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT_S)
        except _CONNECTION_ERRORS:
            conn.terminate()
        except asyncio.CancelledError:
            conn.terminate()
            raise

    def _on_terminated(self, conn: object) -> None:
        self._gone.set()

    def _on_notification(self, conn: object, pid: int, channel: str, payload: str) -> None:
        parsed = parse_notification(payload)
        if parsed is not None:
            self.on_task_event(*parsed)


def _describe(holder: asyncpg.Record | None) -> str:
    if holder is None:
        return "it just released the lock"
    name = holder["application_name"] or "an unnamed session"
    where = f" from {holder['client_addr']}" if holder["client_addr"] else ""
    return f"{name}{where}, database backend {holder['pid']}"
