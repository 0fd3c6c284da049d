"""Managed service keys (`arkvory_<uuid>.<secret>`, scoped like the keys file) on the writer,
for administrators: made, listed, revoked and adopted (SPEC §5).

They are made like personal tokens (tokens.py: shown once, expiry capped at the maker's, tied
to the credential that asks unless the account's password is given again). A key records the
account that made it (credential_makers.py); disabling that account suspends the key, which is
then refused everywhere until an administrator adopts it here: the key becomes theirs as if they
made it now, tied to the credential they adopt it with (its expiry capped at that one's) unless
they give their password. An adoption without a password records its Idempotency-Key like every
change; with one it is never recorded (a retry answers 409: the key is adopted already).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import forget_cached
from arkvory.shared.auth.identity import is_scope
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.download.catalog import parse_uuid
from arkvory.shared.errors import Conflict, InvalidInput, NotFound, Unauthorized

from .. import openapi
from ..audit.actions import record_request
from ..audit.trail import actor_of
from .credential_makers import making_of
from ..idempotency import idempotent, key_of
from ..request_inputs import json_body, principal_of, require_admin_scope, runtime_of
from .tokens import (
    COLUMNS, CREDENTIAL_SCHEMA, EXPIRY_SCHEMA, ID_PARAM, LABEL_SCHEMA, MAKER_GONE, PASSWORD_SCHEMA, WITH_MAKER,
    create_credential, credential_family, credential_json, credential_page, expiry_of, label_of, password_reentered,
    revocation, revoke_credential,
)

MAX_SCOPES = 100


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
    label, expires_in = label_of(body), expiry_of(body)
    password_given = await password_reentered(request, principal, body)
    return await create_credential(
        request, "service_key", None, principal, label, expires_in, None, sorted(set(scopes)), password_given
    )


async def list_keys(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "service keys")
    return await credential_page(request, "c.kind = 'service_key'")


async def revoke_key(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "service keys")
    return await revoke_credential(request, principal, "service_key", None)


# The suspended key becomes the adopter's as if they made it now (credential_makers.py): tied to
# the credential it now ends with, if any (`$5`), its expiry capped at that one's.
_ADOPT = f"""
WITH c AS (
    UPDATE arkvory_credentials k SET suspended_at = NULL, maker_account_id = $2, made_through = $3,
        password_given = $4, ends_with = $5, expires_at = least(k.expires_at, maker.expires_at)
    FROM (SELECT $5::uuid AS id) wanted LEFT JOIN arkvory_credentials maker ON maker.id = wanted.id
    WHERE k.id = $1 AND (wanted.id IS NULL OR (maker.expires_at > now() AND maker.suspended_at IS NULL))
    RETURNING k.*
)
SELECT {COLUMNS} FROM c {WITH_MAKER}
"""


async def adopt_key(request: Request) -> Response:
    """An administrator makes a suspended key their own (409 unless suspended and unexpired)."""
    principal = await principal_of(request)
    require_admin_scope(principal, "service keys")
    key_id = parse_uuid(request.path_params["id"], "id")
    key_of(request)
    body = await json_body(request)
    password_given = await password_reentered(request, principal, body)

    async def work(conn: asyncpg.Connection):
        # The adopter's account first, then the key: a disable locks in that order too.
        making = await making_of(conn, principal, password_given)
        key = await conn.fetchrow(
            "SELECT suspended_at, expires_at > now() AS live FROM arkvory_credentials"
            " WHERE id = $1 AND kind = 'service_key' FOR UPDATE",
            key_id, timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if key is None:
            raise NotFound(f"no key {key_id}")
        if key["suspended_at"] is None:
            raise Conflict(f"key {key_id} is not suspended: only a key whose maker account was disabled is adopted")
        if not key["live"]:
            raise Conflict(f"key {key_id} has expired: make a new one")
        try:
            row = await conn.fetchrow(
                _ADOPT, key_id, making.account_id, making.through, making.password_given, making.ends_with,
                timeout=POOLED_QUERY_TIMEOUT_S,
            )
        except asyncpg.ForeignKeyViolationError:
            raise Unauthorized(MAKER_GONE) from None
        if row is None:
            raise Unauthorized(MAKER_GONE)
        return 200, credential_json(row)

    runtime = runtime_of(request)
    if password_given:  # never recorded (see the module docstring)
        assert runtime.pool is not None
        async with pooled(runtime.pool) as conn, conn.transaction():
            _, adopted = await work(conn)
            await record_request(conn, request, actor_of(principal), 200, {"passwordGiven": True})
        answer: Response = JSONResponse(adopted)
    else:
        answer = await idempotent(request, principal, {}, work)
    forget_cached(runtime.credentials)
    return answer


routes = [
    Route("/api/v1/keys", create_key, methods=["POST"]),
    Route("/api/v1/keys", list_keys, methods=["GET"]),
    Route("/api/v1/keys/{id}", revoke_key, methods=["DELETE"]),
    Route("/api/v1/keys/{id}/adopt", adopt_key, methods=["POST"]),
]


OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/keys": credential_family("managed service key", {"type": "object", "required": ["scopes"], "properties": {
        "label": LABEL_SCHEMA, "scopes": {"type": "array", "minItems": 1, "maxItems": MAX_SCOPES, "items": {
            "type": "string", "description": "admin, read:*, write:*, read:<repo>, write:<repo>"}},
        "expiresInSeconds": EXPIRY_SCHEMA, "password": PASSWORD_SCHEMA}}, "admin"),
    "/api/v1/keys/{id}": revocation("managed service key (admin)"),
    "/api/v1/keys/{id}/adopt": {"post": {
        "summary": "Adopt a suspended managed service key (admin): a key whose maker account was disabled"
        " becomes yours as if you made it now, and works again; tied to the credential you adopt it with"
        " (its expiry capped at that one's) unless the body holds your password",
        "parameters": [ID_PARAM, openapi.IDEMPOTENCY_KEY],
        "requestBody": openapi.json_body({"type": "object", "properties": {"password": PASSWORD_SCHEMA}}),
        "responses": {"200": {"description": "Adopted", "content": openapi.json_content(CREDENTIAL_SCHEMA)},
                      **openapi.errors(400, 401, 403, 404, 409, 413, 422, 429)},
    }},
}
