"""The worker's side of the task contract (writer/tasks/context.py `TaskContext`): what a running
kind sees, with exact budgets, coalesced progress events and fenced checkpoints.

Usage is counted in memory on every call and checked against every limit at once, so a budget
trips on the very call that exceeds it (or, asked first with `require_budget`, before the step
that would). Per-item progress calls are cheap: they only count, compare and read the clock. Progress events are coalesced to at most one per
`PROGRESS_EVENT_EVERY_S` (each carries the usage so far); the heartbeat and the task's end
write the exact usage. A checkpoint is always written at once, with its event and the usage as
of it (`checkpoint_usage`), in one transaction. Every write is fenced with the activation's
holder (store.py `Fence`): when one is refused, the task was cancelled or is no longer ours,
and the kind is stopped.

Usage belongs to the task, not to one run (`usage_to_continue_from`): a run starts from the
usage recorded so far, except a `resume` run of a kind that does again what it did after its
checkpoint (verify re-hashes those blobs), which starts from the checkpoint's usage, as its
work does.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg

from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage
from arkvory.writer.tasks import store
from arkvory.writer.tasks.budgets import budget_left, empty_usage, exceeded, exceeded_by
from arkvory.writer.tasks.context import BudgetExceeded, TaskCancelled
from arkvory.writer.tasks.store import Fence

from .metrics import WorkerMetrics

log = logging.getLogger("arkvory.worker.task")

PROGRESS_EVENT_EVERY_S = 0.5
POOL_TIMEOUT_S = 10.0

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
        return budget_left(self.limits, self.usage)

    def require_budget(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> None:
        needed = {"items": items, "bytes": bytes, "transitions": transitions, "cost_units": cost_units}
        over = exceeded_by(self.limits, self.usage, needed)
        if over is not None:
            raise BudgetExceeded(*over)

    async def progress(
        self,
        *,
        items: int = 0,
        bytes: int = 0,
        cost_units: int = 0,
        message: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self._raise_if_stopped()
        if min(items, bytes, cost_units) < 0:
            raise ValueError("progress counts work done: items, bytes and cost_units are >= 0")
        usage = self.usage
        usage["items"] += items
        usage["bytes"] += bytes
        usage["cost_units"] += cost_units
        usage["transitions"] += 1
        self._check_budget()
        now = self._clock()
        if now - self._last_progress_event < PROGRESS_EVENT_EVERY_S:
            return  # counted; the next event, the heartbeat or the end writes it
        self._last_progress_event = now
        event: dict[str, Any] = {"usage": dict(usage)}
        if message is not None:
            event["message"] = message
        if data is not None:
            event["data"] = data
        try:
            await self._write("task.progress", event, {"usage": usage})
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # A progress event is news, not state: the usage is written again later.
            log.warning("task %s: could not record progress: %s: %s", self.task_id, exc.__class__.__name__, exc)

    async def checkpoint(self, state: dict[str, Any]) -> None:
        self._raise_if_stopped()
        if not isinstance(state, dict):
            raise TypeError("a checkpoint is a JSON object")
        size = len(store.encode_json(state).encode())
        self.usage["transitions"] += 1
        self.usage["state_bytes"] = size
        self._check_budget()
        await self._write(
            "task.checkpoint",
            {"state_bytes": size, "usage": dict(self.usage)},
            {"checkpoint": state, "usage": self.usage, "checkpoint_usage": self.usage},
        )

    # -- the worker's side ------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the kind to stop at its next progress or checkpoint (TaskCancelled)."""
        if self.stop_reason is None or STOP_REASONS.index(reason) > STOP_REASONS.index(self.stop_reason):
            self.stop_reason = reason

    def _raise_if_stopped(self) -> None:
        if self.stop_reason is not None:
            raise TaskCancelled(self.stop_reason)

    def _check_budget(self) -> None:
        over = exceeded(self.limits, self.usage)
        if over is not None:
            raise BudgetExceeded(*over)

    async def _write(self, event: str, data: dict[str, Any], fields: dict[str, Any]) -> None:
        async with self.pool.acquire(timeout=POOL_TIMEOUT_S) as conn:
            row = await store.append_event(
                conn, self.task_id, event, data, only_in=("running",), fields=fields, fence=self.fence
            )
            if row is not None:
                return
            # Refused: cancelled meanwhile, or no longer ours. Either way the kind stops here.
            found = await conn.fetchrow(
                "SELECT status, worker FROM arkvory_tasks WHERE id = $1", self.task_id, timeout=POOL_TIMEOUT_S
            )
        if found is not None and found["status"] == "cancelling" and found["worker"] == self.fence.holder:
            self.request_stop("cancel")
        else:
            self.request_stop("gone")
        self._raise_if_stopped()
