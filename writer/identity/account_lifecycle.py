"""An account's life after it was made, for administrators (issue 25 §1, SPEC §5): what it holds,
a password reset, and deleting it.

**Reset** (`POST /api/v1/accounts/{name}/password`, `{"password"}`): the account's password
becomes the one the administrator chose, its sessions end (and what they made without the
password given again: the cascade of credential_makers.py), and it must set a password of its
own at its next sign-in: the login answers `mustChangePassword: true`, and that session may do
nothing but change the password (with the one it was given as the old one) or log out (403
`password_change_required` elsewhere; request_inputs.principal_of). Why force it: the
administrator knows the password, and may have sent it over chat or mail; until the account's
owner replaces it, whatever the account does could have been done by someone else, and the
uploads and changes it makes would say otherwise. Tokens made with the password given again
(`arkvory login`'s, a CI token) stay valid: a forgotten password does not stop a build. A
suspected compromise is a disable (accounts.py), which ends every credential. An administrator
resets another's password, never their own (403): that is the password change, which needs the
old one, so that a stolen session cannot take an account over. The input is a password, so the
Idempotency-Key is checked, never recorded (accounts.py says why); a retried reset sets the same
password again and ends no more than the first.

**Delete** (`DELETE /api/v1/accounts/{name}`): in one transaction, the managed keys the account
made are suspended as at a disable (an administrator may adopt them, service_keys.py), its
sessions and tokens and what they made go (cascades), its repository permissions go, and its
open upload sessions expire (the next sweep frees their space). Its artifacts stay and keep
saying who uploaded them (writer/catalog/uploaders.py: name and id as they were). Every process
hears of it through the credentials NOTIFY (migration 0019), so the next request with any of its
credentials is 401 everywhere. An account never deletes itself, and the last enabled
administrator account goes only with a keys-file key (lockout.py). The name is free again
afterwards; a new account of that name is another account (another id).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import forget_cached
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Forbidden, NotFound

from .. import openapi
from ..audit.actions import record_request
from ..audit.trail import actor_of
from .account_names import FOLDED_NAME, check_account_name, fold
from .accounts import ACCOUNT_COLUMNS, account_json, accounts_state
from .accounts_openapi import ACCOUNT_SCHEMA, NAME_PARAM, NEW_PASSWORD_SCHEMA
from .credential_makers import require_still_valid, suspend_made_by
from ..idempotency import idempotent, key_of
from .lockout import lock_for_removal
from .passwords import check_password_text
from ..request_inputs import json_body, principal_of, require_admin_scope, runtime_of

# What an account holds, as `holds` in GET /api/v1/accounts/{name}: what a delete ends or removes.
_HOLDS = """
SELECT count(*) FILTER (WHERE kind = 'session' AND expires_at > now()) AS sessions,
       count(*) FILTER (WHERE kind = 'pat' AND expires_at > now()) AS tokens,
       (SELECT count(*) FROM arkvory_credentials WHERE kind = 'service_key' AND maker_account_id = $1
           AND suspended_at IS NULL AND expires_at > now()) AS keys,
       (SELECT count(*) FROM arkvory_repository_permissions WHERE account_id = $1) AS repositories
