"""Tokens of every kind to principals, on every process (SPEC §5).

Four kinds: keys-file tokens (in memory, identity.KeyRing), and three kinds that live in
`arkvory_credentials`: sessions `dps_<id>.<secret>`, personal tokens `pat_<id>.<secret>` and
managed service keys `arkvory_<uuid>.<secret>`. Only the SHA-256 of a token is stored; one
indexed lookup by that digest finds the credential, its account and the account's permissions.
Every kind arrives as `Authorization: Bearer`, or as HTTP Basic's password (authorization.py),
and a session also as the console's cookie.

Revocation must take effect on the next request on every process, so resolved credentials are
remembered (by the token's `identity.memo_key`, a BLAKE2b digest: a hit then costs no SHA-256)
only under the same rule as the catalog cache: while this process LISTENs on
`arkvory_credentials` (migrations 0004, 0014 and 0017 notify on every revocation, expiry change,
suspended key, disabled, deleted or reset account and permission change), flushed on every
notification and on every reconnect, and nothing is remembered *or answered* from memory while
the listener is down. Expiry is checked on every hit against the expiry read from the database. What a revoked
credential made goes with it in the same statement (migration 0014's `ends_with` cascade), so
the one notification covers it too.

Last-used times are collected in memory and written in one statement per control-connection ping
(shared/cluster/control.py, every 2 s; the runtime hooks `flush_last_used` onto it), so a
credential is written at most once per ping, never once per request; gateways record them too.

A process owns one CredentialCache; `resolve` takes it with the key ring and the pool, the parts
it reads, so that any process (the worker's health routes too) can resolve a token.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import secrets
import time
import uuid

import asyncpg

from arkvory.shared.cluster.notified_cache import NotifiedCache
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import Unauthorized

from .authorization import presented_token
from .identity import ANONYMOUS, KeyRing, Principal, memo_key

log = logging.getLogger("arkvory.credentials")

CHANNEL = "arkvory_credentials"
SESSION_COOKIE = "arkvory_session"
MAX_ENTRIES = 10_000
MAX_PENDING_LAST_USED = 100_000
# The shapes of database tokens, checked before hashing or querying anything.
_SECRET = r"[A-Za-z0-9_-]{32,64}"
DATABASE_TOKEN = re.compile(
    rf"(?:dps_[0-9a-f]{{32}}|pat_[0-9a-f]{{32}}"
    rf"|arkvory_[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}})\.{_SECRET}"
)

_LOOKUP = """
SELECT c.id, c.kind, c.access, c.scopes, c.account_id, c.expires_at, a.is_admin, a.must_change_password,
       ARRAY(SELECT p.level || ':' || r.name FROM arkvory_repository_permissions p
             JOIN arkvory_repositories r ON r.id = p.repository_id
             WHERE p.account_id = c.account_id) AS permissions
FROM arkvory_credentials c LEFT JOIN arkvory_accounts a ON a.id = c.account_id
WHERE c.digest = $1 AND c.expires_at > now() AND c.suspended_at IS NULL
  AND (c.account_id IS NULL OR NOT a.disabled)
