"""Task budgets (SPEC §7): limits a task may not exceed, and the usage counted against them.

Each limit has the usage counter it bounds. `transitions` counts the task's steps: every
`progress` and every `checkpoint` call of its kind's code is one. `state_bytes` is the size of
the last checkpoint as canonical JSON. Exceeding a limit fails the task at once with
`budget_exceeded`; it is never retried.

A cost unit is one operation on the store, so that `max_cost_units` bounds the work a task
does to the disk and the database whatever its mix of small and large things
(`cost_units()`): one per file opened or removed, one per database row removed, and one per
MiB read (started). So verify's blob of `size` bytes costs 1 + ceil(size / MiB), and cleanup's
removals cost 1 (an idempotency key, a finished task with its events, an upload temp file, a
stray blob file) or 2 (an unreferenced blob or an abandoned upload session: a row and a file).

Usage belongs to the task, not to a run: a retry continues from the usage recorded, and a
resumed run from the usage as of its checkpoint (writer/worker/context.py says why). So a crash
must not lose usage: a limited counter is on record no later than the work it counts (written in
the work's own transaction, or reserved before work done outside one), and a killed run's retry
never gets budget back.

A budget stops work before it goes over. The kinds know what a step costs before doing it
and ask first (`TaskContext.budget_left`, `require_budget`): verify sizes each group of blobs,
cleanup each batch of removals, to what is left, and the first step that does not fit fails
the task without being started. The usage stays within every limit and the error names what
the refused step would have made it ("4 > 3", usage 3). `progress` checks too, after the fact:
for a kind that did not ask, the call that takes usage past a limit fails the task, and the
usage shows that step ("4 > 3", usage 4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arkvory.shared.errors import InvalidInput

# limit name -> usage counter it bounds
LIMITS = {
    "max_items": "items",
    "max_bytes": "bytes",
    "max_transitions": "transitions",
    "max_cost_units": "cost_units",
    "max_state_bytes": "state_bytes",
}
MAX_LIMIT = 2**62
MIB = 1024 * 1024


def cost_units(*, files: int = 0, rows: int = 0, read_bytes: int = 0) -> int:
    """The cost units of storage work (module docstring): files opened or removed, database
    rows removed, and bytes read (one unit per MiB started)."""
    return files + rows + -(-read_bytes // MIB)


def validate_budget(budget: Any) -> dict[str, int]:
    """The budget as given in a dispatch: an object of known limits, each a positive integer
    (absent: no limits; `null` is refused like any other value that is not an object)."""
    if not isinstance(budget, dict):
        raise InvalidInput("budget must be an object")
    unknown = sorted(set(budget) - set(LIMITS))
    if unknown:
        raise InvalidInput(f"unknown budget limit {unknown[0]!r}; known: {', '.join(LIMITS)}")
    checked = {}
    for name, value in budget.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
            raise InvalidInput(f"budget.{name} must be an integer from 1 to {MAX_LIMIT}")
        checked[name] = value
    return checked


def empty_usage() -> dict[str, int]:
    return {counter: 0 for counter in LIMITS.values()}


def exceeded(limits: Mapping[str, int], usage: Mapping[str, int]) -> tuple[str, int, int] | None:
    """The first limit `usage` exceeds, as (limit, allowed, used); None when within budget."""
    for name, counter in LIMITS.items():
        allowed = limits.get(name)
        if allowed is not None and usage.get(counter, 0) > allowed:
            return name, allowed, usage.get(counter, 0)
    return None


def budget_left(limits: Mapping[str, int], usage: Mapping[str, int]) -> dict[str, int]:
    """How much each limited usage counter may still grow (never below 0); unlimited ones are absent."""
    return {
        counter: max(0, limits[name] - usage.get(counter, 0)) for name, counter in LIMITS.items() if name in limits
    }


def exceeded_by(
    limits: Mapping[str, int], usage: Mapping[str, int], needed: Mapping[str, int]
) -> tuple[str, int, int] | None:
    """The first limit that `needed` more (by usage counter) would exceed; None when it fits."""
    unknown = sorted(set(needed) - set(LIMITS.values()))
    if unknown:
        raise ValueError(f"unknown usage counter {unknown[0]!r}; known: {', '.join(LIMITS.values())}")
    return exceeded(limits, {c: usage.get(c, 0) + needed.get(c, 0) for c in LIMITS.values()})


def budget_json(limits: Mapping[str, int], usage: Mapping[str, int]) -> dict[str, Any]:
    """The `budget` of a task's status: its limits and its current usage."""
    return {"limits": dict(limits), "usage": {**empty_usage(), **usage}}