FROM arkvory_credentials WHERE account_id = $1
"""


def _holds_json(row: asyncpg.Record) -> dict[str, int]:
    return {"sessions": row["sessions"], "tokens": row["tokens"], "keysMade": row["keys"],
            "repositories": row["repositories"]}


async def show_account(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "accounts")
    name = check_account_name(request.path_params["name"])
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {ACCOUNT_COLUMNS} FROM arkvory_accounts WHERE {FOLDED_NAME} = $1", fold(name),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no account {name!r}")
        holds = await conn.fetchrow(_HOLDS, row["id"], timeout=POOLED_QUERY_TIMEOUT_S)
    return JSONResponse({**account_json(row), "holds": _holds_json(holds)})


async def reset_password(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "accounts")
    name = check_account_name(request.path_params["name"])
    key_of(request)  # checked, never recorded (the module docstring)
    body = await json_body(request)
    password = check_password_text(body.get("password"))
    hashed = await accounts_state(request).hasher.hash(password)
    runtime = runtime_of(request)
    assert runtime.pool is not None
    async with pooled(runtime.pool) as conn, conn.transaction():
        row = await conn.fetchrow(
            f"SELECT id FROM arkvory_accounts WHERE {FOLDED_NAME} = $1 FOR UPDATE", fold(name),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no account {name!r}")
        if row["id"] == principal.account_id:
            raise Forbidden("change your own password with POST /api/v1/account/password: it needs the old one")
        await require_still_valid(conn, principal)
        row = await conn.fetchrow(
            "UPDATE arkvory_accounts SET password_hash = $2, password_salt = $3, scrypt_n = $4, scrypt_r = $5,"
            " scrypt_p = $6, password_changed_at = now(), must_change_password = true"
            f" WHERE id = $1 RETURNING {ACCOUNT_COLUMNS}",
            row["id"], hashed.digest, hashed.salt, hashed.n, hashed.r, hashed.p,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        # What the sessions made without the password goes with them (the ends_with cascade).
        ended = await conn.fetchval(
            "WITH ended AS (DELETE FROM arkvory_credentials WHERE account_id = $1 AND kind = 'session' RETURNING 1)"
            " SELECT count(*) FROM ended",
            row["id"], timeout=POOLED_QUERY_TIMEOUT_S,
        )
        # Outside `idempotent` (its key is never recorded), so the audit entry is written here,
        # in the reset's own transaction; never the password.
        await record_request(conn, request, actor_of(principal), 200, target=row["name"],
                             details={"sessionsEnded": ended})
    forget_cached(runtime.credentials)
    return JSONResponse({**account_json(row), "sessionsEnded": ended}, headers={"Cache-Control": "no-store"})


async def delete_account(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "accounts")
    name = check_account_name(request.path_params["name"])

    async def work(conn: asyncpg.Connection):
        target = await lock_for_removal(conn, principal, name, "delete")
        # Under the locks: a disable or delete of this principal's own account that committed
        # meanwhile ended its credential, and it cannot act after that (credential_makers.py).
        await require_still_valid(conn, principal)
        account_id = target["id"]
        holds = await conn.fetchrow(_HOLDS, account_id, timeout=POOLED_QUERY_TIMEOUT_S)
        await suspend_made_by(conn, account_id)
        await conn.execute(
            "UPDATE arkvory_uploads SET expires_at = now() WHERE principal_id = $1 AND status = 'open'",
            f"account:{account_id}", timeout=POOLED_QUERY_TIMEOUT_S,
        )
        # The cascades of migration 0004 (credentials, permissions) and 0014 (what those
        # credentials made without the password), and 0017's SET NULL on the suspended keys.
        await conn.execute("DELETE FROM arkvory_accounts WHERE id = $1", account_id, timeout=POOLED_QUERY_TIMEOUT_S)
        return 200, {"id": str(account_id), "name": target["name"], "deleted": True, "ended": _holds_json(holds)}

    answer = await idempotent(request, principal, {}, work)
    forget_cached(runtime_of(request).credentials)
    return answer


routes = [
    Route("/api/v1/accounts/{name}", show_account, methods=["GET"]),
    Route("/api/v1/accounts/{name}", delete_account, methods=["DELETE"]),
    Route("/api/v1/accounts/{name}/password", reset_password, methods=["POST"]),
]


_HOLDS_SCHEMA = {
    "type": "object", "required": ["sessions", "tokens", "keysMade", "repositories"],
    "properties": {
        "sessions": {"type": "integer", "description": "live sessions"},
        "tokens": {"type": "integer", "description": "live personal tokens"},
        "keysMade": {"type": "integer", "description": "live managed service keys it made (a delete or disable"
                     " suspends them until an admin adopts them)"},
        "repositories": {"type": "integer", "description": "repositories it has a permission on"},
    },
}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/accounts/{name}": {
        "get": {
            "summary": "One account (admin), with what it holds: what deleting it would end",
            "parameters": [NAME_PARAM],
            "responses": {"200": {"description": "The account", "content": openapi.json_content({
                **ACCOUNT_SCHEMA, "required": [*ACCOUNT_SCHEMA["required"], "holds"],
                "properties": {**ACCOUNT_SCHEMA["properties"], "holds": _HOLDS_SCHEMA}})},
                **openapi.errors(400, 401, 403, 404)},
        },
        "delete": {
            "summary": "Delete an account (admin): its sessions and tokens end at once on every process, the managed"
            " keys it made are suspended until an admin adopts them, its permissions go; its artifacts stay and say"
            " who uploaded them",
            "description": "An account cannot delete itself (403); the last enabled administrator account is deleted"
            " only with a keys-file admin key (409 otherwise). The answer says what ended (`ended`, counted as"
            " GET's `holds`).",
            "parameters": [NAME_PARAM, openapi.IDEMPOTENCY_KEY],
            "responses": {"200": {"description": "Deleted", "content": openapi.json_content({
                "type": "object", "required": ["id", "name", "deleted", "ended"],
                "properties": {"id": {"type": "string", "format": "uuid"}, "name": {"type": "string"},
                               "deleted": {"const": True}, "ended": _HOLDS_SCHEMA}})},
                **openapi.errors(400, 401, 403, 404, 409, 422)},
        },
    },
    "/api/v1/accounts/{name}/password": {"post": {
        "summary": "Reset another account's password (admin); never recorded by Idempotency-Key",
        "description": "The account's sessions end (and what they made without the password given again); its"
        " tokens made with the password stay. At its next sign-in the login answers `mustChangePassword: true`,"
        " and that session may only change the password (POST /api/v1/account/password, with this password as"
        " `oldPassword`) or log out: every other route answers 403 `password_change_required`. Your own password"
        " is changed with POST /api/v1/account/password (403 here).",
        "parameters": [NAME_PARAM, openapi.IDEMPOTENCY_KEY],
        "requestBody": openapi.json_body({"type": "object", "required": ["password"],
                                          "properties": {"password": NEW_PASSWORD_SCHEMA}}),
        "responses": {"200": {"description": "Reset", "content": openapi.json_content({
            **ACCOUNT_SCHEMA, "required": [*ACCOUNT_SCHEMA["required"], "sessionsEnded"],
            "properties": {**ACCOUNT_SCHEMA["properties"], "sessionsEnded": {"type": "integer"}}})},
            **openapi.errors(400, 401, 403, 404, 413, 503)},
    }},
}
