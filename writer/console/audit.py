"""The audit trail (administrators, as in the API): the list of GET /api/v1/audit with the same
filters, in a GET form that works without a script, and a link to the older (or newer) page.

The page sends the API the filters the form filled in (empty fields are no filter); a filter
the API refuses (a time it cannot read) is shown above the form, which keeps what was typed.
A time typed without an offset is UTC, as the API reads it; the form's time fields send none.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..audit.actions import ACTION_NAMES, FAMILIES
from ..audit.filters import ORDERS, OUTCOMES
from .internal import Refused
from .session import ConsoleUser, api_for, page, render

PAGE_SIZE = "50"
FILTER_NAMES = ("principal", "action", "repository", "target", "outcome", "since", "until", "order")


def details_text(details: Any) -> str:
    """An entry's details as one line: `key: value` pairs, values as JSON."""
    if not isinstance(details, dict) or not details:
        return "—"
    return ", ".join(f"{key}: {json.dumps(value, ensure_ascii=False)}" for key, value in details.items())


def _query(filters: dict[str, str], cursor: str) -> str:
    return urllib.parse.urlencode({**{k: v for k, v in filters.items() if v}, "cursor": cursor})


@page
async def audit_page(request: Request, user: ConsoleUser) -> Response:
    filters = {name: (request.query_params.get(name) or "").strip() for name in FILTER_NAMES}
    query = {name: value for name, value in filters.items() if value}
    error = None
    try:
        listing = await api_for(request, user).fetch(
            "/api/v1/audit", {**query, "limit": PAGE_SIZE, "cursor": request.query_params.get("cursor") or None}
        )
    except Refused as refusal:
        if refusal.status != 400:
            raise  # 401, 403: the error page
        listing, error = {"items": [], "nextCursor": None}, refusal
    next_cursor = listing.get("nextCursor")
    return render(
        request, user, "audit.html",
        {
            "listing": listing, "filters": filters, "families": FAMILIES, "actions": ACTION_NAMES,
            "outcomes": OUTCOMES, "orders": ORDERS, "details_text": details_text,
            "next_href": f"/console/audit?{_query(filters, next_cursor)}" if next_cursor else None,
            "filtered": bool(query),
        },
        status=400 if error else 200, error=f"{error.message} ({error.code})" if error else None,
    )
