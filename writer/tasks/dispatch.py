"""Dispatching a task: one committed row (and its `task.queued` event) per idempotency key.

Dispatch keys live in the tasks table's own unique column, global across kinds and principals
(SPEC §7), not in the per-principal table of writer/idempotency.py: the task itself is the
recorded result, and a key is free again only once its task is pruned (ARKVORY_TASK_RETENTION).
Two dispatches racing with one key: the loser's INSERT waits for the winner's commit, fails
with a unique violation, and the loser then reads the winner's task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import IdempotentParameterMismatch

from . import store


@dataclasses.dataclass(frozen=True)
class Definition:
    kind: str
    params: dict[str, Any]
    on_restart: str
    version: str | None
    budget: dict[str, int]
    definition_hash: str
    max_attempts: int = store.DEFAULT_MAX_ATTEMPTS


Recorded = Callable[[asyncpg.Connection, dict[str, Any]], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class Dispatched:
    task: dict[str, Any]
    replayed: bool  # True: the key was used before and this is that task


async def find_by_key(conn: asyncpg.Connection, key: str) -> dict[str, Any] | None:
    return store.decode(
        await conn.fetchrow("SELECT * FROM arkvory_tasks WHERE idempotency_key = $1", key, timeout=POOLED_QUERY_TIMEOUT_S)
    )


def _same_definition(task: dict[str, Any], definition: Definition) -> bool:
    # on_restart and max_attempts are not part of the hashed definition: the hash names the
    # work (SPEC §7: kind, version, params, budget), they say how a crash is handled. But a
    # retry that asks for another handling is not the same request either.
    return (
        task["definition_hash"] == definition.definition_hash
        and task["on_restart"] == definition.on_restart
        and task["max_attempts"] == definition.max_attempts
    )


async def insert_once(
    conn: asyncpg.Connection, definition: Definition, key: str | None, created_by: str,
    recorded: Recorded | None = None,
) -> Dispatched:
    """The task for `key` (new, or the one dispatched with it before), committed on return.
    `conn` must not be in a transaction. IdempotentParameterMismatch when the key's task has
    another definition. `recorded(conn, task)` runs in the transaction that inserts a new task
    (the API's audit entry)."""
    for _ in range(2):  # a lost race is followed by one read of the winner's task
        try:
            async with conn.transaction():
                if key is not None:
                    existing = await find_by_key(conn, key)
                    if existing is not None:
                        if not _same_definition(existing, definition):
                            raise IdempotentParameterMismatch(
                                f"Idempotency-Key {key!r} dispatched task {existing['id']} with another "
                                "definition (kind, version, params, budget, on_restart or max_attempts); "
                                "send a new key"
                            )
                        return Dispatched(existing, replayed=True)
                task = await store.insert_task(
                    conn,
                    kind=definition.kind,
                    params=definition.params,
                    on_restart=definition.on_restart,
                    definition_version=definition.version,
                    definition_hash=definition.definition_hash,
                    budget=definition.budget,
                    idempotency_key=key,
                    created_by=created_by,
                    max_attempts=definition.max_attempts,
                )
                if recorded is not None:
                    await recorded(conn, task)
            return Dispatched(task, replayed=False)
        except asyncpg.UniqueViolationError:
            if key is None:
                raise
    raise asyncpg.UniqueViolationError("the dispatch key's task vanished during the dispatch")


async def dispatch(
    pool: asyncpg.Pool, definition: Definition, key: str | None, created_by: str, recorded: Recorded | None = None
) -> Dispatched:
    async with pooled(pool) as conn:
        return await insert_once(conn, definition, key, created_by, recorded)
