"""Cleanup's `retention` step (issue 25 item 10): deletes the artifacts the repositories' enabled
retention rules no longer keep (writer/catalog/retention_rules.py says which), as a user's
delete does (writer/catalog/artifacts.py `delete_unused_artifacts`): the metadata goes, the
blob follows by cleanup's unreferenced-blob step once it is older than the grace period (the
next step of the same run, for a blob uploaded long enough ago).

Fairness. One run deletes at most PER_RUN artifacts over every repository, in turns of at most
TURN per repository: each turn serves the repository whose last turn is the oldest
(`arkvory_retention_rules.turn_at`, NULL first), and a repository with more to delete goes to
the back of the line. So a repository with a million artifacts to go takes one turn in each
round like every other, and the next run starts with the repositories this one did not reach.

A turn is one transaction: it locks the rule (a change waits for the turn and applies from the
next one; a rule disabled meanwhile deletes nothing more), finds what the rule deletes, deletes
it, records the turn, and writes the usage (`progress(conn=...)`): a crash loses the deletions
and their usage together or neither. Budgets are cleanup's (cleanup.py): an artifact is one
item and one row's cost units, a turn that deletes is one transition, a turn is cut to what the
budget has left, and work left that the budget does not cover fails the task with
`budget_exceeded` before any of it is done.

It lives apart from cleanup.py, which runs it as one of its steps, and uses that module's budget
and pacing helpers.
"""

from __future__ import annotations

import collections
import logging
import uuid

import asyncpg

from arkvory.shared.db import pooled
from arkvory.writer.catalog.artifacts import delete_unused_artifacts
from arkvory.writer.catalog.retention_rules import Limits, doomed_artifacts, load_rule

from .cleanup import QUERY_TIMEOUT_S, ROW_COST, _paced, _refuse_next, _room, _spare_transition, _stop_if_cancelled

log = logging.getLogger("arkvory.cleanup")

PER_RUN = 50_000  # artifacts one cleanup run deletes by retention at most; the next run goes on
TURN = 1_000  # artifacts one repository's turn deletes at most (one transaction)
MAX_RULES = 100_000  # repositories with enabled rules one run serves at most

_ENABLED = """
SELECT r.repository_id, p.name FROM arkvory_retention_rules r
JOIN arkvory_repositories p ON p.id = r.repository_id
WHERE r.enabled ORDER BY r.turn_at NULLS FIRST, r.repository_id LIMIT $1
"""
_TURN_TAKEN = """
UPDATE arkvory_retention_rules SET turn_at = now(), deleted_total = deleted_total + $2
WHERE repository_id = $1
"""


async def apply_retention(ctx) -> dict:
    """The step: every enabled rule in turns, within PER_RUN and the task's budget."""
    async with pooled(ctx.pool) as conn:
        queue = collections.deque(
            (r["repository_id"], r["name"]) for r in await conn.fetch(_ENABLED, MAX_RULES, timeout=QUERY_TIMEOUT_S)
        )
    deleted, served, more = 0, set(), False
    while queue:
        _stop_if_cancelled(ctx)
        if deleted >= PER_RUN:
            more = True  # the next run takes the rest, starting with those not served now
            break
        repository_id, name = queue.popleft()
        room = _room(ctx, min(TURN, PER_RUN - deleted), ROW_COST)
        async with _paced():
            count, full = await _turn(ctx, repository_id, name, room, deleted)
        served.add(repository_id)
        deleted += count
        if full:
            queue.append((repository_id, name))
    if served:
        log.info("cleanup retention: %d artifact(s) deleted in %d repositories", deleted, len(served))
        if not deleted and _spare_transition(ctx):
            await ctx.progress(message=f"retention rules: {len(served)} repositories checked, nothing to delete")
    return {"deleted": deleted, "repositories": len(served), "more": more}


async def _turn(ctx, repository_id: uuid.UUID, name: str, room: int, deleted_before: int) -> tuple[int, bool]:
    """One repository's turn: up to `room` of what its rule deletes. (deleted, whether it may
    have more to delete)."""
    async with pooled(ctx.pool) as conn:
        deleted, found = await take_turn(ctx, conn, repository_id, name, room, deleted_before)
    ctx.metrics.cleanup_retention_deleted_artifacts.inc(deleted)
    return deleted, 0 < room == found


async def take_turn(
    ctx, conn: asyncpg.Connection, repository_id: uuid.UUID, name: str, room: int, deleted_before: int
) -> tuple[int, int]:
    """The turn's transaction: the rule locked, what it deletes found (at most `room`) and
    deleted, the turn recorded and the usage written, all committed together. (deleted, found)."""
    async with conn.transaction():
        rule = await load_rule(conn, repository_id, lock=True)
        if rule is None or not rule["enabled"]:
            return 0, 0  # deleted or disabled since the run began
        limits = Limits(rule["keep_newest"], rule["keep_younger_than_s"])
        doomed = await doomed_artifacts(conn, repository_id, limits, max(room, 1), timeout=QUERY_TIMEOUT_S)
        if doomed and room == 0:
            _refuse_next(ctx, ROW_COST)  # the budget is spent and this repository has work left
        gone = await delete_unused_artifacts(conn, repository_id, [r["id"] for r in doomed])
        await conn.execute(_TURN_TAKEN, repository_id, len(gone), timeout=QUERY_TIMEOUT_S)
        if gone:
            # In the deleting transaction: the usage commits with the deletions.
            await ctx.progress(
                items=len(gone), cost_units=len(gone) * ROW_COST, conn=conn,
                message=f"retention rules: {deleted_before + len(gone)} artifact(s) deleted ({len(gone)} from {name})",
            )
    return len(gone), len(doomed)
