"""The worker's side of the task contract (writer/tasks/context.py `TaskContext`): what a running
kind sees, with exact budgets, coalesced progress events and fenced checkpoints.

Usage is counted in memory on every call and checked against every limit at once, so a budget
trips on the very call that exceeds it (or, asked first with `require_budget`, before the step
that would). Progress events are coalesced to at most one per `PROGRESS_EVENT_EVERY_S` (each
carries the usage so far). A checkpoint is always written at once, with its event and the usage
as of it (`checkpoint_usage`), in one transaction. Every write is fenced with the activation's
holder (store.py `Fence`): when one is refused, the task was cancelled or is no longer ours,
and the kind is stopped.

A crash must not give budget back (a retry continues from the usage on record), so the usage of
a limited counter is on record no later than the work it counts is done, three ways:

- work in a transaction of the kind's own reports with `progress(conn=...)` inside it: the usage
  is written in that transaction and commits (or rolls back) with the work (cleanup's removals);
- work outside any transaction is reserved first (`reserving`): the reservation is written
  before the work starts, and the step's `progress` calls take from it without a write (verify
  reserves each group of blobs before it reads them); what a step did not use is given back in
  memory, and the database keeps the larger figure until the next write;
- any other `progress` whose limited usage no reservation covers is written before it returns.

So a crash leaves on record at least the work done: exactly it for the first way, at most one
step's unused reservation more for the second. The heartbeat writes the same figure (counted
plus reserved), and the task's end what was counted.

Usage belongs to the task, not to one run (`usage_to_continue_from`): a run starts from the
usage recorded so far, except a `resume` run of a kind that does again what it did after its
checkpoint (verify re-hashes those blobs), which starts from the checkpoint's usage, as its
work does.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage
from arkvory.writer.tasks import store
from arkvory.writer.tasks.budgets import LIMITS, budget_left, empty_usage, exceeded, exceeded_by
from arkvory.writer.tasks.context import BudgetExceeded, TaskCancelled
from arkvory.writer.tasks.store import Fence

from .metrics import WorkerMetrics

log = logging.getLogger("arkvory.worker.task")

PROGRESS_EVENT_EVERY_S = 0.5
POOL_TIMEOUT_S = 10.0
LIMITS_BY_COUNTER = {counter: limit for limit, counter in LIMITS.items()}
_DATABASE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)

# Why a running task is asked to stop, weakest first: a later, stronger reason replaces it.
# drain: SIGTERM (left for restart recovery); cancel: cancelled by a user (ends `cancelled`);
# gone: the task is no longer this activation's (taken over, or the lock was lost): write nothing.
STOP_REASONS = ("drain", "cancel", "gone")


def usage_to_continue_from(task: dict[str, Any], repeats_work: bool) -> dict[str, int]:
    """The usage a new run of `task` starts from. A retry does not reset it: the budget bounds
    the task, whatever its runs cost (a crash must not buy a fresh budget). A `resume` run
    continues from its checkpoint; when its kind does again the work done after the checkpoint
    (`repeats_work`), that work's usage, recorded by progress and heartbeats before the
    restart, is left out, or it would count twice: the run starts from the checkpoint's usage
    (none when it never checkpointed: it starts over). A kind whose work after a checkpoint
    stays done (cleanup: deleted is deleted) keeps all of it."""
    recorded = task["usage"] or {}
    if task["on_restart"] != "resume" or not repeats_work:
        return dict(recorded)
    if task["checkpoint"] is None:
        return {}
    # A checkpoint saved before checkpoint_usage existed (migration 0008): the usage recorded.
    return dict(task["checkpoint_usage"] if task["checkpoint_usage"] is not None else recorded)


class RunningTask:
    """One claimed task while its kind runs: implements `TaskContext`."""

    def __init__(
        self,
        task: dict[str, Any],
        fence: Fence,
        *,
        pool: asyncpg.Pool,
        storage: BlobStorage,
        settings: Settings,
        metrics: WorkerMetrics,
        repeats_work: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task_id: uuid.UUID = task["id"]
        self.kind: str = task["kind"]
        self.params: dict[str, Any] = task["params"] or {}
        self.on_restart: str = task["on_restart"]
        resuming = self.on_restart == "resume"
        self.resumed_from: dict[str, Any] | None = task["checkpoint"] if resuming else None
        self.limits: dict[str, int] = task["budget"] or {}
        self.usage: dict[str, int] = {**empty_usage(), **usage_to_continue_from(task, repeats_work)}
        # Reserved (`reserving`) for the step under way and not yet counted by its `progress`.
        self.reserved: dict[str, int] = {}
        self.fence = fence
        self.pool = pool
        self.storage = storage
        self.settings = settings
        self.metrics = metrics
        self.stop_reason: str | None = None
        self._clock = clock
        self._last_progress_event = float("-inf")

    # -- TaskContext ------------------------------------------------------------------------

    def cancel_requested(self) -> bool:
        return self.stop_reason is not None

    def budget_left(self) -> dict[str, int]:
        return budget_left(self.limits, self.recorded_usage())

    def require_budget(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> None:
        needed = {"items": items, "bytes": bytes, "transitions": transitions, "cost_units": cost_units}
        over = exceeded_by(self.limits, self.recorded_usage(), needed)
        if over is not None:
            raise BudgetExceeded(*over)

    @contextlib.asynccontextmanager
    async def reserving(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> AsyncIterator[None]:
        needed = {"items": items, "bytes": bytes, "transitions": transitions, "cost_units": cost_units}
        if min(needed.values()) < 0:
            raise ValueError("a reservation is of work to come: items, bytes, transitions and cost_units are >= 0")
        if self.reserved:
            raise RuntimeError("reservations do not nest: reserve once for the whole step")
        self._raise_if_stopped()
        over = exceeded_by(self.limits, self.recorded_usage(), needed)
        if over is not None:
            raise BudgetExceeded(*over)
        # Only a limited counter must survive a crash: the others are news, written later.
        needed = {c: n for c, n in needed.items() if n and LIMITS_BY_COUNTER[c] in self.limits}
        if needed:
            await self._write_usage(_added(self.usage, needed))
            self.reserved = needed
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, TaskCancelled):
                # Stopped by a failure part way: how much it did is not known, so all of it
                # stays counted (TaskCancelled is raised before the work it stops).
                self.usage = self.recorded_usage()
            raise
        finally:
            # What the step's progress calls did not take was not used. The database keeps the
            # larger figure until the next write: on the safe side.
            self.reserved = {}

    async def progress(
        self,
        *,
        items: int = 0,
        bytes: int = 0,
        cost_units: int = 0,
        message: str | None = None,
        data: dict[str, Any] | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> None:
        self._raise_if_stopped()
        if min(items, bytes, cost_units) < 0:
            raise ValueError("progress counts work done: items, bytes and cost_units are >= 0")
        step = {"items": items, "bytes": bytes, "cost_units": cost_units, "transitions": 1}
        usage = _added(self.usage, step)
        # What a reservation covered is taken from it; the rest is news to the database.
        reserved = {c: n - min(n, step.get(c, 0)) for c, n in self.reserved.items()}
        uncovered = any(
            step[c] > self.reserved.get(c, 0) for c in step if step[c] and LIMITS_BY_COUNTER[c] in self.limits
        )
        recorded = _added(usage, reserved)
        over = exceeded(self.limits, recorded)
        now = self._clock()
        due = now - self._last_progress_event >= PROGRESS_EVENT_EVERY_S
        if conn is not None:
            # Counted in the work's own transaction: a refusal (budget, cancel) rolls the step
            # back with its usage, so it is not counted here either ("4 > 3", usage 3).
            if over is not None:
                raise BudgetExceeded(*over)
            await self._write_usage(recorded, self._event(recorded, message, data) if due else None, conn=conn)
        self.usage, self.reserved = usage, reserved
        if over is not None:
            raise BudgetExceeded(*over)  # after the fact: the usage shows the step ("4 > 3", usage 4)
        if due:
            self._last_progress_event = now
        if conn is not None:
            return
        if uncovered:
            # Work nobody reserved, done outside any transaction of ours: it must be on record
            # before the kind goes on, or a crash now would give its budget back.
            await self._write_usage(recorded, self._event(recorded, message, data) if due else None)
        elif due:
            try:
                await self._write_usage(recorded, self._event(recorded, message, data))
            except _DATABASE_ERRORS as exc:
                # A progress event is news, not state: the usage is on record already.
                log.warning("task %s: could not record progress: %s: %s", self.task_id, exc.__class__.__name__, exc)

    async def checkpoint(self, state: dict[str, Any]) -> None:
        self._raise_if_stopped()
        if not isinstance(state, dict):
            raise TypeError("a checkpoint is a JSON object")
        size = len(store.encode_json(state).encode())
        self.usage["transitions"] += 1
        self.usage["state_bytes"] = size
        self._check_budget()
        recorded = self.recorded_usage()
        # A resumed run of a kind that does its work after the checkpoint again starts from
        # what was counted by then: a reservation under way is for that work.
        await self._write(
            "task.checkpoint",
            {"state_bytes": size, "usage": dict(recorded)},
            {"checkpoint": state, "usage": recorded, "checkpoint_usage": dict(self.usage)},
        )

    def recorded_usage(self) -> dict[str, int]:
        """The usage as the database must have it: what was counted, and what is reserved for
        steps under way (their work may be done already when a crash stops the count)."""
        return _added(self.usage, self.reserved)

    # -- the worker's side ------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the kind to stop at its next progress or checkpoint (TaskCancelled)."""
        if self.stop_reason is None or STOP_REASONS.index(reason) > STOP_REASONS.index(self.stop_reason):
            self.stop_reason = reason

    def _raise_if_stopped(self) -> None:
        if self.stop_reason is not None:
            raise TaskCancelled(self.stop_reason)

    def _check_budget(self) -> None:
        over = exceeded(self.limits, self.recorded_usage())
        if over is not None:
            raise BudgetExceeded(*over)

    def _event(self, usage: dict[str, int], message: str | None, data: dict[str, Any] | None) -> dict[str, Any]:
        event: dict[str, Any] = {"usage": dict(usage)}
        if message is not None:
            event["message"] = message
        if data is not None:
            event["data"] = data
        return event

    async def _write_usage(
        self, usage: dict[str, int], event: dict[str, Any] | None = None, *, conn: asyncpg.Connection | None = None
    ) -> None:
        """Record `usage` (with a `task.progress` event when one is given), on `conn` inside
        the caller's transaction or else on a connection of its own."""
        if event is not None:
            await self._write("task.progress", event, {"usage": usage}, conn=conn)
            return
        if conn is not None:
            await self._refused_unless(await store.record_usage(conn, self.task_id, usage, self.fence), conn)
            return
        async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as own:
            await self._refused_unless(await store.record_usage(own, self.task_id, usage, self.fence), own)

    async def _write(
        self, event: str, data: dict[str, Any], fields: dict[str, Any], *, conn: asyncpg.Connection | None = None
    ) -> None:
        if conn is not None:
            row = await store.append_event(
                conn, self.task_id, event, data, only_in=("running",), fields=fields, fence=self.fence
            )
            await self._refused_unless(row, conn)
            return
        async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as own:
            row = await store.append_event(
                own, self.task_id, event, data, only_in=("running",), fields=fields, fence=self.fence
            )
            await self._refused_unless(row, own)

    async def _refused_unless(self, written: object, conn: asyncpg.Connection) -> None:
        """A fenced write found nothing to change: the task was cancelled meanwhile, or is no
        longer ours. Either way the kind stops here (TaskCancelled)."""
        if written is not None:
            return
        found = await conn.fetchrow(
            "SELECT status, worker FROM arkvory_tasks WHERE id = $1", self.task_id, timeout=POOL_TIMEOUT_S
        )
        if found is not None and found["status"] == "cancelling" and found["worker"] == self.fence.holder:
            self.request_stop("cancel")
        else:
            self.request_stop("gone")
        self._raise_if_stopped()


def _added(usage: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    return {c: usage.get(c, 0) + more.get(c, 0) for c in set(usage) | set(more)}
