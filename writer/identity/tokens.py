"""Personal tokens (`pat_<id>.<secret>`, for an account) on the writer, and what they share with
managed service keys (service_keys.py): making, listing, revoking (SPEC §5).

The token is in the creation answer once and nowhere else: only its SHA-256 is stored, lists
never show it. Revoking deletes the row; the delete notifies every process, which forget what
they cached (shared/auth/credentials.py), so the next request with it is 401 everywhere.

A credential never makes one that outlives it (SPEC §5): the new one's expiry is capped at its
maker's, sessions included, the answer's `expiresAt` says what was granted, and it is revoked
with its maker (credential_makers.py: logout, revocation, a password change, a disable). A
keys-file key has no expiry (it lasts until the operator removes it from the file), so what it
makes is bounded only by `MAX_EXPIRY_S`. An account that wants a token to outlive its session (a
CI token made in the console) re-enters its password in the request (`password`): then the
password, not the session, makes it, as a login makes a session (accounts.confirm_password,
with its limits); it still ends with the account (a disable). Nor does a credential make one with
more access: a `read` token makes none, and only an administrator makes service keys.

An account holds at most ARKVORY_MAX_TOKENS_PER_ACCOUNT live personal tokens (no principal
fills the credentials table): one more is refused with 409 until one is revoked or expires, and
a create forgets the account's expired tokens. Lists page like every other list (pagination.py).

Creation answers hold the secret, so they are never recorded with an Idempotency-Key (the key is
checked, see accounts.py); a retry makes a second token and the lost one can be revoked from
the list. Revocation records its key like every other change.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import forget_cached, mint
from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import check_text, parse_uuid
from arkvory.shared.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized

from .. import openapi
from ..audit.actions import record_request
from ..audit.trail import actor_of
from .accounts import confirm_password
from .credential_makers import making_of
from ..idempotency import idempotent, key_of
from ..pagination import NEWEST, OLDEST, ListQuery, SortColumn, page_cursor, page_limit, page_order, text_filter
from .passwords import MAX_PASSWORD
from ..request_inputs import json_body, principal_of, runtime_of

DEFAULT_EXPIRY_S = 90 * 86400
MAX_EXPIRY_S = 366 * 86400
MAX_LABEL = 200
ACCESS = ("read", "read-write")
# What lists and answers show of a credential `c`, with the name of its maker account `m`.
COLUMNS = (
    "c.id, c.kind, c.label, c.access, c.scopes, c.created_by, c.created_at, c.expires_at, c.last_used_at,"
    " c.made_through, c.password_given, c.ends_with, c.suspended_at, m.name AS maker_account"
)
WITH_MAKER = "LEFT JOIN arkvory_accounts m ON m.id = c.maker_account_id"


def _iso(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def credential_json(row: asyncpg.Record) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(row["id"]),
        "label": row["label"],
        "createdBy": row["created_by"],
        "createdAt": _iso(row["created_at"]),
        "expiresAt": _iso(row["expires_at"]),
        "lastUsedAt": _iso(row["last_used_at"]),
        # Who made it (SPEC §5): null where a credential older than these records does not say.
        "makerAccount": row["maker_account"],
        "madeThrough": row["made_through"],
        "passwordGiven": row["password_given"],
        "endsWith": None if row["ends_with"] is None else str(row["ends_with"]),
    }
    if row["kind"] == "pat":
        body["access"] = row["access"]
    else:
        body["scopes"] = list(row["scopes"])
        body["suspendedAt"] = _iso(row["suspended_at"])
    return body


def label_of(body: dict[str, Any]) -> str:
    label = body.get("label", "")
    if not isinstance(label, str):
        raise InvalidInput("'label' must be a string")
    return check_text(label, "'label'", MAX_LABEL) if label else ""


def expiry_of(body: dict[str, Any]) -> int:
    seconds = body.get("expiresInSeconds", DEFAULT_EXPIRY_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= MAX_EXPIRY_S:
        raise InvalidInput(f"'expiresInSeconds' must be an integer of 1-{MAX_EXPIRY_S}")
    return seconds


# The new credential expires when asked, but never after the credential it ends with (`$13`,
# its maker when no password was given; NULL otherwise): capped in the same statement that reads
# that maker, so a maker revoked, expired or suspended meanwhile makes nothing (no row).
_INSERT_CAPPED = f"""
WITH c AS (
    INSERT INTO arkvory_credentials (id, kind, digest, account_id, label, access, scopes, created_by, expires_at,
                                     maker_account_id, made_through, password_given, ends_with)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, least(now() + make_interval(secs => $9), maker.expires_at),
           $10, $11, $12, $13
    FROM (SELECT $13::uuid AS id) wanted LEFT JOIN arkvory_credentials maker ON maker.id = wanted.id
    WHERE wanted.id IS NULL OR (maker.expires_at > now() AND maker.suspended_at IS NULL)
    RETURNING *
)
SELECT {COLUMNS} FROM c {WITH_MAKER}
"""
MAKER_GONE = "the credential making this one was revoked, expired or suspended meanwhile"


async def password_reentered(request: Request, principal: Principal, body: dict[str, Any]) -> bool:
    """Whether the account re-entered its password (checked: 401 when wrong): then the password,
    not the request's credential, makes the new one (credential_makers.py)."""
    password = body.get("password")
    if password is None:
        return False
    if not isinstance(password, str) or not 1 <= len(password) <= MAX_PASSWORD:
        raise InvalidInput(f"'password' must be a string of 1-{MAX_PASSWORD} characters")
    if principal.account_id is None:
        raise InvalidInput("'password' is an account's; what a service key makes ends with it")
    await confirm_password(request, principal, password, "the password is wrong")
    return True


