"""Who uploaded an artifact (issue 25 §1, migration 0019): the principal as it was at the upload,
copied into the artifact's row so that the artifact still says who it was after the account or
key is gone.

A principal's id is `account:<uuid>`, `service:<uuid>` (a managed key) or `key:<id>` (a
keys-file key): its kind and id are those two halves; its name is the account's name, the
managed key's label (none when it has no label) or the keys-file key's id. Artifacts uploaded
before the migration say nothing (`uploadedBy` null).
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S

KINDS = ("account", "service", "key")
COLUMNS = "uploaded_by_kind, uploaded_by_id, uploaded_by_name"


async def uploader_of(conn: asyncpg.Connection, principal_id: str) -> tuple[str, str, str | None]:
    """(kind, id, name) of the principal `principal_id` now, for the artifact it publishes (a
    one-shot upload's principal, or an upload session's, which only its principal completes)."""
    kind, _, ident = principal_id.partition(":")
    assert kind in KINDS and ident, principal_id
    if kind == "key":
        return kind, ident, ident
    query = ("SELECT name FROM arkvory_accounts WHERE id = $1" if kind == "account"
             else "SELECT nullif(label, '') FROM arkvory_credentials WHERE id = $1")
    name = await conn.fetchval(query, uuid.UUID(ident), timeout=POOLED_QUERY_TIMEOUT_S)
    return kind, ident, name


def uploader_json(row: Any) -> dict[str, Any] | None:
    if row["uploaded_by_kind"] is None:
        return None
    return {"kind": row["uploaded_by_kind"], "id": row["uploaded_by_id"], "name": row["uploaded_by_name"]}


SCHEMA = {
    "type": ["object", "null"],
    "description": "who uploaded it, as it was then (null: uploaded before this was recorded)",
    "required": ["kind", "id", "name"],
    "properties": {
        "kind": {"type": "string", "enum": list(KINDS), "description": "an account, a managed service key"
                 " (service) or a keys-file key (key)"},
        "id": {"type": "string", "description": "the account's or managed key's id, or the keys-file key's id"},
        "name": {"type": ["string", "null"], "description": "the account's name, the managed key's label"
                 " (null without one) or the keys-file key's id, at the upload"},
    },
}
