"""How the templates show numbers and times (Jinja2 filters), a repository's console path, the
idempotency key each change form carries, so that a form sent twice (a double click, a reload)
is one change, and the query a pager's link keeps."""

from __future__ import annotations

import datetime
import secrets
import urllib.parse
from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size(value: Any) -> str:
    """1536 -> '1.5 KiB (1536 B)'; anything else as it is."""
    if not isinstance(value, int) or isinstance(value, bool):
        return "—" if value is None else str(value)
    amount, unit = float(value), 0
    while amount >= 1024 and unit < len(_UNITS) - 1:
        amount /= 1024
        unit += 1
    if unit == 0:
        return f"{value} B"
    return f"{amount:.1f} {_UNITS[unit]} ({value} B)"


def rate(value: Any) -> str:
    if value is None:
        return "unlimited"
    if not isinstance(value, int) or isinstance(value, bool):
        return str(value)
    if value == 0:
        return "unlimited"
    shown = size(value)
    if " (" not in shown:
        return f"{shown}/s"
    amount, exact = shown.split(" (", 1)
    return f"{amount}/s ({exact.rstrip(')')}/s)"


def when(value: Any) -> str:
    """A time as the database said it, to the second, in UTC."""
    if value is None:
        return "—"
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return value
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def from_now(value: Any, now: datetime.datetime | None = None) -> str:
    """How far a time is from now, as a person counts: 'in 11 h 58 min', 'in 90 days', 'passed'."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return "—"
    if not isinstance(value, datetime.datetime):
        return "—"
    left = (value - (now or datetime.datetime.now(datetime.UTC))).total_seconds()
    if left <= 0:
        return "passed"
    if left >= 2 * 86400:
        return f"in {round(left / 86400)} days"
    hours, minutes = divmod(max(1, round(left / 60)), 60)
    return f"in {hours} h {minutes} min" if hours else f"in {minutes} min"


def seconds(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{max(0.0, float(value)):.1f} s"
    return "—"


def repository_path(name: str) -> str:
    """The console page of a repository (the prefix of its tabs, artifacts and forms)."""
    return "/console/repositories/" + urllib.parse.quote(name, safe="")


def query_with(request: Any, **changes: str) -> str:
    """`?...`: the page's own query (its filters and order) without its cursor and notice, with
    `changes`; "" when nothing is left. For the pager's links."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in ("cursor", "notice", *changes)]
    kept += [(k, v) for k, v in changes.items() if v]
    return "?" + urllib.parse.urlencode(kept) if kept else ""


def form_key(_: Any = None) -> str:
    """A fresh Idempotency-Key for one rendering of a change form."""
    return "console-" + secrets.token_urlsafe(24)


FILTERS = {"size": size, "rate": rate, "when": when, "seconds": seconds, "from_now": from_now}
GLOBALS = {"form_key": form_key, "query_with": query_with}
