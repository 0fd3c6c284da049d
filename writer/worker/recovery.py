"""Restart recovery (SPEC §7): on becoming active, the worker applies each unfinished task's
`on_restart` policy, exactly as the table says:

    found        fail                 retry                resume
    queued       failed               queued (no event)    queued (no event)
    loading      failed               queued               queued
    running      failed               queued               running, from its last checkpoint
    cancelling   cancelled            cancelled            cancelled

A task moved to `failed` gets code `server_restarted` and a `task.failed` event, one moved to
`queued` a `task.queued` event, one moved to `cancelled` a `task.cancelled` event; a `resume`
task found running stays running, adopted by this activation, with a `task.running` event
`{"resumed": true}`. Each move is one conditional transaction (store.transition): if a cancel
lands between our read and our move, the move is refused and the task is read again.

Attempts: a task that would run again (queued again, or adopted) after it already started
`max_attempts` runs is failed instead, with code `attempts_exhausted`: a task that crashes the
worker is not run forever. A run stopped by a planned stop (SIGTERM) gave its attempt back.

What "found" means: a task a worker moved out of `queued` (loading, running, cancelling: some
earlier activation left it), or a queued task whose dispatching transaction had committed when
this activation began (store.py `unfinished_tasks`, by the activation's snapshot, not by a
clock). A dispatch whose transaction began before the activation and committed after it is a
fresh task, simply claimed. Finished tasks (a budget already exceeded) are never touched, so
they are never retried.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import asyncpg

from arkvory.shared import db
from arkvory.writer.tasks import store

from .lock import Activation
from .metrics import WorkerMetrics

log = logging.getLogger("arkvory.worker.recovery")

RESTARTED_CODE = "server_restarted"
RESTARTED_MESSAGE = "the worker restarted while the task was unfinished, and its policy is on_restart=fail"
EXHAUSTED_CODE = "attempts_exhausted"
# How often one task is re-read when a concurrent change refused our move (a cancel, twice).
_ATTEMPTS_PER_TASK = 5


def planned_move(status: str, on_restart: str, *, attempts_left: bool = True) -> tuple[str, str] | None:
    """(new status, event) for a task found in `status`; None when it stays as it is.
    A `resume` task found running also gets ("running", "task.running"): it is adopted.
    Without `attempts_left`, a move that would run the task again fails it instead."""
    if status == "cancelling":
        return "cancelled", "task.cancelled"
    if on_restart == "fail":
        return "failed", "task.failed"
    if status == "queued":
        return None
    if not attempts_left:
        return "failed", "task.failed"
    if status == "running" and on_restart == "resume":
        return "running", "task.running"
    return "queued", "task.queued"


async def recover(conn: asyncpg.Connection, activation: Activation, metrics: WorkerMetrics) -> list[dict[str, Any]]:
    """Apply the table to every left-over task; returns the `resume` tasks this activation now
    runs again from their checkpoints."""
    adopted = []
    for found in await store.unfinished_tasks(conn, activation.snapshot):
        task = await _recover_one(conn, found["id"], activation, metrics)
        if task is not None:
            adopted.append(task)
    if adopted:
        log.info("resuming %d task(s) from their last checkpoint", len(adopted))
    return adopted


async def _recover_one(
    conn: asyncpg.Connection, task_id: uuid.UUID, activation: Activation, metrics: WorkerMetrics
) -> dict[str, Any] | None:
    for _ in range(_ATTEMPTS_PER_TASK):
        row = await conn.fetchrow(
            "SELECT status, on_restart, attempts, max_attempts FROM arkvory_tasks WHERE id = $1",
            task_id,
            timeout=db.QUERY_TIMEOUT_S,
        )
        if row is None or row["status"] in store.FINISHED:
            return None
        attempts_left = row["attempts"] < row["max_attempts"]
        move = planned_move(row["status"], row["on_restart"], attempts_left=attempts_left)
        if move is None:
            return None
        to, event = move
        error = _error(row) if to == "failed" else None
        moved = await store.transition(
            conn, task_id, allowed_from=[row["status"]], to=to, event=event,
            data=_event_data(row["status"], to, error), fields=_fields(to, activation, row["attempts"], error),
        )
        if moved is not None:
            metrics.recovered.labels(to="resumed" if to == "running" else to).inc()
            log.info(
                "task %s (on_restart=%s, attempt %d of %d) found %s: now %s%s",
                task_id, row["on_restart"], row["attempts"], row["max_attempts"], row["status"], to,
                f" ({error['error_code']})" if error else "",
            )
            return moved if to == "running" else None
    log.warning("task %s kept changing while recovering it; left as it is", task_id)
    return None


def _error(row: asyncpg.Record) -> dict[str, str]:
    if row["on_restart"] == "fail":
        return {"error_code": RESTARTED_CODE, "error_message": RESTARTED_MESSAGE}
    return {
        "error_code": EXHAUSTED_CODE,
        "error_message": f"the task started {row['attempts']} run(s) and the worker stopped or lost its "
        f"lock during each; max_attempts is {row['max_attempts']}, so it is not run again",
    }


def _event_data(found: str, to: str, error: dict[str, str] | None) -> dict[str, Any]:
    data: dict[str, Any] = {"recovered_from": found}
    if error is not None:
        data |= error
    if to == "running":
        data["resumed"] = True
    return data


def _fields(to: str, activation: Activation, attempts: int, error: dict[str, str] | None) -> dict[str, Any]:
    if error is not None:
        return dict(error)
    if to == "queued":
        return {"worker": None, "heartbeat_at": None}
    if to == "running":
        # Adopted: this activation's fence from now on (the old holder's writes are refused).
        return {"worker": activation.fence.holder, "attempts": attempts + 1, "heartbeat_at": activation.began_at}
    return {}
