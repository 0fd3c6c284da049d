"""Who makes a personal token or a managed service key, and what ends it (SPEC §5; the columns
are migration 0014's).

A credential made without the account's password given again is tied (`ends_with`) to the
credential that asked for it, a session, a personal token or a managed key: it expires no later
(tokens.py caps the expiry in its insert) and a foreign key's cascade deletes it with its maker.
So a logout, a revocation, the sessions a password change or a login past the session limit
ends, and cleanup's deletion of an expired maker each end what that maker made, in the same
statement and with the same notification to every process. With the password given again, the
password makes it, as it makes a session: it is tied to nothing and may outlive the session,
but not the account.

Every token and key records the account that answers for it (for a key made by a managed key,
that key's; none for a keys-file key). Disabling an account deletes its sessions and tokens and
suspends the managed keys it made, tied or not: a suspended key is refused (401) everywhere
until an administrator adopts it (service_keys.py), which makes the key theirs as if they made it
now. Enabling the account again revives none of them: a key made by a stolen session must not
come back with its victim, and cannot act to bring the victim back (`require_still_valid`).

Races: making or adopting locks the maker account's row (FOR NO KEY UPDATE) and checks that it
is enabled; a disable updates that row before it suspends, so a key made meanwhile is either
seen by the suspension or refused. The tie is a foreign key: a maker deleted meanwhile makes
the insert fail, never leaves a credential that outlives it.
"""

from __future__ import annotations

import dataclasses
import uuid

import asyncpg

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.errors import Unauthorized


@dataclasses.dataclass(frozen=True)
class Making:
    """How a credential is being made (or adopted): the migration's columns for it."""

    account_id: uuid.UUID | None  # maker_account_id
    through: str  # made_through: 'session:<id>', 'pat:<id>', 'service_key:<id>', 'keys_file:<id>'
    password_given: bool
    ends_with: uuid.UUID | None  # the credential whose end ends it (None: a keys-file key, or the password)


def _through(principal: Principal) -> str:
    if principal.credential_id is not None:
        return f"{principal.credential_kind}:{principal.credential_id}"
    assert principal.kind == "key", principal.kind
    return f"keys_file:{principal.id.removeprefix('key:')}"


async def making_of(conn: asyncpg.Connection, principal: Principal, password_given: bool) -> Making:
    """What `principal` makes now, inside the making transaction: its maker account's row is
    locked and known to be enabled (401 otherwise) until the transaction ends."""
    account_id = principal.account_id
    if account_id is None and principal.credential_kind == "service_key":
        # A managed key answers for what it makes with its own maker account.
        found = await conn.fetchrow(
            "SELECT maker_account_id FROM arkvory_credentials WHERE id = $1", principal.credential_id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if found is None:
            raise Unauthorized("the key making this one was revoked meanwhile")
        account_id = found["maker_account_id"]
    if account_id is not None:
        disabled = await conn.fetchval(
            "SELECT disabled FROM arkvory_accounts WHERE id = $1 FOR NO KEY UPDATE", account_id,
            timeout=POOLED_QUERY_TIMEOUT_S,
        )
        if disabled is None:
            raise Unauthorized("the account no longer exists")
        if disabled:
            raise Unauthorized("the account answering for this credential is disabled")
    return Making(
        account_id=account_id,
        through=_through(principal),
        password_given=password_given,
        ends_with=None if password_given else principal.credential_id,
    )


async def suspend_made_by(conn: asyncpg.Connection, account_id: uuid.UUID) -> None:
    """At a disable, before the account's sessions and tokens are deleted: suspend every managed
    key the account made, and untie those made through the sessions and tokens about to go, so
    that the cascade does not delete them: suspended, an administrator may still adopt them."""
    await conn.execute(
        "UPDATE arkvory_credentials SET suspended_at = coalesce(suspended_at, now()),"
        " ends_with = CASE WHEN ends_with IN (SELECT id FROM arkvory_credentials WHERE account_id = $1)"
        " THEN NULL ELSE ends_with END"
        " WHERE kind = 'service_key' AND maker_account_id = $1",
        account_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )


async def require_still_valid(conn: asyncpg.Connection, principal: Principal) -> None:
    """A change of who may act (enabling an account) made with a database credential: after
    the change took its locks, that credential must still be valid. A key suspended (or a token
    deleted) by a disable that committed meanwhile cannot undo the disable."""
    if principal.credential_id is None:
        return  # a keys-file key: only the operator removes it
    valid = await conn.fetchval(
        "SELECT 1 FROM arkvory_credentials WHERE id = $1 AND expires_at > now() AND suspended_at IS NULL",
        principal.credential_id, timeout=POOLED_QUERY_TIMEOUT_S,
    )
    if valid is None:
        raise Unauthorized("the token is not valid")
