"""Bounded, keyset-paginated lists: `?limit=` (1-1000, default 100) and an opaque `?cursor=`.

A cursor is the sort key of the last item of a page (base64url of a JSON array), so a page is
one index range scan however deep the client pages, and concurrent inserts do not shift pages.

    limit = page_limit(request)
    after = page_cursor(request, ("name",))          # None on the first page, else a tuple
    rows = await conn.fetch("... WHERE ($2::text IS NULL OR name > $2) ORDER BY name LIMIT $3",
                            ..., after and after[0], limit + 1)
    return JSONResponse(page(rows, limit, item_json, lambda r: [r["name"]]))
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request

from arkvory.shared.errors import InvalidInput

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_CURSOR = 4096  # a sort key of a few names and paths fits easily


def page_limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and 1 <= int(raw) <= MAX_LIMIT):
        raise InvalidInput(f"query parameter 'limit' must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


def page_cursor(request: Request, fields: Sequence[str]) -> tuple | None:
    """The sort key a page continues after, checked to be `len(fields)` strings."""
    raw = request.query_params.get("cursor")
    if raw is None:
        return None
    try:
        if len(raw) > MAX_CURSOR:
            raise ValueError
        key = json.loads(base64.urlsafe_b64decode(raw.encode("ascii") + b"==="))
        if not (isinstance(key, list) and len(key) == len(fields) and all(isinstance(v, str) for v in key)):
            raise ValueError
        for value in key:
            value.encode("utf-8")  # lone surrogates cannot reach the database
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidInput("query parameter 'cursor' is not a cursor this list returned") from None
    return tuple(key)


def time_id_cursor(request: Request) -> tuple[datetime.datetime | None, uuid.UUID | None]:
    """The `(createdAt, id)` a list ordered oldest first continues after; (None, None) first."""
    after = page_cursor(request, ("createdAt", "id"))
    if after is None:
        return None, None
    try:
        moment, row_id = datetime.datetime.fromisoformat(after[0]), uuid.UUID(after[1])
    except ValueError:
        raise InvalidInput("query parameter 'cursor' is not a cursor this list returned") from None
    if moment.tzinfo is None:
        raise InvalidInput("query parameter 'cursor' is not a cursor this list returned")
    return moment, row_id


def time_id_key(row: Any) -> list[str]:
    """The cursor of a row of such a list (its `created_at` and `id` columns)."""
    return [row["created_at"].isoformat(), str(row["id"])]


def encode_cursor(key: Sequence[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def page(
    rows: Sequence[Any],
    limit: int,
    item: Callable[[Any], Any],
    key: Callable[[Any], Sequence[str]],
    keep: Callable[[Any], bool] = lambda row: True,
) -> dict[str, Any]:
    """`{"items", "nextCursor"}` from up to `limit + 1` rows (the extra one says more exist).
    `keep` drops rows a coarse SQL filter let through; the page is then shorter, never wrong."""
    items = rows[:limit]
    more = len(rows) > limit
    return {
        "items": [item(row) for row in items if keep(row)],
        "nextCursor": encode_cursor(key(items[-1])) if more else None,
    }
