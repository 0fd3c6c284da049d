"""Task retention (SPEC §7): finished tasks and their events are pruned after
ARKVORY_TASK_RETENTION; an unfinished task is never pruned, however old.

The cleanup task prunes on each run, a batch at a time as its budget allows
(`prune_finished_batch`). Deleting a task deletes its events (`ON DELETE CASCADE`) and frees
its dispatch Idempotency-Key. Batches keep each statement (and the locks it holds) short, so
pruning a long backlog never blocks the task API for long.
"""

from __future__ import annotations

import asyncpg

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S

from .store import FINISHED

# The status test is repeated on the DELETE itself: the sub-select's snapshot may be older
# than the row it names (finished statuses are final, so this is belt and braces).
_PRUNE = """
DELETE FROM arkvory_tasks
WHERE id IN (
    SELECT id FROM arkvory_tasks
    WHERE finished_at < now() - $1 * interval '1 second' AND status = ANY($2::text[])
    LIMIT $3
)
AND status = ANY($2::text[]) AND finished_at < now() - $1 * interval '1 second'
"""


_ANY_TO_PRUNE = """
SELECT EXISTS (
    SELECT 1 FROM arkvory_tasks
    WHERE finished_at < now() - $1 * interval '1 second' AND status = ANY($2::text[])
)
"""


async def prune_finished(conn: asyncpg.Connection, older_than_s: int, batch: int = 1000) -> int:
    """Delete the finished tasks that finished more than `older_than_s` seconds ago (database
    clock), with their events, `batch` tasks per statement; returns how many went."""
    total = 0
    while True:
        deleted = await prune_finished_batch(conn, older_than_s, batch)
        total += deleted
        if deleted < batch:
            return total


async def prune_finished_batch(conn: asyncpg.Connection, older_than_s: int, at_most: int) -> int:
    """One statement of `prune_finished`: at most `at_most` tasks (a budget sizes it)."""
    if older_than_s < 0 or at_most < 1:
        raise ValueError("older_than_s must be >= 0 and at_most >= 1")
    status = await conn.execute(_PRUNE, older_than_s, list(FINISHED), at_most, timeout=POOLED_QUERY_TIMEOUT_S)
    return int(status.split()[-1])


async def any_to_prune(conn: asyncpg.Connection, older_than_s: int) -> bool:
    """Whether `prune_finished` would delete anything now."""
    return await conn.fetchval(_ANY_TO_PRUNE, older_than_s, list(FINISHED), timeout=POOLED_QUERY_TIMEOUT_S)
