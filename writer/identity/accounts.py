"""Accounts on the writer (SPEC §5): login, logout, self-registration, password change, and the
administrators' account management (create, list, disable, enable); an administrator's password
reset and deleting an account are account_lifecycle.py's.

A failed login says the same thing whether the account exists or not, and takes as long: an
unknown name is verified against a dummy hash. A name is one name in any case (`BOB` signs in to
`bob`, account_names.py). Login and sign-up take only JSON, never from another site's page
(sign_in_guard.py). Attempts are limited per client address (as seen through
ARKVORY_TRUSTED_PROXIES, shared/http/client_address.py) and per account name, or per device
for a client that signed in before (its device cookie, device_cookies.py), counted before
anything is hashed (login_limits.py); scrypt runs off the event loop, bounded (passwords.py),
and a hash made at an older cost is replaced at the next successful login. An account holds at
most ARKVORY_MAX_SESSIONS_PER_ACCOUNT live sessions: a login past it ends the oldest one.

`confirm_password` checks the password of an account that is already signed in (a password
change; a token that may outlive the session, tokens.py) under the limit of the account's
signed-in credentials, never under the lockout that guessers at the login cause. The routes'
OpenAPI fragment is in accounts_openapi.py.

Idempotency: routes whose answer holds a secret (login) or whose input is a password (register,
create, password change) never record their request or result with the Idempotency-Key, since
the idempotency table keeps results and request digests in the clear and a digest of a password
is a guessable hash of it. Their key is still checked (400 when malformed); a retried login makes
a second session (the lost one expires), a retried create or register answers 409 (the name
exists), a retried password change 401 (the old password changed). Disable and enable record
their key like every other change.

Audit: each of these changes writes its entry (writer/audit/) in its own transaction, the
account signing in or up as the actor; a failed sign-in is recorded as a refusal, naming the
account only when it exists (audit/refusals.py). Never a password, a token or a hash of one.
After an administrator's reset (account_lifecycle.py) the login says `mustChangePassword`, and
its session may only change the password (the password it was given as the old one) or log
out; the change clears the flag. An account never disables itself, nor anyone but a keys-file
key the last enabled administrator account (lockout.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from arkvory.shared.auth.credentials import SESSION_COOKIE, forget_cached, mint
from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Busy, Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from arkvory.shared.http.client_address import client_address

from . import device_cookies
from ..audit.actions import record_request
from ..audit.refusals import SUBJECT_KEY
from ..audit.trail import account_actor, actor_of
from .account_names import FOLDED_NAME, MAX_ACCOUNT_NAME, check_account_name, fold
from .accounts_openapi import OPENAPI_PATHS  # noqa: F401  (served next to `routes`)
from .credential_makers import require_still_valid, suspend_made_by
from .device_cookies import DeviceCookies
from .lockout import lock_for_removal
from ..idempotency import idempotent, key_of
from .login_limits import LoginLimits, PasswordAttempt
from ..pagination import NEWEST, OLDEST, TIME_ID, ListQuery, SortColumn, page_cursor, page_limit, page_order, text_filter
from .passwords import DUMMY, MAX_PASSWORD, PasswordHash, PasswordHasher, check_password_text, needs_rehash
from ..request_inputs import json_body, principal_of, require_admin_scope, runtime_of
from .sign_in_guard import check_sign_in_request

LOGIN_FAILED = "wrong account name or password"


class AccountsState:
    """The writer's login state: one hasher (bounded threads), the attempt limits and the
    device cookies that exempt a client from its account's lockout."""

    def __init__(self) -> None:
        self.hasher = PasswordHasher()
        self.limits = LoginLimits()
        self.devices = DeviceCookies()


def accounts_state(request: Request) -> AccountsState:
    state = getattr(request.app.state, "accounts", None)
    if state is None:
        state = request.app.state.accounts = AccountsState()
    return state


def account_json(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "id": str(row["id"]),
        "name": row["name"],
        "admin": row["is_admin"],
        "disabled": row["disabled"],
        "createdAt": row["created_at"].isoformat(),
        "mustChangePassword": row["must_change_password"],
    }


ACCOUNT_COLUMNS = "id, name, is_admin, disabled, created_at, must_change_password"
# A new account sets its own password: spelt out, so that `arkvory admin create-user` also works
# on a database the writer has not migrated to 0017 yet.
_NEW_ACCOUNT_COLUMNS = "id, name, is_admin, disabled, created_at, false AS must_change_password"


