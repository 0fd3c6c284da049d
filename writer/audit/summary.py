"""A change's parameters as an audit entry keeps them: bounded, and without a secret.

The routes hand the audit the parameters they already name for Idempotency-Key (writer/
idempotency.py), which never hold a password (the routes that take one record no key), or a
summary they build themselves. This is the second line: a field whose name says it holds a
secret keeps only that it was given, and a string that holds a token of any kind Arkvory
makes is dropped, wherever it is. So a client that sends a token in a label is not recorded
either.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A field named so holds a secret (or its digest); only a yes/no of it is kept.
_SECRET_NAME = re.compile(r"password|passwd|token|secret|digest|cookie|authorization|credential_?value", re.I)
# Every token Arkvory makes (shared/auth/credentials.py mint, the keys file's `new-key`):
# sessions, personal tokens, managed keys, keys-file keys.
_TOKEN = re.compile(
    r"(dps|pat)_[0-9a-fA-F]{32}\.|arkvory_[0-9a-fA-F-]{36}\.|arkvory_key_|Bearer\s", re.I
)
NOT_RECORDED = "(not recorded)"
MAX_STRING = 200
MAX_ITEMS = 50
MAX_DEPTH = 4
MAX_BYTES = 4096


def summary(value: Any) -> dict[str, Any]:
    """`value` (a JSON-like mapping) as an entry keeps it: at most MAX_BYTES of JSON."""
    if value is None:
        return {}
    kept = _kept(value if isinstance(value, dict) else {"value": value}, 0)
    assert isinstance(kept, dict)
    if len(json.dumps(kept, default=str)) <= MAX_BYTES:
        return kept
    return {"truncated": True, "fields": sorted(kept)[:MAX_ITEMS]}


def _kept(value: Any, depth: int) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return storable(value, MAX_STRING)
    if depth >= MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        kept: dict[str, Any] = {}
        for key, item in list(value.items())[:MAX_ITEMS]:
            name = storable(str(key), MAX_STRING)
            if _SECRET_NAME.search(name) and not isinstance(item, bool):
                kept[name] = None if item is None else NOT_RECORDED
            else:
                kept[name] = _kept(item, depth + 1)
        return kept
    if isinstance(value, (list, tuple)):
        return [_kept(item, depth + 1) for item in list(value)[:MAX_ITEMS]]
    return storable(str(value), MAX_STRING)


def storable(value: str, at_most: int) -> str:
    """`value` as PostgreSQL text holds it, at most `at_most` characters: lone surrogates (from
    a hostile JSON body) replaced, NUL (which text and jsonb refuse) dropped, a token dropped."""
    if _TOKEN.search(value):
        return NOT_RECORDED
    value = value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "")
    return value if len(value) <= at_most else value[:at_most] + "…"