async def create_credential(
    request: Request, kind: str, account_id: uuid.UUID | None, principal: Principal,
    label: str, expires_in: int, access: str | None, scopes: list[str], password_given: bool,
) -> Response:
    """Capping rather than refusing: the answer's `expiresAt` is the real expiry, so a client
    sees at once what it got, and a default lifetime keeps working from a short-lived session."""
    new = mint(kind)
    runtime = runtime_of(request)
    pool = runtime.pool
    assert pool is not None
    purged = False
    async with pooled(pool) as conn, conn.transaction():
        making = await making_of(conn, principal, password_given)
        if kind == "pat":
            assert account_id is not None
            purged = await _make_room(conn, account_id, runtime.settings.max_tokens_per_account)
        try:
            row = await conn.fetchrow(
                _INSERT_CAPPED,
                new.id, kind, new.digest, account_id, label, access, scopes, principal.id, float(expires_in),
                making.account_id, making.through, making.password_given, making.ends_with,
                timeout=POOLED_QUERY_TIMEOUT_S,
            )
        except asyncpg.ForeignKeyViolationError:
            raise Unauthorized(MAKER_GONE) from None  # deleted between the read and the insert
        if row is None:
            raise Unauthorized(MAKER_GONE)
        made = {"label": label, "expiresInSeconds": expires_in, "passwordGiven": password_given,
                **({"access": access} if kind == "pat" else {"scopes": scopes})}
        await record_request(conn, request, actor_of(principal), 201, made, credential_json(row))
    if purged:
        forget_cached(runtime.credentials)
    return JSONResponse(
        {**credential_json(row), "token": new.token}, status_code=201, headers={"Cache-Control": "no-store"}
    )


