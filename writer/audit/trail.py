"""An audit entry and its INSERT: who acted, what they did, and from where.

`record(conn, actor, entry, origin)` runs on the connection of the change's own transaction,
so the entry commits with the change or not at all. Who acted is a principal (`actor_of`) or
an admin tool run on the database (`tool_actor`); the name of an account or managed key is
read in the INSERT itself, as it is at the change (an entry keeps it after the account goes).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import socket
import uuid
from collections.abc import Mapping
from typing import Any

import asyncpg
from starlette.requests import Request

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.http.client_address import client_address
from arkvory.shared.http.edge import request_id

from .summary import storable, summary

MAX_TARGET = 500  # an asset path or group/name/version, as the catalog bounds them


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who acted: a principal's kind and id, the credential it used (its id, never the token)."""

    kind: str  # account | service | key | anonymous | tool
    id: str
    name: str | None = None  # None: read from the account (or managed key) in the INSERT
    account_id: uuid.UUID | None = None
    credential_kind: str | None = None  # session | pat | service_key
    credential_id: uuid.UUID | None = None


def actor_of(principal: Principal) -> Actor:
    name = principal.id.removeprefix("key:") if principal.kind == "key" else None
    return Actor(
        principal.kind, principal.id, name, principal.account_id, principal.credential_kind, principal.credential_id
    )


def account_actor(account_id: uuid.UUID, name: str, session_id: uuid.UUID | None = None) -> Actor:
    """An account acting before it has a principal: signing in (with the session it gets) or
    signing up."""
    return Actor("account", f"account:{account_id}", name, account_id,
                 "session" if session_id else None, session_id)


def tool_actor(command: str) -> Actor:
    """An admin tool (`arkvory admin ...`) run by a system user on a host: itself the actor."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return Actor("tool", f"tool:{command}", f"{user}@{socket.gethostname()}")


@dataclasses.dataclass(frozen=True)
class Entry:
    """What was done: the action, how it ended, what it changed, a summary of its parameters."""

    action: str
    status: int | None = None
    outcome: str = "ok"  # ok | refused
    repository: str | None = None
    target: str | None = None
    details: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where the request came from; none for a tool."""

    client_address: str | None = None
    request_id: str | None = None


def origin_of(request: Request) -> Origin:
    settings = request.app.state.runtime.settings
    return Origin(client_address(request.scope, settings.trusted_proxies), request_id(request.scope))


_INSERT = """
INSERT INTO arkvory_audit (actor_kind, actor_id, actor_name, credential_kind, credential_id, action, outcome,
                           status, repository, target, details, client_address, request_id)
VALUES ($1, $2, coalesce($3, (SELECT name FROM arkvory_accounts WHERE id = $14),
                         (SELECT nullif(label, '') FROM arkvory_credentials WHERE id = $5 AND kind = 'service_key')),
        $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13)
"""


def _text(value: str | None, at_most: int = MAX_TARGET) -> str | None:
    return None if value is None else storable(value, at_most)


async def record(conn: asyncpg.Connection, actor: Actor, entry: Entry, origin: Origin = Origin()) -> None:
    """One entry, on `conn` (in the change's transaction when there is one)."""
    await conn.execute(
        _INSERT,
        actor.kind, _text(actor.id), _text(actor.name), actor.credential_kind, actor.credential_id,
        entry.action, entry.outcome, entry.status, _text(entry.repository), _text(entry.target),
        json.dumps(summary(entry.details), default=str), origin.client_address, _text(origin.request_id, 100),
        actor.account_id,
        timeout=POOLED_QUERY_TIMEOUT_S,
    )


async def record_tool_change(conn: asyncpg.Connection, command: str, entry: Entry) -> bool:
    """An admin tool's change, as the tool; False (nothing recorded) on a database the writer has
    not migrated to the audit trail yet (a tool may run before the writer's first start)."""
    if not await conn.fetchval("SELECT to_regclass('arkvory_audit') IS NOT NULL", timeout=POOLED_QUERY_TIMEOUT_S):
        return False
    await record(conn, tool_actor(command), entry)
    return True
