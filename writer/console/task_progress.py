"""A task's page in words (issue 25 §7): its progress as a bar, each event as a sentence and
its params and result as `name value` pairs, instead of their JSON.

The bar is a `<progress>` element. Where a kind's progress can be measured it is determinate:
`verify` counts one item per blob it checks (writer/maintenance/verify.py), out of the blobs
the store holds. Other kinds report steps without a total: their bar is indeterminate while
they run, and full once they completed.

static/task-events.js writes the same sentences for the events that arrive live, by the same
rules (`sentence` below): keep the two in step; the browser test compares them.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled

from ..tasks.store import FINISHED
from .session import runtime_of

# kind -> (the usage counter that counts its work, what one unit is, the query for the total)
MEASURED = {"verify": ("items", "blobs checked", "SELECT count(*) FROM arkvory_blobs")}
_USAGE_WORDS = (("items", "items"), ("bytes", "bytes"), ("cost_units", "cost units"))


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _flat(value: Any, prefix: str = "") -> list[str]:
    """A result as `name value` pairs, nested objects with dotted names, keys in order."""
    if isinstance(value, dict) and value:
        pairs: list[str] = []
        for key in sorted(value):
            pairs += _flat(value[key], f"{prefix}{key}.")
        return pairs
    return [f"{prefix[:-1]} {_number(value)}"]


def usage_words(usage: Any) -> str:
    """'items 12, bytes 3145728, cost units 15': the counters with work in them."""
    if not isinstance(usage, dict):
        return ""
    return ", ".join(
        f"{words} {_number(usage[counter])}" for counter, words in _USAGE_WORDS if usage.get(counter)
    )


def pairs(value: Any) -> str:
    """A task's params or result in words: 'checked 3, missing 0'; 'none' when empty."""
    if value is None:
        return "—"
    if isinstance(value, dict) and not value:
        return "none"
    return ", ".join(_flat(value)) if isinstance(value, dict) else _number(value)


def sentence(event: dict[str, Any]) -> str:
    """One event as a reader would say it."""
    kind, data = event.get("type"), event.get("data")
    data = data if isinstance(data, dict) else {}
    by = f" by {data['by']}" if isinstance(data.get("by"), str) else ""
    if kind == "task.queued":
        if "recovered_from" in data:
            return f"Queued again after a worker restart (it was {_number(data['recovered_from'])})."
        return "Queued: waiting for a worker."
    if kind == "task.loading":
        return "A worker took it."
    if kind == "task.running":
        return "Running again from its last checkpoint, after a worker restart." if data.get("resumed") else "Running."
    if kind == "task.progress":
        message = data.get("message") if isinstance(data.get("message"), str) else "Progress"
        used = usage_words(data.get("usage"))
        return f"{message} (so far: {used})." if used else f"{message}."
    if kind == "task.checkpoint":
        return f"Checkpoint saved ({_number(data.get('state_bytes'))} bytes of state)."
    if kind == "task.cancelling":
        return f"Cancel asked{by}: it stops at its next step."
    if kind == "task.cancelled":
        return f"Cancelled{by}."
    if kind == "task.completed":
        result = data.get("result")
        return f"Completed: {pairs(result)}." if isinstance(result, dict) and result else "Completed."
    if kind == "task.failed":
        return f"Failed: {_number(data.get('error_code'))}: {_number(data.get('error_message'))}."
    return f"{_number(kind)}: {_number(data)}"


def _unmeasured(status: str, kind: str) -> str:
    return f"{status.capitalize()}: {kind} reports its steps below, not a total."


def _bar(value: int | None, top: int, text: str, *, counter: str | None = None, total: int | None = None,
         unit: str | None = None) -> dict[str, Any]:
    return {"value": value, "max": top, "text": text, "counter": counter, "total": total, "unit": unit}


async def progress(request: Request, task: dict[str, Any]) -> dict[str, Any]:
    """The bar: `value` and `max` (value None: indeterminate) and its words; for the page's
    script, the usage counter that moves it and the total (`counter`, `total`: None when
    nothing measures it)."""
    status, usage = task["status"], (task.get("budget") or {}).get("usage") or {}
    if status == "completed":
        return _bar(1, 1, "Completed.")
    measured = MEASURED.get(task["kind"])
    total = None
    if measured is not None:
        pool = runtime_of(request).pool
        assert pool is not None
        async with pooled(pool) as conn:
            total = await conn.fetchval(measured[2], timeout=POOLED_QUERY_TIMEOUT_S)
    if measured is None or total is None:
        if status in FINISHED:
            return _bar(0, 1, f"Stopped ({status}).")
        text = "Queued: waiting for a worker." if status == "queued" else _unmeasured(status, task["kind"])
        return _bar(None, 1, text)
    done = int(usage.get(measured[0], 0))
    top = max(total, done, 1)
    if status == "queued":  # nothing to measure yet: the bar waits (indeterminate)
        return _bar(None, top, "Queued: waiting for a worker.", counter=measured[0], total=total, unit=measured[1])
    words = f"{done} of {top} {measured[1]} ({done * 100 // top} %)"
    if status in FINISHED:
        words = f"Stopped ({status}) at {words}."
    return _bar(done, top, words, counter=measured[0], total=total, unit=measured[1])