"""


def digest_of(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclasses.dataclass(frozen=True)
class NewToken:
    """A freshly minted database credential: `token` is shown once and never stored."""

    id: uuid.UUID
    token: str
    digest: bytes


def mint(kind: str) -> NewToken:
    """A new token of `kind` ("session", "pat" or "service_key") in the shape DATABASE_TOKEN takes."""
    credential_id = uuid.uuid4()
    secret = secrets.token_urlsafe(32)
    prefix = {"session": f"dps_{credential_id.hex}", "pat": f"pat_{credential_id.hex}",
              "service_key": f"arkvory_{credential_id}"}[kind]
    token = f"{prefix}.{secret}"
    assert DATABASE_TOKEN.fullmatch(token)
    return NewToken(credential_id, token, digest_of(token))


def account_scopes(is_admin: bool, permissions: list[str], read_only: bool) -> frozenset[str]:
    """An account's permissions as scopes; `read_only` (a `read` personal token) keeps only
    reading, whatever the account may do otherwise."""
    if is_admin:
        return frozenset({"read:*"} if read_only else {"admin"})
    scopes: set[str] = set()
    for permission in permissions:
        level, _, repository = permission.partition(":")
        scopes.add(f"read:{repository}")
        if read_only:
            continue
        if level in ("write", "admin"):
            scopes.add(f"write:{repository}")
        if level == "admin":
            scopes.add(f"admin:{repository}")
    return frozenset(scopes)


def principal_from_row(row: asyncpg.Record) -> Principal:
    if row["kind"] == "service_key":
        return Principal(
            id=f"service:{row['id']}",
            kind="service",
            scopes=frozenset(row["scopes"]),
            credential_id=row["id"],
            credential_kind="service_key",
        )
    read_only = row["kind"] == "pat" and row["access"] == "read"
    if row["kind"] == "session" and row["must_change_password"]:
        # Signed in with a password an administrator set: nothing but setting a new one.
        return Principal(
            id=f"account:{row['account_id']}", kind="account", scopes=frozenset(), account_id=row["account_id"],
            credential_id=row["id"], credential_kind="session", password_change_required=True,
        )
    return Principal(
        id=f"account:{row['account_id']}",  # a session and a token of one account share a budget
        kind="account",
        scopes=account_scopes(row["is_admin"], list(row["permissions"]), read_only),
        read_only=read_only,
        account_id=row["account_id"],
        credential_id=row["id"],
        credential_kind=row["kind"],
    )


@dataclasses.dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires_at: float  # epoch seconds, from the database (same host, same clock)


class CredentialCache(NotifiedCache):
    """Resolved database credentials by the token's `memo_key`, trusted only while the NOTIFY
    listener is up."""

    channel = CHANNEL
    max_entries = MAX_ENTRIES

    def __init__(self, clock=time.time) -> None:
        super().__init__()
        self._clock = clock
        self._used: set[uuid.UUID] = set()

    def get(self, known: bytes) -> Principal | None:
        entry = self._lookup(known)
        if entry is None or entry.expires_at <= self._clock():
            self.misses += 1
            return None
        self.hits += 1
        return entry.principal

    def put(self, known: bytes, principal: Principal, expires_at: float, generation: int) -> None:
        # An answer read before a change notified (generation moved on) may be stale: not kept.
        self._store(known, _Entry(principal, expires_at), generation)

    def note_used(self, credential_id: uuid.UUID) -> None:
        if len(self._used) < MAX_PENDING_LAST_USED:
            self._used.add(credential_id)

    async def flush_last_used(self, conn: asyncpg.Connection, timeout: float) -> int:
        """Write the pending last-used times in one statement; returns how many."""
        if not self._used:
            return 0
        used, self._used = list(self._used), set()
        await conn.execute(
            "UPDATE arkvory_credentials SET last_used_at = now() WHERE id = ANY($1::uuid[])",
            used,
            timeout=timeout,
        )
        return len(used)


def forget_cached(cache: CredentialCache) -> None:
    """After committing a credential change: this process's next request must not wait for the
    notification to come back (other processes hear of it by NOTIFY)."""
    cache.invalidate()


def token_of(authorization: str | None, session_cookie: str | None = None) -> str | None:
    """The `Authorization` header's token (Bearer, or Basic's password: authorization.py), else
    the session cookie (the writer passes it; gateways never do)."""
    token = presented_token(authorization)
    if token is None and session_cookie:
        return session_cookie
    return token


def resolve_now(
    keys: KeyRing,
    cache: CredentialCache,
    authorization: str | None,
    session_cookie: str | None = None,
) -> Principal | None:
    """`resolve` without the database: the principal when this process knows it (no
    credentials, a keys-file key, a database credential it remembers), None when the database
    must be asked (`resolve` does). Every request path runs this; the content routes call it
    directly, so a small download takes no coroutine to learn who asks."""
    token = token_of(authorization, session_cookie)
    if token is None:
        return ANONYMOUS
    known = memo_key(token)
    principal = keys.remembered(known)
    if principal is not None:
        return principal
    # Asked before the key ring's SHA-256: an entry here was stored only after the (immutable)
    # key ring had said no to this very token, so the order changes no answer.
    principal = cache.get(known)
    if principal is None:
        principal = keys.lookup(token, known)
        if principal is not None:
            return principal
        if not DATABASE_TOKEN.fullmatch(token):
            raise Unauthorized("the token is not valid")
        return None
    assert principal.credential_id is not None
    cache.note_used(principal.credential_id)
    return principal


async def resolve(
    keys: KeyRing,
    cache: CredentialCache,
    pool: asyncpg.Pool | None,
    authorization: str | None,
    session_cookie: str | None = None,
) -> Principal:
    """The principal behind the request on any process; ANONYMOUS without credentials.
    An unknown, revoked or expired token is 401, whatever its kind."""
    principal = resolve_now(keys, cache, authorization, session_cookie)
    if principal is not None:
        return principal
    return await _resolve_from_database(cache, pool, token_of(authorization, session_cookie))


async def _resolve_from_database(cache: CredentialCache, pool: asyncpg.Pool | None, token: str | None) -> Principal:
    """A database token (its shape checked) that this process does not remember."""
    assert pool is not None and token is not None
    generation = cache.generation
    async with pooled(pool) as conn:
        row = await conn.fetchrow(_LOOKUP, digest_of(token), timeout=POOLED_QUERY_TIMEOUT_S)
    if row is None:
        raise Unauthorized("the token is not valid")
    principal = principal_from_row(row)
    cache.put(memo_key(token), principal, row["expires_at"].timestamp(), generation)
    assert principal.credential_id is not None
    cache.note_used(principal.credential_id)
    return principal
