"""What a task kind's code sees while it runs: the contract between the worker and the kinds.

A kind is a module with `validate_params(params: dict) -> dict` (raises
`arkvory.shared.errors.InvalidInput` on bad params; the API calls it before a task is stored)
and `async def run(ctx: TaskContext) -> dict` (the task's result). The worker implements
`TaskContext`; every budget check, event and checkpoint goes through it, so a kind never writes
task rows itself.

A kind asks its budget before each step (`budget_left`, `require_budget`) and reports the step's
usage with `progress` after it, in the units of writer/tasks/budgets.py. The budget holds across
a crash (a retry continues from the usage on record) only if the usage is on record by the time
the work is: a step done in a transaction of the kind's passes that connection to `progress`
(`conn=`), so the usage commits with the work; a step done outside one (files, an object store,
reads) runs inside `reserving(...)`, which records its cost before it starts. A module attribute
`RESUME_REPEATS_WORK` (default True) says whether a resumed run does again what the stopped run
did after its last checkpoint: then that work's usage is counted once, from the checkpoint's
usage; a kind whose work stays done (cleanup removes things) sets it False and keeps it all.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import asyncpg

from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage


class TaskCancelled(Exception):
    """Raised by `progress`/`checkpoint` when the task was asked to cancel: the kind stops
    where it is (it may clean up in a `finally`) and the worker records `cancelled`."""


class BudgetExceeded(Exception):
    """Raised by `progress`/`checkpoint` when a budget limit is exceeded, or by
    `require_budget` when a step would exceed one: the worker fails the task at once with code
    `budget_exceeded`, never retried."""

    def __init__(self, limit: str, allowed: int, used: int) -> None:
        super().__init__(f"{limit} exceeded: {used} > {allowed}")
        self.limit, self.allowed, self.used = limit, allowed, used


class TaskContext(Protocol):
    task_id: uuid.UUID
    kind: str
    params: dict[str, Any]
    # The state last saved with `checkpoint` (a `resume` task restarted from it), else None.
    resumed_from: dict[str, Any] | None
    pool: asyncpg.Pool
    storage: BlobStorage
    settings: Settings

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
        """Count work done (adds to the budget usage and checks every limit), and record a
        `task.progress` event (the worker may coalesce events to at most a few per second,
        but the usage is always exact). Raises TaskCancelled or BudgetExceeded.

        `conn`: the connection whose open transaction did the work; the usage is written in
        it, so a crash loses both or neither, and a refusal (TaskCancelled, BudgetExceeded)
        raised here rolls the work back uncounted. If that transaction rolls back for another
        reason, the step stays counted (too much, never too little)."""

    async def checkpoint(self, state: dict[str, Any]) -> None:
        """Save `state` (JSON) as the point a `resume` task continues from, with a
        `task.checkpoint` event, in one transaction; counts one transition and checks
        `max_state_bytes`. Raises TaskCancelled or BudgetExceeded."""

    def cancel_requested(self) -> bool:
        """True once the task was asked to cancel (cheap: no database round trip)."""

    def budget_left(self) -> dict[str, int]:
        """How much each limited usage counter (`items`, `bytes`, `transitions`, `cost_units`,
        `state_bytes`) may still grow before it exceeds its limit; unlimited ones are absent.
        Cheap and read-only: a kind that knows what its next steps cost sizes them to it."""

    def require_budget(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> None:
        """Raise BudgetExceeded if that much more work would exceed a limit; counts nothing.
        A kind calls it before a step it cannot split, so it fails without starting work its
        budget does not cover (writer/tasks/budgets.py says when each way applies)."""

    def reserving(
        self, *, items: int = 0, bytes: int = 0, transitions: int = 0, cost_units: int = 0
    ) -> AbstractAsyncContextManager[None]:
        """`async with ctx.reserving(...):` around a step done outside any transaction of the
        kind's: raises BudgetExceeded, as `require_budget`, if it would exceed a limit; else
        records that much more usage before the block runs, so a crash during the step leaves
        it counted. The step's `progress` calls take from the reservation; what they did not
        take when the block ends was not used. Reservations do not nest."""
