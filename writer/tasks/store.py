"""The task store: every status change of a task and its event in one transaction (SPEC §7).

Event numbers come from the task row itself: the UPDATE that changes the status (or records
progress) also bumps `last_event`, and the event takes that number. The row lock the UPDATE
holds until commit serializes concurrent writers of one task, so the numbers are 1, 2, 3...
with no gap and no duplicate. A transition is conditional on the status found (`WHERE status
= ANY(...)`): two racing transitions (cancel and complete) cannot both win.

JSON columns travel as text (no codec is registered on the pool); `decode` turns a row into a
plain dict with them parsed.

The worker's writes are *fenced* (`Fence`): a write about a task it claimed lands only while the
task still names this worker activation as its `worker` and the activation's lock connection
still holds the worker lock, checked inside the writing statement. A worker that lost its lock
(and whose tasks another activation recovered) can therefore never complete, fail, checkpoint
or advance a task again, however late its statements arrive: the recovering activation's own
UPDATE waits for the row lock of any such statement in flight, and sees its outcome.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg

UNFINISHED = ("queued", "loading", "running", "cancelling")
FINISHED = ("completed", "failed", "cancelled")
STATUSES = UNFINISHED + FINISHED

# Runs a task may start (each claim or adoption is one) unless its dispatch says otherwise; the
# bound keeps a task that crashes the worker from being run again and again (SPEC §7, issue 13).
DEFAULT_MAX_ATTEMPTS = 3
MAX_ATTEMPTS = 10

_JSON_COLUMNS = ("params", "budget", "usage", "checkpoint", "checkpoint_usage", "result")
# Columns a transition may set besides the status; fixed names, never from input.
_SETTABLE = frozenset(
    {
        "checkpoint", "checkpoint_usage", "result", "error_code", "error_message", "worker",
        "heartbeat_at", "started_at", "attempts", "usage",
    }
)


@dataclasses.dataclass(frozen=True)
class Fence:
    """Who may write a claimed task: the worker activation `holder` (a fresh id each time a
    worker takes the worker lock), as long as its lock connection (backend `lock_pid`) holds
    the lock at the moment of the write."""

    holder: str
    lock_pid: int
    lock_key: int


def _lock_held(pid_arg: int, key_arg: int) -> str:
    """SQL: the backend `$pid_arg` holds the session advisory lock `$key_arg` right now."""
    return f"""EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                          AND objsubid = 1 AND pid = ${pid_arg}
                          AND classid = (${key_arg}::bigint >> 32)::oid
                          AND objid = (${key_arg}::bigint & 4294967295)::oid)"""


def _fence_clause(fence: Fence | None, first_arg: int) -> tuple[str, list[Any]]:
    if fence is None:
        return "", []
    clause = f"\n              AND worker = ${first_arg} AND {_lock_held(first_arg + 1, first_arg + 2)}"
    return clause, [fence.holder, fence.lock_pid, fence.lock_key]


def encode_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), sort_keys=True)


def decode(row: asyncpg.Record | None) -> dict[str, Any] | None:
    """A task row as a dict, with its JSON columns parsed."""
    if row is None:
        return None
    task = dict(row)
    for column in _JSON_COLUMNS:
        if isinstance(task.get(column), str):
            task[column] = json.loads(task[column])
    return task


async def insert_task(
    conn: asyncpg.Connection,
    *,
    kind: str,
    params: Mapping[str, Any],
    on_restart: str,
    definition_version: str | None,
    definition_hash: str,
    budget: Mapping[str, Any],
    idempotency_key: str | None,
    created_by: str | None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> dict[str, Any]:
    """A new `queued` task with its `task.queued` event (number 1), in the caller's
    transaction, so the task is committed, with its event, before anyone answers 202.
    `dispatch_xact` (the column's default) records this transaction for restart recovery."""
    assert conn.is_in_transaction(), "insert_task must run inside a transaction"
    task_id = uuid.uuid4()
    row = await conn.fetchrow(
        """
        INSERT INTO arkvory_tasks (id, kind, params, on_restart, definition_version,
            definition_hash, budget, idempotency_key, created_by, max_attempts, status, last_event)
        VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7::jsonb, $8, $9, $10, 'queued', 1)
        RETURNING *
        """,
        task_id, kind, encode_json(dict(params)), on_restart, definition_version,
        definition_hash, encode_json(dict(budget)), idempotency_key, created_by, max_attempts,
    )
    await _insert_event(conn, task_id, 1, "task.queued", {"status": "queued"})
    return decode(row)


async def transition(
    conn: asyncpg.Connection,
    task_id: uuid.UUID,
    *,
    allowed_from: Iterable[str],
    to: str,
    event: str,
    data: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
    fence: Fence | None = None,
) -> dict[str, Any] | None:
    """Move the task from one of `allowed_from` to `to` and append `event`, in one transaction.

    None when the task is not in an allowed status: another transition won, and nothing was
    written. `fields` sets other columns in the same UPDATE (JSON ones are encoded here).
    With `fence`, also None when the task is no longer this worker activation's."""
    assert to in STATUSES, to
    sets, args = _set_clause(fields or {}, first_arg=4)
    fenced, fence_args = _fence_clause(fence, first_arg=4 + len(args))
    async with conn.transaction():
        row = await conn.fetchrow(
            f"""
            UPDATE arkvory_tasks
            SET status = $2, last_event = last_event + 1, updated_at = now(),
                finished_at = CASE WHEN $2 = ANY('{{completed,failed,cancelled}}'::text[])
                                   THEN now() ELSE NULL END{sets}
            WHERE id = $1 AND status = ANY($3::text[]){fenced}
            RETURNING *
            """,
            task_id, to, list(allowed_from), *args, *fence_args,
        )
        if row is None:
            return None
        event_data = {"status": to, **(data or {})}
        await _insert_event(conn, task_id, row["last_event"], event, event_data)
    return decode(row)


async def append_event(
    conn: asyncpg.Connection,
    task_id: uuid.UUID,
    event: str,
    data: Mapping[str, Any] | None = None,
    *,
    only_in: Iterable[str] = UNFINISHED,
    fields: Mapping[str, Any] | None = None,
    fence: Fence | None = None,
) -> dict[str, Any] | None:
    """An event that changes no status (`task.progress`, `task.checkpoint`), with optional
    column updates in the same transaction; None when the task is no longer in `only_in`
    (or, with `fence`, no longer this worker activation's)."""
    sets, args = _set_clause(fields or {}, first_arg=3)
    fenced, fence_args = _fence_clause(fence, first_arg=3 + len(args))
    async with conn.transaction():
        row = await conn.fetchrow(
            f"""
            UPDATE arkvory_tasks SET last_event = last_event + 1, updated_at = now(){sets}
            WHERE id = $1 AND status = ANY($2::text[]){fenced}
            RETURNING *
            """,
            task_id, list(only_in), *args, *fence_args,
        )
        if row is None:
            return None
        await _insert_event(conn, task_id, row["last_event"], event, dict(data or {}))
    return decode(row)


async def fetch_task(conn: asyncpg.Connection | asyncpg.Pool, task_id: uuid.UUID) -> dict[str, Any] | None:
    return decode(await conn.fetchrow("SELECT * FROM arkvory_tasks WHERE id = $1", task_id))


async def fetch_events(
    conn: asyncpg.Connection | asyncpg.Pool, task_id: uuid.UUID, after: int = 0, limit: int = 1000
) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT seq, type, data, created_at FROM arkvory_task_events"
        " WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        task_id, after, limit,
    )
    return [
        {"seq": r["seq"], "type": r["type"], "data": json.loads(r["data"]), "created_at": r["created_at"]}
        for r in rows
    ]