async def _make_room(conn: asyncpg.Connection, account_id: uuid.UUID, limit: int) -> bool:
    """Refuse (409) a personal token past the account's `limit` of live ones; forget its expired
    ones (they only fill the table: nothing else removes them). True if some were deleted.

    Runs in the creating transaction, under the lock on the account's row that `making_of`
    took: two creates of one account count one after the other, so at `limit - 1` only one of
    them passes."""
    # At most `limit` live rows plus those expired since the last create: a bounded count.
    counts = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE expires_at > now()) AS live, count(*) FILTER (WHERE expires_at <= now())"
        " AS expired FROM arkvory_credentials WHERE account_id = $1 AND kind = 'pat'",
        account_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    if counts["live"] >= limit:
        raise Conflict(
            f"this account already holds {counts['live']} live personal tokens, the most it may"
            f" (ARKVORY_MAX_TOKENS_PER_ACCOUNT={limit}): revoke one it no longer needs (DELETE"
            " /api/v1/tokens/{id}, `arkvory token revoke ID`, or the console's tokens page) and"
            " try again; expired tokens do not count"
        )
    if not counts["expired"]:
        return False  # no DELETE: even an empty one notifies every process to flush its cache
    await conn.execute(
        "DELETE FROM arkvory_credentials WHERE account_id = $1 AND kind = 'pat' AND expires_at <= now()",
        account_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    return True


def _token_owner(principal: Principal) -> uuid.UUID:
    if principal.is_anonymous:
        raise Unauthorized("log in first")
    if principal.account_id is None:
        raise Forbidden("personal tokens belong to accounts; service keys use /api/v1/keys")
    return principal.account_id


async def create_token(request: Request) -> Response:
    principal = await principal_of(request)
    account_id = _token_owner(principal)
    if principal.read_only:
        raise Forbidden("a read-only token cannot make tokens")
    key_of(request)
    body = await json_body(request)
    access = body.get("access", "read")
    if access not in ACCESS:
        raise InvalidInput("'access' must be 'read' or 'read-write'")
    label, expires_in = label_of(body), expiry_of(body)
    password_given = await password_reentered(request, principal, body)
    return await create_credential(request, "pat", account_id, principal, label, expires_in, access, [], password_given)


async def list_tokens(request: Request) -> Response:
    principal = await principal_of(request)
    account_id = _token_owner(principal)
    return await credential_page(request, "c.account_id = {} AND c.kind = 'pat'", account_id)


CREDENTIAL_ORDER = (SortColumn("c.created_at", "created_at", "timestamptz"), SortColumn("c.id", "id", "uuid"))


def credentials_listing(condition: str, *values: Any, order: str = OLDEST, prefix: str | None = None,
                        cursor: tuple | None = None) -> ListQuery:
    """One page of the credentials that `condition` picks (on `c`, a `{}` per value), oldest or
    newest first, `prefix` of their label. Tokens are few per account (ARKVORY_MAX_TOKENS_PER_ACCOUNT)
    and service keys have an index of their own in either order."""
    listing = ListQuery(f"SELECT {COLUMNS} FROM arkvory_credentials c {WITH_MAKER}", CREDENTIAL_ORDER,
                        descending=order == NEWEST)
    listing.where(condition, *values).starts_with('c.label COLLATE "C"', prefix)
    return listing.after(cursor)


async def credential_page(request: Request, condition: str, *values: Any) -> Response:
    """The page the request asks for of the credentials that `condition` picks (credentials_listing)."""
    pool = runtime_of(request).pool
    assert pool is not None
    limit = page_limit(request)
    listing = credentials_listing(
        condition, *values, order=page_order(request, OLDEST), prefix=text_filter(request, "prefix", MAX_LABEL),
        cursor=page_cursor(request, CREDENTIAL_ORDER),
    )
    async with pooled(pool) as conn:
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, credential_json))


