"""The writer's task metrics (SPEC §8, issue 8 item 9): tasks by kind and status and the age of
the oldest queued task, read from the database every REFRESH_S by a supervised loop (a scrape
never queries the database), and the live event streams of this writer.

The same round reads what only the database knows of the installation (issue 15 §2): how many
slot leases are live (fewer than the policy's slots = a process is missing) and whether any
worker holds the worker lock (a worker that is down cannot say so itself).

A refresh that fails (database down) keeps the last values; the process logs the outage once
(`arkvory.shared.cluster.supervision.DATABASE`).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import asyncpg
from prometheus_client import CollectorRegistry, Gauge

from arkvory.shared import db
from arkvory.shared.cluster.supervision import read_every
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S

from .kinds import KIND_NAMES
from .store import STATUSES
from .stream import TaskEventHub

log = logging.getLogger("arkvory.tasks.metrics")

REFRESH_S = 5.0
LOOP = "task metrics"  # as named in the process's database outage lines

# pg_locks lists every database's locks: only a worker of this database counts. The holder's
# backend pid lets the console tell the active worker's session from standby ones.
_INSTALLATION = """
WITH holder AS (
    SELECT pid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid
)
SELECT (SELECT count(*) FROM arkvory_gateway_leases WHERE expires_at > now()) AS leases_live,
       EXISTS (SELECT 1 FROM holder) AS worker_lock_held,
       (SELECT pid FROM holder LIMIT 1) AS worker_lock_pid
"""


async def installation_state(conn: asyncpg.Connection) -> asyncpg.Record:
    """What only the database knows of the installation: `leases_live` (reservations not yet
    expired), `worker_lock_held` (an active worker) and `worker_lock_pid` (its lock backend)."""
    return await conn.fetchrow(_INSTALLATION, db.WORKER_LOCK, timeout=POOLED_QUERY_TIMEOUT_S)


class TaskMetrics:
    def __init__(self, registry: CollectorRegistry, hub: TaskEventHub | None = None) -> None:
        self.tasks = Gauge(
            "arkvory_tasks", "Tasks in the database by kind and status", ["kind", "status"], registry=registry
        )
        self.oldest_queued = Gauge(
            "arkvory_task_oldest_queued_seconds",
            "Age of the oldest queued task (0 when none waits)",
            registry=registry,
        )
        self.streams = Gauge(
            "arkvory_task_event_streams", "Task event streams open on this writer", registry=registry
        )
        self.leases_live = Gauge(
            "arkvory_gateway_leases_live",
            "Slot leases whose reservation has not expired by the database clock, the writer's included",
            registry=registry,
        )
        self.worker_lock_held = Gauge(
            "arkvory_worker_lock_held",
            "1 while some worker holds this database's worker lock (an active worker), else 0",
            registry=registry,
        )
        if hub is not None:
            self.streams.set_function(lambda: hub.active)
        self.refreshed = False
        # Every known combination is exported (as 0 until seen), so a dashboard's series exist.
        for kind in KIND_NAMES:
            for status in STATUSES:
                self.tasks.labels(kind=kind, status=status).set(0)

    async def refresh(self, conn: asyncpg.Connection) -> None:
        rows = await conn.fetch(
            "SELECT kind, status, count(*) AS n FROM arkvory_tasks GROUP BY kind, status", timeout=POOLED_QUERY_TIMEOUT_S
        )
        oldest = await conn.fetchval(
            "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8"
            " FROM arkvory_tasks WHERE status = 'queued'",
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        installation = await installation_state(conn)
        counts = {(row["kind"], row["status"]): row["n"] for row in rows}
        for kind in set(KIND_NAMES) | {kind for kind, _ in counts}:
            for status in STATUSES:
                self.tasks.labels(kind=kind, status=status).set(counts.get((kind, status), 0))
        self.oldest_queued.set(max(0.0, oldest))
        self.leases_live.set(installation["leases_live"])
        self.worker_lock_held.set(1 if installation["worker_lock_held"] else 0)
        self.refreshed = True

    async def run(self, pool_of: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Refresh every REFRESH_S from a pool connection (`pool_of()` gives the pool), the
        first time before `started()`; a refresh that fails keeps the last values."""
        await read_every(REFRESH_S, LOOP, pool_of, self.refresh, task_status=task_status)
