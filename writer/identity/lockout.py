"""What keeps an installation from locking itself out when accounts are disabled or deleted
(issue 25 §1).

Two rules, checked in the transaction that disables or deletes:

- an account never disables or deletes itself (403): one click on the wrong row would end the
  administrator's own session in the middle of their work, and another administrator (or a
  keys-file key) can always do it;
- the last enabled administrator account is disabled or deleted only with a keys-file admin key
  (409 otherwise): the console and every account would be left without anyone to manage them,
  while a keys-file key (ARKVORY_KEYS_FILE) is the operator's own, in a file on the host, and no
  change in the database takes it away: whoever holds one can always create an administrator
  again (`POST /api/v1/accounts`, or `arkvory admin create-user --admin` on the host).

A managed admin key does not count as the way back: disabling or deleting the account that made
it suspends it (credential_makers.py).

Races: every enabled administrator account's row is locked (in id order, as every such
transaction locks them) with the target's, and the count is taken under those locks, so two
administrators who remove each other at once cannot both succeed.
"""

from __future__ import annotations

import asyncpg

from arkvory.shared.auth.identity import Principal
from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S
from arkvory.shared.errors import Conflict, Forbidden, NotFound

from .account_names import FOLDED_NAME, fold


async def lock_for_removal(conn: asyncpg.Connection, principal: Principal, name: str, verb: str) -> asyncpg.Record:
    """The account `name` (id, name, is_admin, disabled), locked until the transaction ends,
    after the two rules above allowed `principal` to `verb` ("disable", "delete") it."""
    rows = await conn.fetch(
        f"SELECT id, name, is_admin, disabled, {FOLDED_NAME} = $1 AS wanted FROM arkvory_accounts"
        f" WHERE (is_admin AND NOT disabled) OR {FOLDED_NAME} = $1 ORDER BY id FOR UPDATE",
        fold(name), timeout=POOLED_QUERY_TIMEOUT_S,
    )
    target = next((row for row in rows if row["wanted"]), None)
    if target is None:
        raise NotFound(f"no account {name!r}")
    if target["id"] == principal.account_id:
        raise Forbidden(f"an account cannot {verb} itself: ask another administrator")
    if target["is_admin"] and not target["disabled"] and principal.kind != "key":
        others = [row for row in rows if row["is_admin"] and not row["disabled"] and row["id"] != target["id"]]
        if not others:
            raise Conflict(
                f"{target['name']!r} is the last enabled administrator account: make another administrator"
                f" first, or {verb} it with a keys-file admin key (ARKVORY_KEYS_FILE)"
            )
    return target
