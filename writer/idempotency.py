"""Safe retries of changes (SPEC §6 "Idempotency"): a client token recorded with its result.

A mutating route reads and checks its input, then hands its change to `idempotent`:

    async def create_thing(request: Request) -> Response:
        principal = await principal_of(request)          # before taking a pool connection
        body = await json_body(request)
        ...check body...

        async def work(conn: asyncpg.Connection) -> Result:
            row = await conn.fetchrow("INSERT ... RETURNING ...", ..., timeout=POOLED_QUERY_TIMEOUT_S)
            return Result(201, thing_json(row), {"Location": f"/api/v1/things/{row['id']}"})

        return await idempotent(request, principal, {"body": body}, work)

`work(conn)` runs inside one transaction on the connection it is given; it may also return a
tuple `(status, json_body)` or `(status, json_body, headers)` (`json_body` None for no body).
The third argument holds what else identifies the request besides its method, route template and
path parameters (those are always part of the fingerprint): the parsed JSON body, the query
parameters the route reads, the digest of a streamed body. It must be JSON-serialisable.

Without an `Idempotency-Key` header the work just runs in a transaction. With one:

- the key must be 1-64 printable ASCII characters (case-sensitive), else 400 `invalid_input`;
- it is scoped to the principal (two principals may use the same key independently);
- a recorded, unexpired result for the key is replayed as it was (status, JSON body, `Location`
  and the other headers the work returned), with `Idempotent-Replayed: true` and without doing
  the work; a recorded key with another fingerprint is 422 `IdempotentParameterMismatch`;
- while a request with the key is still running, a duplicate gets 409 `idempotency_key_in_use`
  at once;
- a key older than `ARKVORY_IDEMPOTENCY_RETENTION` is ignored at once (the request runs anew)
  and deleted later by `delete_expired`, which the cleanup task calls.

Every change run here is recorded in the audit trail (writer/audit/) in the same transaction,
after the work: a change rolled back has no entry, a replay makes none.

Why a crash cannot make the work happen twice: the key row and the result are inserted in the
same transaction as the change. Either both are committed (a retry replays) or neither is (a retry
does the work for the first time). A failed request (an `ApiError` from the work, or any
exception) rolls back and records nothing: its change did not happen, so a retry runs again.

Routes that stream a body before they can change anything (uploads) hold the key for the whole
stream, so a concurrent duplicate gets 409 at once instead of streaming a second copy, and record
the result in their publishing transaction:

    async with holding_key(request, principal) as held:   # 400 bad key, 409 key in use
        sha256, size = await receive_into_store(...)       # a retry re-sends: the blob is
                                                           # content-addressed, so that is harmless
        return await held.run({"query": {...}, "sha256": sha256}, publish)

`held.run` replays a recorded result (or answers 422) before calling `publish`; the body digest
is part of the fingerprint, so the same key with other bytes is a mismatch.

Concurrency: only one writer runs per database (its advisory lock), so the keys in flight are
known in this process (`InFlightKeys`, one per app); a transaction-scoped advisory lock on a hash
of (principal, key), taken with `pg_try_advisory_xact_lock` before anything else in the recording
transaction, and the primary key of the table make it hold across processes too. Replays of
results this writer recorded or read lately come from memory (`RecordedResults`, which says why
that is exact); otherwise a replay is one indexed lookup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Conflict, IdempotencyKeyInUse, IdempotentParameterMismatch, InvalidInput

from .audit.actions import record_request
from .audit.trail import actor_of

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
_KEY = re.compile(r"[\x20-\x7e]{1,64}")
# Response headers a replay repeats; everything else (X-Request-Id, Date) belongs to the retry.
_RECORDED_HEADERS = frozenset({"location", "etag", "content-location"})


@dataclasses.dataclass(frozen=True)
class Result:
    """What a change answers: recorded with the key, replayed as is."""

    status: int
    body: Any = None  # JSON-serialisable, or None for no body (204)
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def encoded(self) -> bytes | None:
        return None if self.body is None else json.dumps(self.body, separators=(",", ":")).encode()


Work = Callable[[asyncpg.Connection], Awaitable["Result | tuple"]]


class InFlightKeys:
    """(principal, key) pairs whose request is running in this process."""

    def __init__(self) -> None:
        self._held: set[tuple[str, str]] = set()

    @contextlib.contextmanager
    def hold(self, principal_id: str, key: str):
        entry = (principal_id, key)
        if entry in self._held:
            raise IdempotencyKeyInUse("a request with this Idempotency-Key is still running; retry after it ends")
        self._held.add(entry)
        try:
            yield
        finally:
            self._held.discard(entry)


@dataclasses.dataclass(frozen=True)
class _Recorded:
    fingerprint: str
    status: int
    body: bytes | None
    headers: dict[str, str]
    deadline: float  # local monotonic time by which the row has surely not expired yet


class RecordedResults:
    """Recently recorded results, so that a replay on this writer costs no query.

    Exact, not a guess: only this process records keys (one writer per database, held by its
    advisory lock), a recorded row never changes before it expires, an entry is added only after
    its transaction committed, and it is dropped no later than the row expires by the database's
    clock (its deadline is measured as time left, from a local instant taken before the database
    read `now()`). A new writer starts empty and reads the table. Bounded in entries and bytes.
    """

    def __init__(self, capacity: int = 4096, max_body: int = 16 * 1024, clock=time.monotonic) -> None:
        self._entries: OrderedDict[tuple[str, str], _Recorded] = OrderedDict()
        self._capacity = capacity
        self._max_body = max_body
        self.clock = clock

    def get(self, principal_id: str, key: str) -> _Recorded | None:
        entry = self._entries.get((principal_id, key))
        if entry is None:
            return None
        if self.clock() >= entry.deadline:
            del self._entries[(principal_id, key)]
            return None
        return entry

    def put(self, principal_id: str, key: str, entry: _Recorded) -> None:
        if entry.body is not None and len(entry.body) > self._max_body:
            return
        self._entries[(principal_id, key)] = entry
        self._entries.move_to_end((principal_id, key))
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)


def key_of(request: Request) -> str | None:
    """The request's Idempotency-Key, checked; None when it sent none."""
    values = request.headers.getlist(HEADER)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidInput("send at most one Idempotency-Key header")
    key = values[0]
    if not _KEY.fullmatch(key):
        raise InvalidInput("Idempotency-Key must be 1-64 printable ASCII characters")
    return key


