"""A task kind for the worker tests: `steps`, a controllable long-running task.

It does `steps` steps of `step_seconds` each; after each it records the step in the table
`test_worker_steps` (so a test can count what was done, and done twice), reports progress
(`items`, `bytes`, `cost_units` per step) and, every `checkpoint_every` steps, checkpoints
`{"next": step + 1, "pad": "x" * (pad + pad_growth * step)}`. A `resume` run starts at the
checkpoint's `next`. `fail_at` raises an unexpected error at that step; `crash_at` kills the
worker process (SIGKILL) there; `hold_at` waits before that step until the test opens the task's
gate (worker_harness.open_gate), so that a test can act while a run is at a known step, between
two writes, however slow the machine. Registered (also as `steps_b`, a second kind to run next to it)
by tests/worker_entry.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from arkvory.shared.errors import InvalidInput

_FIELDS = {
    "steps": 5, "step_seconds": 0.0, "checkpoint_every": 1, "items": 1, "bytes": 0, "cost_units": 0,
    "pad": 0, "pad_growth": 0, "fail_at": -1, "crash_at": -1, "hold_at": -1,
}
GATE_POLL_S = 0.05


def validate_params(params: Any) -> dict:
    if not isinstance(params, dict) or set(params) - set(_FIELDS):
        raise InvalidInput(f"steps params: an object with {', '.join(_FIELDS)}")
    return {**_FIELDS, **params}


async def run(ctx) -> dict:
    p = ctx.params
    async with ctx.pool.acquire() as conn, conn.transaction():
        # Two of these starting at once would race in CREATE TABLE IF NOT EXISTS (pg_type).
        await conn.execute("SELECT pg_advisory_xact_lock(736174)")
        await conn.execute("CREATE TABLE IF NOT EXISTS test_worker_steps (n bigserial, task_id uuid, step integer)")
        await conn.execute("CREATE TABLE IF NOT EXISTS test_worker_gates (task_id uuid PRIMARY KEY)")
    first = (ctx.resumed_from or {}).get("next", 0)
    for step in range(first, p["steps"]):
        if step == p["hold_at"]:
            await _wait_for_gate(ctx)
        await asyncio.sleep(p["step_seconds"])
        if step == p["fail_at"]:
            raise RuntimeError(f"step {step} went wrong")
        if step == p["crash_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
        await ctx.pool.execute("INSERT INTO test_worker_steps (task_id, step) VALUES ($1, $2)", ctx.task_id, step)
        await ctx.progress(items=p["items"], bytes=p["bytes"], cost_units=p["cost_units"], data={"step": step})
        if (step + 1) % p["checkpoint_every"] == 0:
            await ctx.checkpoint({"next": step + 1, "pad": "x" * (p["pad"] + p["pad_growth"] * step)})
    return {"steps": p["steps"], "first": first}


async def _wait_for_gate(ctx) -> None:
    # Polled in autocommit reads: a held run holds no transaction (and no row lock) open.
    while not await ctx.pool.fetchval("SELECT EXISTS (SELECT 1 FROM test_worker_gates WHERE task_id = $1)", ctx.task_id):
        await asyncio.sleep(GATE_POLL_S)
