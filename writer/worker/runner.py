"""Claiming and running tasks during one activation of the worker (SPEC §7).

Concurrency: at most `MAX_TASKS` (2) tasks at once, and at most one of each kind, so a cleanup
and a verify may overlap but two cleanups never fight over the same blobs (a second task of a
busy kind stays queued until the first ends).

Wake-ups come from LISTEN `arkvory_tasks` (a `task.queued` event; lock.py forwards them), with
a slow poll as a safety net for a notification lost while the connection was re-made. A claim
is `FOR UPDATE SKIP LOCKED` (queued -> loading), then the params are checked and the task moves
to running; the kind runs with a `RunningTask` context and the run ends `completed`, `failed`
(`budget_exceeded` at once, `internal` for an unexpected exception, whose traceback is logged)
or `cancelled`. Every end is a conditional, fenced transition: a completion racing a cancel
finds the task `cancelling` and the cancel wins, so a task never ends both ways.

A cancel reaches a running kind through its notification (`task.cancelling`): the LISTEN
callback runs on the event loop but outside any task, where nothing can be started (anyio's
`start_soon` raises there), so it only records the task id and sets an event; `_cancel_checks`,
a task of the activation's group, then reads the status of every task named since its last
round in one query and asks the cancelled ones to stop. A notice that arrives during a read is
kept for the next round, never dropped.

Running tasks are heartbeated every few seconds (`heartbeat_at`, and the usage so far); the
heartbeat also re-reads the status as a safety net for a missed cancel notification, and stops
at once a task that is no longer this activation's.

Stopping (SIGTERM): no more claims; running kinds are asked to stop at their next progress or
checkpoint, like a cancel, but the task is left as it is (`running`) for the next activation's
restart recovery: `resume` continues from its last checkpoint, `retry` runs again from the
start, `fail` ends `failed` with `server_restarted`. A kind that stopped so gives its attempt
back (a planned stop is no crash: rolling restarts do not use up `max_attempts`). Kinds that do
not stop within ARKVORY_DRAIN_TIMEOUT_SECONDS are cancelled where they are, with the same
outcome, and their run counts as an attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from types import ModuleType
from typing import Any

import anyio
import asyncpg

from arkvory.shared.errors import InvalidInput
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage
from arkvory.writer.tasks import store
from arkvory.writer.tasks.context import BudgetExceeded, TaskCancelled

from .context import POOL_TIMEOUT_S, RunningTask
from .lock import Activation
from .metrics import WorkerMetrics

log = logging.getLogger("arkvory.worker.runner")

MAX_TASKS = 2
POLL_EVERY_S = 10.0
RETRY_CLAIM_S = 1.0
HEARTBEAT_EVERY_S = 3.0
END_WRITE_ATTEMPTS = 3
END_WRITE_PAUSE_S = 1.0
MAX_ERROR_MESSAGE = 500
_DATABASE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
# Events this worker writes itself: their notifications are no news about a running task.
_OWN_EVENTS = frozenset(
    {"task.queued", "task.loading", "task.running", "task.progress", "task.checkpoint", "task.completed", "task.failed"}
)


class RecordingFailed(Exception):
    """The end of a task could not be written: the activation ends (the lock is given up and
    taken again, and restart recovery settles the task)."""


class Runner:
    def __init__(
        self,
        activation: Activation,
        *,
        pool: asyncpg.Pool,
        storage: BlobStorage,
        settings: Settings,
        metrics: WorkerMetrics,
        kinds: dict[str, ModuleType],
        max_tasks: int = MAX_TASKS,
    ) -> None:
        self.fence = activation.fence
        self.pool = pool
        self.storage = storage
        self.settings = settings
        self.metrics = metrics
        self.kinds = kinds
        self.max_tasks = max_tasks
        self.running: dict[uuid.UUID, RunningTask] = {}
        self._scopes: dict[uuid.UUID, anyio.CancelScope] = {}
        self._heartbeating: set[uuid.UUID] = set()  # running (past loading) and not ending
        # Tasks a notification named since the last status read, and the event that wakes it.
        self._to_check: set[uuid.UUID] = set()
        self._check_wake = asyncio.Event()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False

    # -- called from outside (notifications, signals) ---------------------------------------

    def on_task_event(self, task_id: uuid.UUID, event: str) -> None:
        """From the lock connection's LISTEN callback (outside any task): only record and wake."""
        if event == "task.queued":
            self._wake.set()
        elif task_id in self.running and event not in _OWN_EVENTS:
            self._to_check.add(task_id)
            self._check_wake.set()

    def stop(self) -> None:
        """SIGTERM: claim nothing more, ask running kinds to stop at their next step."""
        self._stopping = True
        for ctx in self.running.values():
            ctx.request_stop("drain")
        self._wake.set()

    def force_stop(self) -> None:
        """A second signal: cancel running kinds where they are."""
        self.stop()
        for scope in self._scopes.values():
            scope.cancel()

    # -- the activation's main loop ---------------------------------------------------------

    async def run(self, adopted: list[dict[str, Any]]) -> None:
        """Run the adopted (`resume`) tasks and claim queued ones until `stop()`; then wait,
        bounded by the drain timeout, for the running kinds to stop."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeats)
            tg.start_soon(self._cancel_checks)
            # Adopted tasks were running before: they run again now, whatever the limits say.
            for task in adopted:
                self._start(tg, task, claimed=False)
            while not self._stopping:
                self._wake.clear()
                pause = await self._claim_while_room(tg)
                if self._stopping:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), pause)
                except TimeoutError:
                    pass
            await self._drain()
            tg.cancel_scope.cancel()

    async def _claim_while_room(self, tg: anyio.abc.TaskGroup) -> float:
        """Claim queued tasks while there is room; returns how long to wait for news."""
        while len(self.running) < self.max_tasks and not self._stopping:
            busy_kinds = sorted({ctx.kind for ctx in self.running.values()})
            try:
                async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
                    task = await store.claim_next(conn, self.fence, skip_kinds=busy_kinds)
            except _DATABASE_ERRORS as exc:
                log.warning("could not claim a task: %s: %s", exc.__class__.__name__, exc)
                return RETRY_CLAIM_S
            if task is None:
                break
            log.info("claimed task %s (%s, attempt %d)", task["id"], task["kind"], task["attempts"])
            self._start(tg, task, claimed=True)
        return POLL_EVERY_S

    async def _drain(self) -> None:
        if not self.running:
            return
        timeout = self.settings.drain_timeout_s
        log.info("stopping: waiting up to %d s for %d running task(s) to stop", timeout, len(self.running))
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        if self.running:
            log.warning(
                "drain timeout: cancelling %d task(s) where they are; restart recovery settles them",
                len(self.running),
            )
            for scope in self._scopes.values():
                scope.cancel()

    # -- one task ---------------------------------------------------------------------------

    def _start(self, tg: anyio.abc.TaskGroup, task: dict[str, Any], *, claimed: bool) -> None:
        kind = self.kinds.get(task["kind"])
        ctx = RunningTask(
            task, self.fence, pool=self.pool, storage=self.storage, settings=self.settings, metrics=self.metrics,
            repeats_work=getattr(kind, "RESUME_REPEATS_WORK", True),
        )
        if self._stopping:
            ctx.request_stop("drain")
        self.running[ctx.task_id] = ctx
        self._scopes[ctx.task_id] = anyio.CancelScope()
        self._idle.clear()
        self.metrics.tasks_running.set(len(self.running))
        tg.start_soon(self._run_task, ctx, claimed)

    async def _run_task(self, ctx: RunningTask, claimed: bool) -> None:
        started = time.monotonic()
        outcome = "interrupted"
        try:
            with self._scopes[ctx.task_id]:
                outcome = await self._execute(ctx, claimed)
        finally:
            self.running.pop(ctx.task_id, None)
            self._scopes.pop(ctx.task_id, None)
            self._heartbeating.discard(ctx.task_id)
            self.metrics.tasks_running.set(len(self.running))
            self.metrics.tasks.labels(kind=ctx.kind, outcome=outcome).inc()
            self.metrics.task_duration.labels(kind=ctx.kind).observe(time.monotonic() - started)
            if outcome == "interrupted":
                log.info("task %s (%s) stopped and left for restart recovery (on_restart=%s)", ctx.task_id, ctx.kind, ctx.on_restart)
            if not self.running:
                self._idle.set()
            self._wake.set()  # room for the next claim

    async def _execute(self, ctx: RunningTask, claimed: bool) -> str:
        kind = self.kinds.get(ctx.kind)
        found = "loading" if claimed else "running"  # an adopted task is running already
        if kind is None:
            return await self._fail(ctx, "unknown_kind", f"this worker does not know the task kind {ctx.kind!r}", found)
        try:
            ctx.params = kind.validate_params(ctx.params)
        except InvalidInput as exc:
            return await self._fail(ctx, "invalid_input", exc.message, found)
        if claimed and not await self._start_running(ctx):
            return await self._refused(ctx, "running")
        self._heartbeating.add(ctx.task_id)
        try:
            result = await kind.run(ctx)
        except TaskCancelled:
            return await self._stopped(ctx)
        except BudgetExceeded as exc:
            log.info("task %s (%s): budget exceeded: %s", ctx.task_id, ctx.kind, exc)
            return await self._fail(ctx, "budget_exceeded", str(exc))
        except Exception as exc:
            if ctx.stop_reason == "gone":
                return "gone"
            log.error("task %s (%s) failed unexpectedly", ctx.task_id, ctx.kind, exc_info=exc)
            message = f"the task failed unexpectedly: {exc.__class__.__name__}: {exc}"
            return await self._fail(ctx, "internal", message[:MAX_ERROR_MESSAGE])
        return await self._complete(ctx, result)

    async def _start_running(self, ctx: RunningTask) -> bool:
        async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
            return await store.start_running(conn, ctx.task_id, self.fence) is not None

    async def _complete(self, ctx: RunningTask, result: Any) -> str:
        result = {} if result is None else result
        try:
            store.encode_json(result)
            if not isinstance(result, dict):
                raise TypeError(f"a task's result is a JSON object, not {type(result).__name__}")
        except (TypeError, ValueError) as exc:
            log.error("task %s (%s) returned an unusable result", ctx.task_id, ctx.kind, exc_info=exc)
            return await self._fail(ctx, "internal", f"the task returned an unusable result: {exc}"[:MAX_ERROR_MESSAGE])
        if await self._end(ctx, "running", "completed", "task.completed", {"result": result}, {"result": result}):
            log.info("task %s (%s) completed", ctx.task_id, ctx.kind)
            return "completed"
        return await self._refused(ctx, "completed")

    async def _fail(self, ctx: RunningTask, code: str, message: str, found: str = "running") -> str:
        error = {"error_code": code, "error_message": message}
        if await self._end(ctx, found, "failed", "task.failed", error, error):
            return "budget_exceeded" if code == "budget_exceeded" else "failed"
        return await self._refused(ctx, "failed")

    async def _stopped(self, ctx: RunningTask) -> str:
        if ctx.stop_reason == "cancel":
            if await self._end(ctx, "cancelling", "cancelled", "task.cancelled", {}, {}):
                log.info("task %s (%s) cancelled", ctx.task_id, ctx.kind)
                return "cancelled"
            return "gone"
        if ctx.stop_reason == "drain":
            await self._save_planned_stop(ctx)
            return "interrupted"
        return "gone"

    async def _refused(self, ctx: RunningTask, wanted: str) -> str:
        """Our end was refused: a cancel won (end it cancelled), or the task is not ours."""
        try:
            async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
                found = await conn.fetchrow(
                    "SELECT status, worker FROM arkvory_tasks WHERE id = $1", ctx.task_id, timeout=POOL_TIMEOUT_S
                )
        except _DATABASE_ERRORS as exc:
            raise RecordingFailed(f"could not read task {ctx.task_id} back: {exc}") from exc
        if found is not None and found["status"] == "cancelling" and found["worker"] == self.fence.holder:
            log.info("task %s (%s) was cancelled before it could end %s", ctx.task_id, ctx.kind, wanted)
            if await self._end(ctx, "cancelling", "cancelled", "task.cancelled", {}, {}):
                return "cancelled"
        if found is not None and found["status"] in store.FINISHED:
            log.info("task %s (%s) had already ended %s", ctx.task_id, ctx.kind, found["status"])
        else:
            log.warning("task %s (%s) is no longer this worker's; it does not end %s here", ctx.task_id, ctx.kind, wanted)
        return "gone"

    async def _end(
        self, ctx: RunningTask, found: str, to: str, event: str, data: dict[str, Any], fields: dict[str, Any]
    ) -> bool:
        """The task's last transition, fenced; retried a few times on database errors."""
        self._heartbeating.discard(ctx.task_id)
        fields = {**fields, "usage": ctx.usage}
        for attempt in range(1, END_WRITE_ATTEMPTS + 1):
            try:
                async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
                    moved = await store.transition(
                        conn, ctx.task_id, allowed_from=[found], to=to, event=event,
                        data=data, fields=fields, fence=self.fence,
                    )
                return moved is not None
            except _DATABASE_ERRORS as exc:
                log.warning(
                    "task %s: could not record %s (attempt %d of %d): %s: %s",
                    ctx.task_id, to, attempt, END_WRITE_ATTEMPTS, exc.__class__.__name__, exc,
                )
                if attempt < END_WRITE_ATTEMPTS:
                    await asyncio.sleep(END_WRITE_PAUSE_S)
        raise RecordingFailed(f"could not record that task {ctx.task_id} ended {to}")

    async def _save_planned_stop(self, ctx: RunningTask) -> None:
        """Save the usage of a run stopped by SIGTERM and give its attempt back; if that write
        fails, the run simply counts as an attempt (the safe side of `max_attempts`)."""
        try:
            async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
                await store.planned_stop(conn, ctx.task_id, self.fence, ctx.usage)
        except _DATABASE_ERRORS as exc:
            log.warning("task %s: could not save its usage: %s: %s", ctx.task_id, exc.__class__.__name__, exc)

    # -- heartbeats and cancellation --------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            for task_id in list(self._heartbeating):
                ctx = self.running.get(task_id)
                if ctx is None:
                    continue
                try:
                    async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
                        status = await store.heartbeat(conn, task_id, self.fence, ctx.recorded_usage())
                except _DATABASE_ERRORS as exc:
                    log.warning("heartbeat of task %s failed: %s: %s", task_id, exc.__class__.__name__, exc)
                    continue
                if task_id not in self._heartbeating:
                    continue  # it ended meanwhile
                if status is None:
                    log.warning("task %s is no longer this worker's: stopping it", task_id)
                    self._stop_at_once(ctx)
                elif status == "cancelling":
                    ctx.request_stop("cancel")

    def _stop_at_once(self, ctx: RunningTask) -> None:
        ctx.request_stop("gone")
        scope = self._scopes.get(ctx.task_id)
        if scope is not None:
            scope.cancel()

    async def _cancel_checks(self) -> None:
        """Read the status of the tasks notifications named (one query a round, however many
        notices came) and ask those being cancelled to stop."""
        while True:
            await self._check_wake.wait()
            self._check_wake.clear()
            named, self._to_check = self._to_check, set()
            await self._read_cancels([task_id for task_id in named if task_id in self.running])

    async def _read_cancels(self, task_ids: list[uuid.UUID]) -> None:
        if not task_ids:
            return
        try:
            async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
                rows = await conn.fetch(
                    "SELECT id, status FROM arkvory_tasks WHERE id = ANY($1::uuid[])", task_ids, timeout=POOL_TIMEOUT_S
                )
        except _DATABASE_ERRORS as exc:
            # The heartbeat reads the status again within HEARTBEAT_EVERY_S.
            log.warning("could not read tasks %s after a notification: %s: %s",
                        ", ".join(map(str, task_ids)), exc.__class__.__name__, exc)
            return
        for row in rows:
            ctx = self.running.get(row["id"])
            if ctx is not None and row["status"] == "cancelling":
                log.info("task %s (%s): cancel requested", ctx.task_id, ctx.kind)
                ctx.request_stop("cancel")