# -- the worker's own statements ------------------------------------------------------------


async def claim_next(
    conn: asyncpg.Connection, fence: Fence, *, skip_kinds: Iterable[str] = ()
) -> dict[str, Any] | None:
    """Claim the oldest queued task whose kind is not in `skip_kinds`: queued -> loading with
    its `task.loading` event, one attempt more, `worker` = the fence's holder; None when there
    is none (or the lock is no longer held). SKIP LOCKED: a task another transaction is
    moving (a cancel) is passed over, never waited for."""
    async with conn.transaction():
        row = await conn.fetchrow(
            f"""
            WITH next AS (
                SELECT id FROM arkvory_tasks
                WHERE status = 'queued' AND NOT (kind = ANY($2::text[]))
                ORDER BY created_at, id
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            )
            UPDATE arkvory_tasks t
            SET status = 'loading', last_event = t.last_event + 1, updated_at = now(),
                attempts = t.attempts + 1, worker = $1, heartbeat_at = now()
            FROM next
            WHERE t.id = next.id AND {_lock_held(3, 4)}
            RETURNING t.*
            """,
            fence.holder, list(skip_kinds), fence.lock_pid, fence.lock_key,
        )
        if row is None:
            return None
        await _insert_event(conn, row["id"], row["last_event"], "task.loading", {"status": "loading"})
    return decode(row)