async def revoke_credential(request: Request, principal: Principal, kind: str, owner: uuid.UUID | None) -> Response:
    credential_id = parse_uuid(request.path_params["id"], "id")

    async def work(conn: asyncpg.Connection):
        deleted = await conn.fetchval(
            "DELETE FROM arkvory_credentials WHERE id = $1 AND kind = $2"
            " AND ($3::uuid IS NULL OR account_id = $3) RETURNING id",
            credential_id, kind, owner,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if deleted is None:
            raise NotFound(f"no {'token' if kind == 'pat' else 'key'} {credential_id}")
        return 204, None

    answer = await idempotent(request, principal, {}, work)
    forget_cached(runtime_of(request).credentials)
    return answer


async def revoke_token(request: Request) -> Response:
    principal = await principal_of(request)
    if principal.is_admin:
        # An administrator (account or key) may revoke anyone's token; others only their own.
        return await revoke_credential(request, principal, "pat", None)
    account_id = _token_owner(principal)
    if principal.read_only:
        raise Forbidden("a read-only token cannot revoke tokens")
    return await revoke_credential(request, principal, "pat", account_id)


routes = [
    Route("/api/v1/tokens", create_token, methods=["POST"]),
    Route("/api/v1/tokens", list_tokens, methods=["GET"]),
    Route("/api/v1/tokens/{id}", revoke_token, methods=["DELETE"]),
]


CREDENTIAL_SCHEMA = {
    "type": "object",
    "required": ["id", "label", "createdBy", "createdAt", "expiresAt", "lastUsedAt", "makerAccount", "madeThrough",
                 "passwordGiven", "endsWith"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "label": {"type": "string"},
        "createdBy": {"type": "string", "description": "the principal that made it"},
        "createdAt": {"type": "string", "format": "date-time"},
        "expiresAt": {"type": "string", "format": "date-time"},
        "lastUsedAt": {"type": ["string", "null"], "format": "date-time", "description": "recorded every few seconds"},
        "makerAccount": {"type": ["string", "null"], "description": "the account that made it and answers"
                         " for it (a key made by a managed key: that key's); null: a keys-file key, or not recorded"},
        "madeThrough": {"type": ["string", "null"], "description": "the credential that asked for it:"
                        " session:<id>, pat:<id>, service_key:<id> or keys_file:<key id>; null: not recorded"},
        "passwordGiven": {"type": ["boolean", "null"], "description": "whether the account's password was"
                          " given again (then it may outlive the credential that asked); null: not recorded"},
        "endsWith": {"type": ["string", "null"], "format": "uuid", "description": "the credential whose end"
                     " (logout, expiry, revocation) revokes this one"},
        "access": {"type": "string", "enum": list(ACCESS), "description": "personal tokens"},
        "scopes": {"type": "array", "items": {"type": "string"}, "description": "service keys"},
        "suspendedAt": {"type": ["string", "null"], "format": "date-time", "description": "service keys: when"
                        " its maker account was disabled; refused until an admin adopts it"},
    },
}
CREATED_SCHEMA = {**CREDENTIAL_SCHEMA, "required": [*CREDENTIAL_SCHEMA["required"], "token"],
                  "properties": {**CREDENTIAL_SCHEMA["properties"], "token": {"type": "string", "description": "shown once"}}}
EXPIRY_SCHEMA = {"type": "integer", "minimum": 1, "maximum": MAX_EXPIRY_S, "default": DEFAULT_EXPIRY_S,
                 "description": "capped at the expiry of the credential making it (see expiresAt in the answer)"}
LABEL_SCHEMA = {"type": "string", "maxLength": MAX_LABEL}
PASSWORD_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_PASSWORD,
                   "description": "an account's own password, re-entered: the credential may then outlive the"
                   " session or token that asks (without it, it expires and is revoked with that one; with it,"
                   " it still ends with the account); limited like logins: 401 when wrong, 429"}
ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}


def credential_family(what: str, create_body: dict[str, Any], who: str, *create_errors: int, limit: str = "") -> dict[str, Any]:
    return {
        "post": {
            "summary": f"Create a {what} ({who}); the token is in this answer only (never recorded by"
            f" Idempotency-Key){limit}",
            "parameters": [openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body(create_body),
            "responses": {"201": {"description": "Created", "content": openapi.json_content(CREATED_SCHEMA)},
                          **openapi.errors(400, 401, 403, *create_errors, 413, 429)},
        },
        "get": {
            "summary": f"List {what}s ({who}), oldest (or newest) first, one page at a time; never the token",
            "parameters": [openapi.prefix_param("label", MAX_LABEL), openapi.order_param("oldest", sorted_by="creation"),
                           *openapi.page_params()],
            "responses": {"200": {"description": "One page", "content": openapi.json_content(openapi.page_of(CREDENTIAL_SCHEMA))},
                          **openapi.errors(400, 401, 403)},
        },
    }


def revocation(what: str) -> dict[str, Any]:
    return {"delete": {
        "summary": f"Revoke a {what}, and what it made without the password given again: the next request"
        " with any of them fails on every process",
        "parameters": [ID_PARAM, openapi.IDEMPOTENCY_KEY],
        "responses": {"204": {"description": "Revoked"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
    }}


OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/tokens": credential_family("personal token", {"type": "object", "properties": {
        "label": LABEL_SCHEMA, "access": {"type": "string", "enum": list(ACCESS), "default": "read"},
        "expiresInSeconds": EXPIRY_SCHEMA, "password": PASSWORD_SCHEMA}}, "an account's session or read-write token", 409,
        limit="; 409 when the account holds ARKVORY_MAX_TOKENS_PER_ACCOUNT live tokens already (revoke one;"
        " expired ones do not count)"),
    "/api/v1/tokens/{id}": revocation("personal token (yours; an admin: anyone's)"),
}
