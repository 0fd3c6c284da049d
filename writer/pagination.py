"""Bounded, keyset-paginated lists: `?limit=` (1-1000, default 100), an opaque `?cursor=`, and on
the lists that offer them `?order=` and filters; `ListQuery` builds a page's SELECT.

A cursor is the sort key of the last item of a page (base64url of a JSON array), so a page is
one index range scan however deep the client pages, in either direction, and concurrent inserts
do not shift pages. The client sends the same order and filters with each cursor.

    listing = ListQuery("SELECT ... FROM arkvory_artifacts", TIME_ID, descending=order == NEWEST)
    listing.where("repository_id = {}", repo.id)
    listing.starts_with('name COLLATE "C"', text_filter(request, "prefix", 255))
    listing.after(page_cursor(request, listing.key))
    rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, item_json))

The SQL holds only the conditions a request uses (no `$n IS NULL OR ...`), so that a generic
plan, which PostgreSQL may choose for a statement prepared five times, is the index scan too.
Names sort and match prefixes in byte order (`COLLATE "C"`), whatever the database's collation:
a prefix is then a range of one index (shared/migrations/0017_list_indexes.sql), and the order
is the same on every installation.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import json
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import asyncpg
from starlette.requests import Request

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.download.catalog import check_text
from arkvory.shared.errors import InvalidInput
from arkvory.shared.http.query import query_value

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_CURSOR = 4096  # a sort key of a few names and paths fits easily
NEWEST, OLDEST = "newest", "oldest"
TIME_ORDERS = (NEWEST, OLDEST)


@dataclasses.dataclass(frozen=True)
class SortColumn:
    """One column of a list's sort key: the SQL it orders by, the row's column that holds its
    value, and the SQL type of that value in a cursor (text, timestamptz, uuid or bigint)."""

    sql: str
    row: str
    type: str = "text"


TIME_ID = (SortColumn("created_at", "created_at", "timestamptz"), SortColumn("id", "id", "uuid"))


def page_limit(request: Request) -> int:
    raw = query_value(request, "limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and 1 <= int(raw) <= MAX_LIMIT):
        raise InvalidInput(f"query parameter 'limit' must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


def page_order(request: Request, default: str, choices: Sequence[str] = TIME_ORDERS) -> str:
    """`?order=`: one of `choices` (newest or oldest first, or a list's own), else `default`."""
    raw = query_value(request, "order")
    if raw is None:
        return default
    if raw not in choices:
        raise InvalidInput(f"query parameter 'order' must be one of: {', '.join(choices)}")
    return raw


def text_filter(request: Request, name: str, max_length: int) -> str | None:
    """A name or prefix to filter by: 1-`max_length` characters without controls, or None."""
    value = query_value(request, name)
    return None if value is None else check_text(value, f"query parameter {name!r}", max_length)


def choice_filter(request: Request, name: str, allowed: Collection[str]) -> str | None:
    """One of `allowed` (a kind, a status), or None."""
    value = query_value(request, name)
    if value is not None and value not in allowed:
        raise InvalidInput(f"query parameter {name!r} must be one of: {', '.join(sorted(allowed))}")
    return value


def _bad_cursor() -> InvalidInput:
    return InvalidInput("query parameter 'cursor' is not a cursor this list returned")


def page_cursor(request: Request, key: Sequence[SortColumn]) -> tuple | None:
    """The sort key a page continues after, each value of its column's type; None at first."""
    raw = query_value(request, "cursor")
    if raw is None:
        return None
    try:
        if len(raw) > MAX_CURSOR:
            raise ValueError
        values = json.loads(base64.urlsafe_b64decode(raw.encode("ascii") + b"==="))
        if not (isinstance(values, list) and len(values) == len(key) and all(isinstance(v, str) for v in values)):
            raise ValueError
        return tuple(_cursor_value(column.type, value) for column, value in zip(key, values))
    except (ValueError, OverflowError, UnicodeError, binascii.Error):
        raise _bad_cursor() from None


def _cursor_value(kind: str, text: str) -> Any:
    text.encode("utf-8")  # lone surrogates cannot reach the database
    if kind == "timestamptz":
        moment = datetime.datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise ValueError
        # In UTC, as the database compares it: a time at the edge of the range in another zone
        # (0001-01-01T00:00:00+14:00) is outside it (OverflowError), so not a cursor.
        return moment.astimezone(datetime.UTC)
    if kind == "uuid":
        return uuid.UUID(text)
    if kind == "bigint":
        if not (text.isascii() and text.isdigit() and len(text) <= 19 and int(text) < 2**63):
            raise ValueError
        return int(text)
    assert kind == "text", kind
    return text


def _cursor_text(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime.datetime) else str(value)


def encode_cursor(key: Sequence[str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def after_prefix(prefix: str) -> str | None:
    """The least string greater than every string that starts with `prefix`, in code point (so
    UTF-8 byte) order; None when there is none (the prefix is all U+10FFFF)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are not characters
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


class ListQuery:
    """One page's SELECT: the conditions a request asked for, the keyset after its cursor, the
    order (ascending, or descending for newest first) and the limit; each value a parameter."""

    def __init__(self, select: str, key: Sequence[SortColumn], *, descending: bool = False) -> None:
        self.select = select  # "SELECT ... FROM ..." with joins, without WHERE
        self.key = tuple(key)
        self.descending = descending
        self.conditions: list[str] = []
        self.args: list[Any] = []

    def _arg(self, value: Any, cast: str | None = None) -> str:
        self.args.append(value)
        return f"${len(self.args)}" + (f"::{cast}" if cast else "")

    def where(self, condition: str, *values: Any) -> ListQuery:
        """A condition with one `{}` for each of `values` (each becomes a parameter)."""
        self.conditions.append(condition.format(*(self._arg(value) for value in values)))
        return self

    def starts_with(self, sql: str, prefix: str | None) -> ListQuery:
        """Only rows whose `sql` starts with `prefix` (no filter for None), as a range an index
        in the same collation serves (`sql` in byte order: `col COLLATE "C"`); `%` and `_` are
        plain characters here. `starts_with` decides exactly; the range only narrows the scan."""
        if prefix is None:
            return self
        low = self._arg(prefix, "text")
        past = after_prefix(prefix)
        below = f" AND {sql} < {self._arg(past, 'text')}" if past is not None else ""
        self.conditions.append(f"{sql} >= {low}{below} AND starts_with({sql}, {low})")
        return self

    def after(self, cursor: tuple | None) -> ListQuery:
        """Only rows past `cursor` (page_cursor's) in this list's order."""
        if cursor is not None:
            columns = ", ".join(column.sql for column in self.key)
            values = ", ".join(self._arg(value, column.type) for column, value in zip(self.key, cursor))
            self.conditions.append(f"({columns}) {'<' if self.descending else '>'} ({values})")
        return self

    def statement(self, limit: int) -> tuple[str, list[Any]]:
        """The SQL and its arguments for up to `limit + 1` rows (the extra one says more exist)."""
        where = " WHERE " + " AND ".join(self.conditions) if self.conditions else ""
        direction = " DESC" if self.descending else ""
        order = ", ".join(column.sql + direction for column in self.key)
        return f"{self.select}{where} ORDER BY {order} LIMIT ${len(self.args) + 1}", [*self.args, limit + 1]

    async def fetch(self, conn: asyncpg.Connection | asyncpg.Pool, limit: int) -> list[asyncpg.Record]:
        sql, args = self.statement(limit)
        return await conn.fetch(sql, *args, timeout=POOLED_QUERY_TIMEOUT_S)

    def cursor_of(self, row: Any) -> list[str]:
        return [_cursor_text(row[column.row]) for column in self.key]

    def page(self, rows: Sequence[Any], limit: int, item: Callable[[Any], Any],
             keep: Callable[[Any], bool] = lambda row: True) -> dict[str, Any]:
        return page(rows, limit, item, self.cursor_of, keep)


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