async def start_running(conn: asyncpg.Connection, task_id: uuid.UUID, fence: Fence) -> dict[str, Any] | None:
    """loading -> running with its `task.running` event and `started_at` (the database's clock,
    kept from the first run); None when the task was cancelled meanwhile or is not ours."""
    fenced, fence_args = _fence_clause(fence, first_arg=2)
    async with conn.transaction():
        row = await conn.fetchrow(
            f"""
            UPDATE arkvory_tasks
            SET status = 'running', last_event = last_event + 1, updated_at = now(),
                started_at = coalesce(started_at, now()), heartbeat_at = now()
            WHERE id = $1 AND status = 'loading'{fenced}
            RETURNING *
            """,
            task_id, *fence_args,
        )
        if row is None:
            return None
        await _insert_event(conn, task_id, row["last_event"], "task.running", {"status": "running"})
    return decode(row)


async def heartbeat(
    conn: asyncpg.Connection, task_id: uuid.UUID, fence: Fence, usage: Mapping[str, int]
) -> str | None:
    """Mark a task this activation runs as alive and save its usage so far; returns its status
    (`cancelling` tells the worker to stop it), or None when the task is no longer ours."""
    return await conn.fetchval(
        f"""
        UPDATE arkvory_tasks SET heartbeat_at = now(), usage = $2::jsonb
        WHERE id = $1 AND status = ANY('{{running,cancelling}}'::text[])
              AND worker = $3 AND {_lock_held(4, 5)}
        RETURNING status
        """,
        task_id, encode_json(dict(usage)), fence.holder, fence.lock_pid, fence.lock_key,
    )


async def record_usage(
    conn: asyncpg.Connection, task_id: uuid.UUID, usage: Mapping[str, int], fence: Fence
) -> str | None:
    """Save the usage of a task this activation runs, with no event (progress between two
    coalesced events); in the caller's transaction when it has one. Returns the status, or
    None when the task is no longer `running` under this activation (cancelled, or not ours)."""
    return await conn.fetchval(
        f"""
        UPDATE arkvory_tasks SET usage = $2::jsonb
        WHERE id = $1 AND status = 'running' AND worker = $3 AND {_lock_held(4, 5)}
        RETURNING status
        """,
        task_id, encode_json(dict(usage)), fence.holder, fence.lock_pid, fence.lock_key,
    )


async def planned_stop(
    conn: asyncpg.Connection, task_id: uuid.UUID, fence: Fence, usage: Mapping[str, int]
) -> str | None:
    """A run this activation stopped for a planned stop (SIGTERM): save its usage and give its
    attempt back (the run did not end in a crash, so it does not count against
    `max_attempts`). Returns the status, or None when the task is no longer ours."""
    return await conn.fetchval(
        f"""
        UPDATE arkvory_tasks SET heartbeat_at = now(), usage = $2::jsonb, attempts = greatest(attempts - 1, 0)
        WHERE id = $1 AND status = ANY('{{running,cancelling}}'::text[])
              AND worker = $3 AND {_lock_held(4, 5)}
        RETURNING status
        """,
        task_id, encode_json(dict(usage)), fence.holder, fence.lock_pid, fence.lock_key,
    )


# A task is left over for an activation when a worker moved it (only a worker takes a task out
# of `queued`, and this activation has not claimed anything yet), or when it is queued and the
# transaction that dispatched it had committed when the activation began (`pg_snapshot`). A
# dispatch whose transaction began before the activation and committed after it is not.
_LEFT_OVER = """
SELECT id, kind, status, on_restart FROM arkvory_tasks
WHERE status = ANY($1::text[])
  AND (status <> 'queued' OR pg_visible_in_snapshot(dispatch_xact, $2::text::pg_snapshot))
ORDER BY created_at, id
"""


async def unfinished_tasks(conn: asyncpg.Connection, snapshot: str) -> list[dict[str, Any]]:
    """Every unfinished task left over for an activation that began at `snapshot` (the text
    of `pg_current_snapshot()`): the restart table's input."""
    rows = await conn.fetch(_LEFT_OVER, list(UNFINISHED), snapshot)
    return [dict(row) for row in rows]


async def _insert_event(
    conn: asyncpg.Connection, task_id: uuid.UUID, seq: int, event: str, data: Mapping[str, Any]
) -> None:
    await conn.execute(
        "INSERT INTO arkvory_task_events (task_id, seq, type, data) VALUES ($1, $2, $3, $4::jsonb)",
        task_id, seq, event, encode_json(dict(data)),
    )


def _set_clause(fields: Mapping[str, Any], *, first_arg: int) -> tuple[str, list[Any]]:
    parts, args = [], []
    for number, (column, value) in enumerate(fields.items(), start=first_arg):
        if column not in _SETTABLE:
            raise ValueError(f"a transition cannot set {column!r}")
        cast = "::jsonb" if column in _JSON_COLUMNS else ""
        parts.append(f", {column} = ${number}{cast}")
        args.append(encode_json(value) if column in _JSON_COLUMNS else value)
    return "".join(parts), args
