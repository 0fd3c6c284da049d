"""The writer's task schedule: `cleanup` every ARKVORY_CLEANUP_INTERVAL (default 1h, `off`:
never) and `verify` every ARKVORY_VERIFY_INTERVAL (default off).

Once per period, never twice: period number P = floor(database epoch / interval) (the
DATABASE clock, the same for every process), and the task is dispatched with the idempotency
key `schedule:<kind>:<P>`, unique in the tasks table. A writer restarted within a period, a
second writer racing during a takeover, or a writer whose local clock is off all compute the
same key, and the unique column admits one task. The first dispatch of a period happens as
soon as the writer runs in it (a fresh writer dispatches at start).

Scheduled tasks are created by `schedule`, with `retry` (cleanup: safe to run again from the
start) or `resume` (verify: continues from its checkpoint) as their restart policy. The key is
freed when its task is pruned (ARKVORY_TASK_RETENTION), long after its period ended, unless the
retention is shorter than the interval.

The loop survives the database: an error is retried a second later, and the process logs the
outage once (`arkvory.shared.cluster.supervision.DATABASE`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
import asyncpg

from arkvory.shared.cluster.supervision import DATABASE
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import ApiError, DatabaseUnavailable
from arkvory.shared.process.runtime import Runtime
from arkvory.shared.settings import Settings

from .definition import definition_hash
from .dispatch import Definition, insert_once
from .kinds import Kinds

log = logging.getLogger("arkvory.tasks.schedule")

CREATED_BY = "schedule"
ON_RESTART = {"cleanup": "retry", "verify": "resume"}
RETRY_S = 1.0
MAX_SLEEP_S = 30.0  # re-read the database clock at least this often (it may be set anew)
LOOP = "task schedule"  # as named in the process's database outage lines
_DATABASE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, DatabaseUnavailable)


def intervals(settings: Settings) -> dict[str, int]:
    """kind -> seconds, for the kinds that are scheduled at all."""
    configured = {"cleanup": settings.cleanup_interval_s, "verify": settings.verify_interval_s}
    return {kind: seconds for kind, seconds in configured.items() if seconds > 0}


def schedule_key(kind: str, period: int) -> str:
    return f"schedule:{kind}:{period}"


def scheduled_definition(kind: str, kinds: Kinds) -> Definition:
    params = kinds[kind].validate_params({})
    return Definition(kind, params, ON_RESTART[kind], None, {}, definition_hash(kind, None, params, {}))


async def dispatch_due(conn: asyncpg.Connection, kind: str, interval_s: int, kinds: Kinds) -> tuple[int, float, bool]:
    """Dispatch this period's task of `kind` unless it exists: (period, seconds until the next
    period by the database clock, whether this call created it)."""
    epoch = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8", timeout=POOLED_QUERY_TIMEOUT_S)
    period = int(epoch // interval_s)
    outcome = await insert_once(conn, scheduled_definition(kind, kinds), schedule_key(kind, period), CREATED_BY)
    return period, (period + 1) * interval_s - epoch, not outcome.replayed


class Schedule:
    def __init__(self, runtime: Runtime, kinds: Kinds) -> None:
        self.runtime = runtime
        self.kinds = kinds
        self.intervals = intervals(runtime.settings)
        self.dispatched = 0  # tasks this process created

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.intervals:
            return
        while True:
            try:
                sleep_s = await self.tick()
                DATABASE.succeeded(LOOP)
            except _DATABASE_ERRORS as exc:
                DATABASE.failed(LOOP, exc)
                sleep_s = RETRY_S
            except ApiError as exc:  # a kind refusing its own default params: a bug, not an outage
                log.error("task schedule: cannot dispatch: %s", exc)
                sleep_s = MAX_SLEEP_S
            await asyncio.sleep(sleep_s)

    async def tick(self) -> float:
        """Dispatch what is due; returns how long to sleep until the next period begins."""
        pool = self.runtime.pool
        assert pool is not None
        sleep_s = MAX_SLEEP_S
        async with pooled(pool) as conn:
            for kind, interval_s in self.intervals.items():
                period, left_s, created = await dispatch_due(conn, kind, interval_s, self.kinds)
                if created:
                    self.dispatched += 1
                    log.info("task schedule: dispatched %s for period %d", kind, period)
                sleep_s = min(sleep_s, left_s)
        # A little past the boundary: the database clock must be in the new period when we ask.
        return max(0.05, sleep_s + 0.05)