def fingerprint(request: Request, parts: Any) -> str:
    """SHA-256 of the method, route template, path parameters and the route's own parts."""
    route = request.scope.get("route")
    template = route.path if route is not None else request.url.path
    canonical = json.dumps(
        [request.method, template, request.path_params, parts],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,  # lone surrogates in a body must not break the encoding
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _lock_ids(principal_id: str, key: str) -> tuple[int, int]:
    """Two int4 halves of a hash: the two-key advisory lock space (objsubid 2) is apart from
    the single-bigint one the writer, maintenance and migration locks use."""
    digest = hashlib.sha256(f"{principal_id}\0{key}".encode()).digest()
    return (int.from_bytes(digest[:4], "big", signed=True), int.from_bytes(digest[4:8], "big", signed=True))


def _as_result(value: Result | tuple) -> Result:
    if isinstance(value, Result):
        return value
    return Result(*value)


def _response(result: Result, body: bytes | None, replayed: bool) -> Response:
    headers = dict(result.headers)
    if replayed:
        headers[REPLAYED_HEADER] = "true"
    if body is None:
        return Response(status_code=result.status, headers=headers)
    return Response(body, status_code=result.status, headers=headers, media_type="application/json")


_LOOKUP = (
    "SELECT fingerprint, status, body, headers, extract(epoch FROM expires_at - now())::float8 AS seconds_left"
    " FROM arkvory_idempotency_keys WHERE principal_id = $1 AND key = $2 AND expires_at > now()"
)


def _from_row(row: asyncpg.Record, started: float) -> _Recorded:
    body = None if row["body"] is None else row["body"].encode()
    return _Recorded(row["fingerprint"], row["status"], body, json.loads(row["headers"]), started + row["seconds_left"])


def _replay(recorded: _Recorded, expected: str) -> Response:
    if recorded.fingerprint != expected:
        raise IdempotentParameterMismatch(
            "this Idempotency-Key was used for another request; reuse its parameters or send a new key"
        )
    return _response(Result(recorded.status, None, recorded.headers), recorded.body, replayed=True)


def _results(request: Request) -> RecordedResults:
    return request.app.state.idempotency_results


@dataclasses.dataclass
class HeldKey:
    """A key reserved in this process for one request; `run` records the outcome with it."""

    request: Request
    principal: Principal
    key: str | None

    async def run(self, parts: Any, work: Work) -> Response:
        runtime = self.request.app.state.runtime
        pool = runtime.pool
        assert pool is not None
        if self.key is None:
            async with pooled(pool) as conn, conn.transaction():
                result = _as_result(await work(conn))
                await self._audit(conn, parts, result)
            return _response(result, result.encoded(), replayed=False)
        expected = fingerprint(self.request, parts)
        results = _results(self.request)
        # Before the transaction (and so before its now()): the row expires after this + retention.
        started = results.clock()
        async with pooled(pool) as conn:
            async with conn.transaction():
                locked = await conn.fetchval(
                    "SELECT pg_try_advisory_xact_lock($1, $2)",
                    *_lock_ids(self.principal.id, self.key),
                    timeout=POOLED_QUERY_TIMEOUT_S,
                )
                if not locked:
                    raise IdempotencyKeyInUse("a request with this Idempotency-Key is still running; retry after it ends")
                # Under the lock: a request that finished since any earlier lookup is seen now.
                row = await conn.fetchrow(_LOOKUP, self.principal.id, self.key, timeout=POOLED_QUERY_TIMEOUT_S)
                if row is not None:
                    return _replay(_from_row(row, results.clock()), expected)
                result = _as_result(await work(conn))
                await self._audit(conn, parts, result)
                body = result.encoded()
                recorded = {k: v for k, v in result.headers.items() if k.lower() in _RECORDED_HEADERS}
                # An expired row for the key is replaced; a live one cannot exist under the lock,
                # and if it did the insert returns nothing and the change is rolled back.
                stored = await conn.fetchval(
                    "INSERT INTO arkvory_idempotency_keys"
                    " (principal_id, key, fingerprint, status, body, headers, expires_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, now() + $7 * interval '1 second')"
                    " ON CONFLICT (principal_id, key) DO UPDATE SET fingerprint = excluded.fingerprint,"
                    " status = excluded.status, body = excluded.body, headers = excluded.headers,"
                    " created_at = now(), expires_at = excluded.expires_at"
                    " WHERE arkvory_idempotency_keys.expires_at <= now()"
                    " RETURNING true",
                    self.principal.id,
                    self.key,
                    expected,
                    result.status,
                    None if body is None else body.decode(),
                    json.dumps(recorded),
                    runtime.settings.idempotency_retention_s,
                    timeout=POOLED_QUERY_TIMEOUT_S,
                )
                if not stored:
                    raise Conflict("a concurrent request recorded this Idempotency-Key; retry to see its result")
        # Committed: from now on a replay may come from memory.
        deadline = started + runtime.settings.idempotency_retention_s
        results.put(self.principal.id, self.key, _Recorded(expected, result.status, body, recorded, deadline))
        return _response(result, body, replayed=False)

    async def _audit(self, conn: asyncpg.Connection, parts: Any, result: Result) -> None:
        """The change's audit entry (writer/audit/), in its transaction: committed with it or
        not at all. A replay changes nothing and records nothing."""
        await record_request(conn, self.request, actor_of(self.principal), result.status, parts, result.body)


@contextlib.asynccontextmanager
async def holding_key(request: Request, principal: Principal) -> AsyncIterator[HeldKey]:
    """Reserve the request's Idempotency-Key (if any) in this process until the block ends."""
    key = key_of(request)
    if key is None:
        yield HeldKey(request, principal, None)
        return
    keys: InFlightKeys = request.app.state.idempotency_keys
    with keys.hold(principal.id, key):
        yield HeldKey(request, principal, key)


async def idempotent(request: Request, principal: Principal, parts: Any, work: Work) -> Response:
    """Run `work(conn)` in a transaction, recording and replaying it by Idempotency-Key."""
    key = key_of(request)
    if key is not None:
        # A retry of a finished change is not held (any number of replays of one key may run at
        # once) and costs one indexed lookup, or none when this writer recorded or read it
        # lately. Rows are committed together with their result, so any row found is complete.
        results = _results(request)
        recorded = results.get(principal.id, key)
        if recorded is None:
            pool = request.app.state.runtime.pool
            assert pool is not None
            started = results.clock()
            async with pooled(pool) as conn:
                row = await conn.fetchrow(_LOOKUP, principal.id, key, timeout=POOLED_QUERY_TIMEOUT_S)
            if row is not None:
                recorded = _from_row(row, started)
                results.put(principal.id, key, recorded)
        if recorded is not None:
            return _replay(recorded, fingerprint(request, parts))
    async with holding_key(request, principal) as held:
        return await held.run(parts, work)


async def delete_expired(conn: asyncpg.Connection, batch: int = 10_000) -> int:
    """Delete up to `batch` expired keys (for the cleanup task); returns how many went.
    Expired keys are already ignored by lookups, so this only reclaims space."""
    status = await conn.execute(
        "DELETE FROM arkvory_idempotency_keys WHERE ctid IN (SELECT ctid FROM arkvory_idempotency_keys"
        " WHERE expires_at <= now() LIMIT $1)",
        batch,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return int(status.split()[-1])
