"""writer/pagination.py without a server: a prefix's range holds exactly the strings that start
with it (code point order is UTF-8 byte order, PostgreSQL's COLLATE "C"); ListQuery's SQL holds
only the conditions asked for, the keyset in the list's direction; cursors are checked to be of
the list's key."""

from __future__ import annotations

import datetime
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starlette.requests import Request

from arkvory.shared.errors import InvalidInput
from arkvory.shared.http.query import checked_query
from arkvory.writer.pagination import TIME_ID, ListQuery, SortColumn, after_prefix, encode_cursor, page_cursor

characters = st.characters(blacklist_categories=("Cs",))  # what UTF-8, and PostgreSQL, can hold
edges = st.sampled_from(["\U0010ffff", "\ud7ff", "\ue000", "\x7f", "~", "z", "\uffff", "\U00010000"])


@settings(max_examples=500, derandomize=True, database=None)
@given(prefix=st.text(st.one_of(characters, edges), min_size=1, max_size=6),
       text=st.text(st.one_of(characters, edges), max_size=8))
def test_the_prefix_range_holds_exactly_what_starts_with_it(prefix, text):
    past = after_prefix(prefix)
    in_range = prefix <= text and (past is None or text < past)
    assert in_range == text.startswith(prefix)
    assert past is None or not 0xD800 <= ord(past[-1]) <= 0xDFFF


def test_successors_at_the_edges_of_the_code_points():
    assert after_prefix("ab") == "ac"
    assert after_prefix("a\ud7ff") == "a\ue000"  # past the surrogates
    assert after_prefix("a\U0010ffff") == "b"
    assert after_prefix("\U0010ffff\U0010ffff") is None  # no upper bound: `>=` alone
    assert after_prefix("%") == "&" and after_prefix("_") == "`"


def test_a_query_holds_only_the_conditions_asked_for():
    listing = ListQuery("SELECT * FROM t", TIME_ID)
    assert listing.statement(10) == ("SELECT * FROM t ORDER BY created_at, id LIMIT $1", [11])
    moment, row_id = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC), uuid.UUID(int=1)
    newest = ListQuery("SELECT * FROM t", TIME_ID, descending=True).where("r = {}", "x")
    newest.starts_with('name COLLATE "C"', "a_%").after((moment, row_id))
    sql, args = newest.statement(5)
    assert sql == (
        'SELECT * FROM t WHERE r = $1 AND name COLLATE "C" >= $2::text AND name COLLATE "C" < $3::text'
        ' AND starts_with(name COLLATE "C", $2::text) AND (created_at, id) < ($4::timestamptz, $5::uuid)'
        " ORDER BY created_at DESC, id DESC LIMIT $6"
    )
    assert args == ["x", "a_%", "a_&", moment, row_id, 6]
    assert "<" not in ListQuery("SELECT 1", TIME_ID).starts_with("p", "\U0010ffff").statement(1)[0].split("ORDER")[0]


def test_the_next_cursor_is_the_last_rows_key_and_reads_back():
    listing = ListQuery("SELECT 1", (SortColumn("p", "published_at", "timestamptz"), SortColumn("n", "name")))
    rows = [{"published_at": datetime.datetime(2026, 1, 1, i, tzinfo=datetime.UTC), "name": f"n{i}"} for i in range(3)]
    page = listing.page(rows, 2, lambda row: row["name"])
    assert page == {"items": ["n0", "n1"], "nextCursor": encode_cursor(["2026-01-01T01:00:00+00:00", "n1"])}
    assert listing.page(rows, 3, lambda row: row["name"])["nextCursor"] is None


@pytest.mark.parametrize("raw", [
    encode_cursor(["2026-01-01T00:00:00", str(uuid.UUID(int=1))]),  # no time zone
    encode_cursor(["x", str(uuid.UUID(int=1))]),
    encode_cursor(["2026-01-01T00:00:00+00:00", "not-a-uuid"]),
    encode_cursor(["2026-01-01T00:00:00+00:00"]),  # another list's key
    encode_cursor(["\ud800", str(uuid.UUID(int=1))]),
    "WzEsIDJd",  # [1, 2]
    "garbage",
])
def test_a_cursor_of_another_shape_is_refused(raw):
    scope = {"type": "http", "query_string": f"cursor={raw}".encode(), "headers": []}
    checked_query(scope, {"cursor"}, "GET /x")
    with pytest.raises(InvalidInput, match="not a cursor this list returned"):
        page_cursor(Request(scope), TIME_ID)