def _client_address(request: Request) -> str:
    return client_address(request.scope, runtime_of(request).settings.trusted_proxies)


def _stored_hash(row: asyncpg.Record | None) -> PasswordHash:
    if row is None:
        return DUMMY
    return PasswordHash(
        bytes(row["password_hash"]), bytes(row["password_salt"]), row["scrypt_n"], row["scrypt_r"], row["scrypt_p"]
    )


async def insert_account(conn: asyncpg.Connection, name: str, hashed: PasswordHash, admin: bool) -> asyncpg.Record:
    """Also used by `arkvory admin create-user`; a taken name, in any case, is 409. The unique
    index on the folded name (migration 0012) decides under races; the NOT EXISTS also keeps a
    twin out of a database the writer has not migrated yet (create-user runs without a writer)."""
    try:
        row = await conn.fetchrow(
            "INSERT INTO arkvory_accounts (id, name, password_hash, password_salt, scrypt_n, scrypt_r,"
            " scrypt_p, is_admin) SELECT $1, $2, $3, $4, $5, $6, $7, $8"
            f" WHERE NOT EXISTS (SELECT 1 FROM arkvory_accounts WHERE {FOLDED_NAME} = $9)"
            f" RETURNING {_NEW_ACCOUNT_COLUMNS}",
            uuid.uuid4(), name, hashed.digest, hashed.salt, hashed.n, hashed.r, hashed.p, admin, fold(name),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    except asyncpg.UniqueViolationError:
        row = None
    if row is None:
        raise Conflict(f"account {name!r} already exists (names are the same in upper and lower case)")
    return row


async def _upgrade_hash(
    state: AccountsState, pool: asyncpg.Pool, account_id: uuid.UUID, password: str, stored: PasswordHash
) -> None:
    """Replace a hash made at an older cost, now that the password is known to be right. Only if
    the stored hash is still the one that was checked: a password change meanwhile wins."""
    try:
        hashed = await state.hasher.hash(password)
    except Busy:
        return  # the login still succeeds; the next one upgrades
    async with pooled(pool) as conn:
        await conn.execute(
            "UPDATE arkvory_accounts SET password_hash = $2, password_salt = $3, scrypt_n = $4,"
            " scrypt_r = $5, scrypt_p = $6 WHERE id = $1 AND password_hash = $7",
            account_id, hashed.digest, hashed.salt, hashed.n, hashed.r, hashed.p, stored.digest,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )


def _cookie(request: Request, name: str, value: str, max_age: int, path: str = "/") -> str:
    secure = "; Secure" if runtime_of(request).settings.tls_cert_file is not None else ""
    return f"{name}={value}; Max-Age={max_age}; Path={path}; HttpOnly; SameSite=Strict{secure}"


def _session_cookie(request: Request, token: str, max_age: int) -> str:
    return _cookie(request, SESSION_COOKIE, token, max_age)


async def _checked(state: AccountsState, attempt: PasswordAttempt, password: str, stored: PasswordHash) -> bool:
    """The password check behind `attempt`, which learns how it went. Busy (no check made)
    gives the attempt back; a cancelled check stays counted, as its hash still runs."""
    try:
        matches = await state.hasher.verify(password, stored)
    except Busy:
        attempt.passed()
        raise
    return matches


async def login(request: Request) -> Response:
    check_sign_in_request(request, runtime_of(request).settings.trusted_proxies)
    key_of(request)  # checked, never recorded (see the module docstring)
    body = await json_body(request)
    name, password = body.get("name"), body.get("password")
    # Only shapes are refused here, never anything that depends on the account.
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise InvalidInput("'name' must be a string of 1-64 characters")
    if not isinstance(password, str) or not 1 <= len(password) <= MAX_PASSWORD:
        raise InvalidInput(f"'password' must be a string of 1-{MAX_PASSWORD} characters")
    state = accounts_state(request)
    runtime = runtime_of(request)
    assert runtime.pool is not None
    await state.devices.load_secret(runtime.pool)
    device = state.devices.device_of(request.cookies.get(device_cookies.COOKIE), name)
    attempt = state.limits.begin_login(name, _client_address(request), device)
    async with pooled(runtime.pool) as conn:
        row = await conn.fetchrow(
            f"SELECT {ACCOUNT_COLUMNS}, password_hash, password_salt, scrypt_n, scrypt_r, scrypt_p"
            f" FROM arkvory_accounts WHERE {FOLDED_NAME} = $1",
            fold(name),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    if row is not None:
        request.scope[SUBJECT_KEY] = row["name"]  # the audit of a failed sign-in names it (audit/refusals.py)
    stored = _stored_hash(row)
    matches = await _checked(state, attempt, password, stored)
    if row is None or not matches or row["disabled"]:
        attempt.failed(name_exists=row is not None)
        raise Unauthorized(LOGIN_FAILED)
    attempt.passed()
    if needs_rehash(stored):
        await _upgrade_hash(state, runtime.pool, row["id"], password, stored)
    lifetime = runtime.settings.session_lifetime_s
    session = mint("session")
    async with pooled(runtime.pool) as conn, conn.transaction():
        ended = await _make_session_room(conn, row["id"], runtime.settings.max_sessions_per_account)
        expires_at = await conn.fetchval(
            "INSERT INTO arkvory_credentials (id, kind, digest, account_id, expires_at, created_by)"
            " VALUES ($1, 'session', $2, $3, now() + make_interval(secs => $4), $5) RETURNING expires_at",
            session.id, session.digest, row["id"], float(lifetime), _client_address(request),
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        await record_request(conn, request, account_actor(row["id"], row["name"], session.id), 200,
                             details={"oldSessionsEnded": ended})
    if ended:
        forget_cached(runtime.credentials)
    answer = JSONResponse(
        {"token": session.token, "sessionId": str(session.id), "expiresAt": expires_at.isoformat(),
         "account": account_json(row), "mustChangePassword": row["must_change_password"]},
        headers={"Cache-Control": "no-store"},
    )
    answer.headers["Set-Cookie"] = _session_cookie(request, session.token, lifetime)
    # A fresh device cookie at every sign-in: this client keeps its way in (login_limits.py).
    answer.headers.append("Set-Cookie", _cookie(
        request, device_cookies.COOKIE, state.devices.issue(row["name"]), device_cookies.LIFETIME_S,
        device_cookies.PATH,
    ))
    return answer


async def _make_session_room(conn: asyncpg.Connection, account_id: uuid.UUID, limit: int) -> bool:
    """Before a login's new session: delete the account's expired sessions, and its oldest live
    ones past `limit - 1`, so that an account holds at most `limit` rows of sessions however
    often it signs in. True if any was deleted.

    The oldest session ends rather than the login being refused: an account cannot list or
    revoke its sessions one by one, so a refusal would lock its owner out until they expire.
    Under a lock on the account's row, so concurrent logins of one account count in turn."""
    await conn.execute("SELECT 1 FROM arkvory_accounts WHERE id = $1 FOR NO KEY UPDATE", account_id,
                       timeout=POOLED_QUERY_TIMEOUT_S)
    # At most `limit` rows (this rule held at every earlier login): a bounded scan.
    doomed = await conn.fetchval(
        "SELECT array_agg(id) FROM (SELECT id, expires_at > now() AS live, row_number() OVER"
        " (PARTITION BY expires_at > now() ORDER BY expires_at DESC, id DESC) AS newest"
        " FROM arkvory_credentials WHERE account_id = $1 AND kind = 'session') s"
        " WHERE NOT live OR newest >= $2",
        account_id, limit, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    if not doomed:
        return False  # no DELETE: even an empty one notifies every process to flush its cache
    await conn.execute("DELETE FROM arkvory_credentials WHERE id = ANY($1::uuid[])", doomed,
                       timeout=POOLED_QUERY_TIMEOUT_S)
    return True


async def logout(request: Request) -> Response:
    principal = await principal_of(request, before_new_password=True)
    if principal.is_anonymous:
        raise Unauthorized("log in first")
    if principal.credential_kind != "session":
        raise InvalidInput("logout ends a session; revoke a token with DELETE /api/v1/tokens/{id}")
    runtime = runtime_of(request)
    assert runtime.pool is not None
    async with pooled(runtime.pool) as conn, conn.transaction():
        # What the session made without the password given again goes with it (the cascade of
        # migration 0014: credential_makers.py).
        await conn.execute(
            "DELETE FROM arkvory_credentials WHERE id = $1", principal.credential_id, timeout=POOLED_QUERY_TIMEOUT_S
        )
        await record_request(conn, request, actor_of(principal), 204)
    forget_cached(runtime.credentials)
    answer = Response(status_code=204)
    answer.headers["Set-Cookie"] = _session_cookie(request, "", 0)
    return answer


async def register(request: Request) -> Response:
    if not runtime_of(request).settings.allow_signup:
        # As if the route did not exist: an installation without sign-up shows no sign-up.
        raise NotFound("self-registration is not enabled on this installation (ARKVORY_ALLOW_SIGNUP)")
    check_sign_in_request(request, runtime_of(request).settings.trusted_proxies)
    key_of(request)
    body = await json_body(request)
    name = check_account_name(body.get("name"))
    password = check_password_text(body.get("password"))
    state = accounts_state(request)
    # Sign-up costs a hash like a login: the same per-address limit applies.
    state.limits.count_address(_client_address(request))
    hashed = await state.hasher.hash(password)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn, conn.transaction():
        row = await insert_account(conn, name, hashed, admin=False)
        await record_request(conn, request, account_actor(row["id"], row["name"]), 201, {"name": row["name"]})
    return JSONResponse(account_json(row), status_code=201)


def _require_account(principal: Principal) -> uuid.UUID:
    if principal.is_anonymous:
        raise Unauthorized("log in first")
    if principal.account_id is None:
        raise Forbidden("only an account has a password")
    if principal.read_only:
        raise Forbidden("a read-only token cannot change the account")
    return principal.account_id


async def change_password(request: Request) -> Response:
    """Needs the old password; ends every other session of the account, and what they made
    without the password given again (credential_makers.py), but not its other tokens. Clears
    the flag of an administrator's reset (the reset's password is then the old one)."""
    principal = await principal_of(request, before_new_password=True)
    account_id = _require_account(principal)
    key_of(request)
    body = await json_body(request)
    old = body.get("oldPassword")
    if not isinstance(old, str) or not 1 <= len(old) <= MAX_PASSWORD:
        raise InvalidInput(f"'oldPassword' must be a string of 1-{MAX_PASSWORD} characters")
    new = check_password_text(body.get("newPassword"), "'newPassword'")
    if new == old:
        # After a reset above all: the administrator's password would stay the account's.
        raise InvalidInput("'newPassword' must differ from the old one")
    await confirm_password(request, principal, old, "the old password is wrong")
    state = accounts_state(request)
    runtime = runtime_of(request)
    assert runtime.pool is not None
    hashed = await state.hasher.hash(new)
    async with pooled(runtime.pool) as conn, conn.transaction():
        name = await conn.fetchval(
            "UPDATE arkvory_accounts SET password_hash = $2, password_salt = $3, scrypt_n = $4,"
            " scrypt_r = $5, scrypt_p = $6, password_changed_at = now(), must_change_password = false"
            " WHERE id = $1 RETURNING name",
            account_id, hashed.digest, hashed.salt, hashed.n, hashed.r, hashed.p,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        ended = await conn.execute(
            "DELETE FROM arkvory_credentials WHERE account_id = $1 AND kind = 'session'"
            " AND id IS DISTINCT FROM $2",
            account_id,
            principal.credential_id if principal.credential_kind == "session" else None,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        await record_request(conn, request, actor_of(principal), 204, {"account": name},
                             details={"otherSessionsEnded": int(ended.split()[-1])})
    forget_cached(runtime.credentials)
    return Response(status_code=204)


async def confirm_password(request: Request, principal: Principal, password: str, wrong: str) -> None:
    """The signed-in account's own password, re-entered: 401 `wrong` unless it is right. The
    credential signed in before, so it is limited with the account's other credentials
    (login_limits.py) and never waits for a lockout that guessers caused on the account."""
    assert principal.account_id is not None
    runtime = runtime_of(request)
    assert runtime.pool is not None
    async with pooled(runtime.pool) as conn:
        row = await conn.fetchrow(
            "SELECT name, password_hash, password_salt, scrypt_n, scrypt_r, scrypt_p"
            " FROM arkvory_accounts WHERE id = $1",
            principal.account_id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
    if row is None:
        raise Unauthorized("the account no longer exists")
    state = accounts_state(request)
    attempt = state.limits.begin_reentry(str(principal.account_id), row["name"], _client_address(request))
    if not await _checked(state, attempt, password, _stored_hash(row)):
        attempt.failed()
        raise Unauthorized(wrong)
    attempt.passed()


async def create_account(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "accounts")
    key_of(request)
    body = await json_body(request)
    name = check_account_name(body.get("name"))
    password = check_password_text(body.get("password"))
    admin = body.get("admin", False)
    if not isinstance(admin, bool):
        raise InvalidInput("'admin' must be true or false")
    hashed = await accounts_state(request).hasher.hash(password)
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn, conn.transaction():
        row = await insert_account(conn, name, hashed, admin)
        await record_request(conn, request, actor_of(principal), 201, {"name": row["name"], "admin": admin})
    return JSONResponse(account_json(row), status_code=201)


# By name without regard to case (the folded name, unique: migration 0012's index serves the order
# and a prefix's range), or newest or oldest first.
NAME_ORDER = (SortColumn(FOLDED_NAME, "folded"),)
ORDERS = ("name", NEWEST, OLDEST)


def accounts_listing(*, order: str = "name", prefix: str | None = None, cursor: tuple | None = None) -> ListQuery:
    listing = ListQuery(
        f"SELECT {ACCOUNT_COLUMNS}, {FOLDED_NAME} AS folded FROM arkvory_accounts",
        NAME_ORDER if order == "name" else TIME_ID, descending=order == NEWEST,
    )
    listing.starts_with(FOLDED_NAME, None if prefix is None else fold(prefix))
    return listing.after(cursor)


async def list_accounts(request: Request) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "accounts")
    pool = runtime_of(request).pool
    assert pool is not None
    limit = page_limit(request)
    order = page_order(request, "name", ORDERS)
    prefix = text_filter(request, "prefix", MAX_ACCOUNT_NAME)
    cursor = page_cursor(request, NAME_ORDER if order == "name" else TIME_ID)
    listing = accounts_listing(order=order, prefix=prefix, cursor=cursor)
    async with pooled(pool) as conn:
        rows = await listing.fetch(conn, limit)
    return JSONResponse(listing.page(rows, limit, account_json))


async def _set_disabled(request: Request, disabled: bool) -> Response:
    principal = await principal_of(request)
    require_admin_scope(principal, "accounts")
    name = check_account_name(request.path_params["name"])

    async def work(conn: asyncpg.Connection):
        if disabled:
            await lock_for_removal(conn, principal, name, "disable")
        row = await conn.fetchrow(
            f"UPDATE arkvory_accounts SET disabled = $2 WHERE {FOLDED_NAME} = $1 RETURNING {ACCOUNT_COLUMNS}",
            fold(name), disabled,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if row is None:
            raise NotFound(f"no account {name!r}")
        # Under the account's row lock: a disable that committed meanwhile ended this credential
        # if the account made it, and it cannot undo that (credential_makers.py).
        await require_still_valid(conn, principal)
        if disabled:
            # The keys it made are suspended, its sessions and tokens end (and what they made
            # with them), now, on every process (the update and the delete notify).
            await suspend_made_by(conn, row["id"])
            await conn.execute(
                "DELETE FROM arkvory_credentials WHERE account_id = $1", row["id"], timeout=POOLED_QUERY_TIMEOUT_S
            )
        return 200, account_json(row)

    answer = await idempotent(request, principal, {"disabled": disabled}, work)
    forget_cached(runtime_of(request).credentials)
    return answer


async def disable_account(request: Request) -> Response:
    return await _set_disabled(request, True)


async def enable_account(request: Request) -> Response:
    return await _set_disabled(request, False)


routes = [
    Route("/api/v1/login", login, methods=["POST"]),
    Route("/api/v1/logout", logout, methods=["POST"]),
    Route("/api/v1/register", register, methods=["POST"]),
    Route("/api/v1/account/password", change_password, methods=["POST"]),
    Route("/api/v1/accounts", create_account, methods=["POST"]),
    Route("/api/v1/accounts", list_accounts, methods=["GET"]),
    Route("/api/v1/accounts/{name}/disable", disable_account, methods=["POST"]),
    Route("/api/v1/accounts/{name}/enable", enable_account, methods=["POST"]),
]
