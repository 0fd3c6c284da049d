"""Personal tokens (`pat_<id>.<secret>`, for an account) and managed service keys
(`arkvory_<uuid>.<secret>`, scoped like the keys file) on the writer (SPEC §5).

The token is in the creation answer once and nowhere else: only its SHA-256 is stored, lists
never show it. Revoking deletes the row; the delete notifies every process, which forget what
they cached (shared/auth/credentials.py), so the next request with it is 401 everywhere.

A credential never makes one that outlives it (SPEC §5): the new one's expiry is capped at its
maker's, sessions included, and the answer's `expiresAt` says what was granted. A keys-file key
has no expiry (it lasts until the operator removes it from the file), so what it makes is bounded
only by `MAX_EXPIRY_S`. An account that wants a token to outlive its session (a CI token made
in the console) re-enters its password in the request (`password`): then the password, not the
session, makes it, as a login makes a session (accounts.confirm_password, with its limits).
Nor does a credential make one with more access: a `read` token makes none, and only an
administrator makes service keys.

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
from arkvory.shared.auth.identity import Principal, is_scope
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import check_text, parse_uuid
from arkvory.shared.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized

from . import openapi
from .accounts import confirm_password
from .idempotency import idempotent, key_of
from .pagination import page, page_limit, time_id_cursor, time_id_key
from .passwords import MAX_PASSWORD
from .repositories import json_body, principal_of, require_admin_scope, runtime_of

DEFAULT_EXPIRY_S = 90 * 86400
MAX_EXPIRY_S = 366 * 86400
MAX_LABEL = 200
MAX_SCOPES = 100
ACCESS = ("read", "read-write")
_COLUMNS = "id, kind, label, access, scopes, created_by, created_at, expires_at, last_used_at"


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
    }
    if row["kind"] == "pat":
        body["access"] = row["access"]
    else:
        body["scopes"] = list(row["scopes"])
    return body


def _label(body: dict[str, Any]) -> str:
    label = body.get("label", "")
    if not isinstance(label, str):
        raise InvalidInput("'label' must be a string")
    return check_text(label, "'label'", MAX_LABEL) if label else ""


def _expiry(body: dict[str, Any]) -> int:
    seconds = body.get("expiresInSeconds", DEFAULT_EXPIRY_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= MAX_EXPIRY_S:
        raise InvalidInput(f"'expiresInSeconds' must be an integer of 1-{MAX_EXPIRY_S}")
    return seconds


# The new credential expires when asked, but never after the credential that makes it
# (`$10`; NULL for a keys-file key, which has no expiry): capped in the same statement that
# reads the creator, so a creator revoked or expired meanwhile makes nothing (no row).
_INSERT_CAPPED = f"""
INSERT INTO arkvory_credentials (id, kind, digest, account_id, label, access, scopes, created_by, expires_at)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, least(now() + make_interval(secs => $9), creator.expires_at)
FROM (SELECT $10::uuid AS id) wanted LEFT JOIN arkvory_credentials creator ON creator.id = wanted.id
WHERE wanted.id IS NULL OR creator.expires_at > now()
RETURNING {_COLUMNS}
"""


async def _maker(request: Request, principal: Principal, body: dict[str, Any]) -> uuid.UUID | None:
    """The credential whose expiry caps the new one: the request's own (None for a keys-file
    key), or none when the account re-entered its password."""
    password = body.get("password")
    if password is None:
        return principal.credential_id
    if not isinstance(password, str) or not 1 <= len(password) <= MAX_PASSWORD:
        raise InvalidInput(f"'password' must be a string of 1-{MAX_PASSWORD} characters")
    if principal.account_id is None:
        raise InvalidInput("'password' is an account's; what a service key makes ends with it")
    await confirm_password(request, principal, password, "the password is wrong")
    return None


async def _create(
    request: Request, kind: str, account_id: uuid.UUID | None, principal: Principal,
    label: str, expires_in: int, access: str | None, scopes: list[str], maker: uuid.UUID | None,
) -> Response:
    """Capping rather than refusing: the answer's `expiresAt` is the real expiry, so a client
    sees at once what it got, and a default lifetime keeps working from a short-lived session."""
    new = mint(kind)
    runtime = runtime_of(request)
    pool = runtime.pool
    assert pool is not None
    purged = False
    async with pooled(pool) as conn, conn.transaction():
        if kind == "pat":
            assert account_id is not None
            purged = await _make_room(conn, account_id, runtime.settings.max_tokens_per_account)
        row = await conn.fetchrow(
            _INSERT_CAPPED,
            new.id, kind, new.digest, account_id, label, access, scopes, principal.id, float(expires_in), maker,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    if purged:
        forget_cached(runtime.credentials)
    if row is None:
        raise Unauthorized("the credential making this one was revoked or expired meanwhile")
    return JSONResponse(
        {**credential_json(row), "token": new.token}, status_code=201, headers={"Cache-Control": "no-store"}
    )


async def _make_room(conn: asyncpg.Connection, account_id: uuid.UUID, limit: int) -> bool:
    """Refuse (409) a personal token past the account's `limit` of live ones; forget its expired
    ones (they only fill the table: nothing else removes them). True if some were deleted.

    Runs in the creating transaction, under a lock on the account's row: two creates of one
    account count one after the other, so at `limit - 1` only one of them passes."""
    locked = await conn.fetchval(
        "SELECT id FROM arkvory_accounts WHERE id = $1 FOR NO KEY UPDATE", account_id, timeout=POOLED_QUERY_TIMEOUT_S
    )
    if locked is None:
        raise Unauthorized("the account no longer exists")
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
    label, expires_in = _label(body), _expiry(body)
    maker = await _maker(request, principal, body)
    return await _create(request, "pat", account_id, principal, label, expires_in, access, [], maker)


async def list_tokens(request: Request) -> Response:
    principal = await principal_of(request)
    account_id = _token_owner(principal)
    pool = runtime_of(request).pool
    assert pool is not None
    limit = page_limit(request)
    after_time, after_id = time_id_cursor(request)
    async with pooled(pool) as conn:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM arkvory_credentials WHERE account_id = $1 AND kind = 'pat'"
            " AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid))"
            " ORDER BY created_at, id LIMIT $4",
            account_id, after_time, after_id, limit + 1,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return JSONResponse(page(rows, limit, credential_json, time_id_key))


async def _revoke(request: Request, principal: Principal, kind: str, owner: uuid.UUID | None) -> Response:
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
        return await _revoke(request, principal, "pat", None)
    account_id = _token_owner(principal)
    if principal.read_only:
        raise Forbidden("a read-only token cannot revoke tokens")
    return await _revoke(request, principal, "pat", account_id)


async def create_key(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "service keys")
    key_of(request)
    body = await json_body(request)
    scopes = body.get("scopes")
    if (
        not isinstance(scopes, list) or not 1 <= len(scopes) <= MAX_SCOPES
        or not all(isinstance(s, str) and is_scope(s) for s in scopes)
    ):
        raise InvalidInput(
            f"'scopes' must be a list of 1-{MAX_SCOPES} of admin, read:*, write:*, read:<repo>, write:<repo>"
        )
    label, expires_in = _label(body), _expiry(body)
    maker = await _maker(request, principal, body)
    return await _create(request, "service_key", None, principal, label, expires_in, None, sorted(set(scopes)), maker)


async def list_keys(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "service keys")
    pool = runtime_of(request).pool
    assert pool is not None
    limit = page_limit(request)
    after_time, after_id = time_id_cursor(request)
    async with pooled(pool) as conn:
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM arkvory_credentials WHERE kind = 'service_key'"
            " AND ($1::timestamptz IS NULL OR (created_at, id) > ($1, $2::uuid))"
            " ORDER BY created_at, id LIMIT $3",
            after_time, after_id, limit + 1,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return JSONResponse(page(rows, limit, credential_json, time_id_key))


async def revoke_key(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "service keys")
    return await _revoke(request, principal, "service_key", None)


routes = [
    Route("/api/v1/tokens", create_token, methods=["POST"]),
    Route("/api/v1/tokens", list_tokens, methods=["GET"]),
    Route("/api/v1/tokens/{id}", revoke_token, methods=["DELETE"]),
    Route("/api/v1/keys", create_key, methods=["POST"]),
    Route("/api/v1/keys", list_keys, methods=["GET"]),
    Route("/api/v1/keys/{id}", revoke_key, methods=["DELETE"]),
]


_CREDENTIAL = {
    "type": "object",
    "required": ["id", "label", "createdBy", "createdAt", "expiresAt", "lastUsedAt"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "label": {"type": "string"},
        "createdBy": {"type": "string", "description": "the principal that made it"},
        "createdAt": {"type": "string", "format": "date-time"},
        "expiresAt": {"type": "string", "format": "date-time"},
        "lastUsedAt": {"type": ["string", "null"], "format": "date-time", "description": "recorded every few seconds"},
        "access": {"type": "string", "enum": list(ACCESS), "description": "personal tokens"},
        "scopes": {"type": "array", "items": {"type": "string"}, "description": "service keys"},
    },
}
_CREATED = {**_CREDENTIAL, "required": [*_CREDENTIAL["required"], "token"],
            "properties": {**_CREDENTIAL["properties"], "token": {"type": "string", "description": "shown once"}}}
_EXPIRY = {"type": "integer", "minimum": 1, "maximum": MAX_EXPIRY_S, "default": DEFAULT_EXPIRY_S,
           "description": "capped at the expiry of the credential making it (see expiresAt in the answer)"}
_LABEL = {"type": "string", "maxLength": MAX_LABEL}
_PASSWORD = {"type": "string", "minLength": 1, "maxLength": MAX_PASSWORD,
             "description": "an account's own password, re-entered: the new credential may then outlive the"
             " session or token that asks for it (limited like logins: 401 when wrong, 429)"}
_ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}


def _family(what: str, create_body: dict[str, Any], who: str, *create_errors: int, limit: str = "") -> dict[str, Any]:
    return {
        "post": {
            "summary": f"Create a {what} ({who}); the token is in this answer only (never recorded by"
            f" Idempotency-Key){limit}",
            "parameters": [openapi.IDEMPOTENCY_KEY],
            "requestBody": openapi.json_body(create_body),
            "responses": {"201": {"description": "Created", "content": openapi.json_content(_CREATED)},
                          **openapi.errors(400, 401, 403, *create_errors, 413, 429)},
        },
        "get": {
            "summary": f"List {what}s ({who}), oldest first, one page at a time; never the token",
            "parameters": openapi.page_params(),
            "responses": {"200": {"description": "One page", "content": openapi.json_content(openapi.page_of(_CREDENTIAL))},
                          **openapi.errors(400, 401, 403)},
        },
    }


def _revocation(what: str) -> dict[str, Any]:
    return {"delete": {
        "summary": f"Revoke a {what}: the next request with it fails on every process",
        "parameters": [_ID_PARAM, openapi.IDEMPOTENCY_KEY],
        "responses": {"204": {"description": "Revoked"}, **openapi.errors(400, 401, 403, 404, 409, 422)},
    }}


OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/tokens": _family("personal token", {"type": "object", "properties": {
        "label": _LABEL, "access": {"type": "string", "enum": list(ACCESS), "default": "read"},
        "expiresInSeconds": _EXPIRY, "password": _PASSWORD}}, "an account's session or read-write token", 409,
        limit="; 409 when the account holds ARKVORY_MAX_TOKENS_PER_ACCOUNT live tokens already (revoke one;"
        " expired ones do not count)"),
    "/api/v1/tokens/{id}": _revocation("personal token (yours; an admin: anyone's)"),
    "/api/v1/keys": _family("managed service key", {"type": "object", "required": ["scopes"], "properties": {
        "label": _LABEL, "scopes": {"type": "array", "minItems": 1, "maxItems": MAX_SCOPES, "items": {
            "type": "string", "description": "admin, read:*, write:*, read:<repo>, write:<repo>"}},
        "expiresInSeconds": _EXPIRY, "password": _PASSWORD}}, "admin"),
    "/api/v1/keys/{id}": _revocation("managed service key (admin)"),
}
