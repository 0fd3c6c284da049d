"""A repository's retention rule through the writer's API (issue 25 item 10): show, set, delete,
and the preview (the dry run) followed page by page. Every call is a repository admin's.

A rule is saved disabled unless `enabled=True` is passed: preview it first. An artifact is
deleted only when it is beyond the newest `keep_newest` and older than `keep_younger_than_s`
(a rule with one limit keeps by that one alone); a package version or an asset pointing at it
always keeps it.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

from .errors import ClientError
from .transport import Transport

# A server that never ends the preview does not keep the client looping: a million artifacts
# fit in 1000 pages of 1000.
MAX_PAGES = 1000


def _path(repo: str, tail: str = "") -> str:
    return f"/api/v1/repositories/{urllib.parse.quote(repo, safe='')}/retention{tail}"


def show(transport: Transport, repo: str) -> dict[str, Any]:
    """The rule's JSON (NotFoundError when the repository has none)."""
    return transport.json("GET", _path(repo), f"retention rule of {repo}")


def set_rule(
    transport: Transport, repo: str, *, keep_newest: int | None, keep_younger_than_s: int | None, enabled: bool
) -> dict[str, Any]:
    """Replace the rule (one Idempotency-Key for every attempt); returns its JSON."""
    body = {"keepNewest": keep_newest, "keepYoungerThanSeconds": keep_younger_than_s, "enabled": enabled}
    rule = transport.json(
        "PUT", _path(repo), f"set the retention rule of {repo}", json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    if not isinstance(rule, dict):
        raise ClientError(f"set the retention rule of {repo}: unexpected answer")
    return rule


def delete(transport: Transport, repo: str) -> None:
    transport.request(
        "DELETE", _path(repo), f"delete the retention rule of {repo}", headers={"Idempotency-Key": uuid.uuid4().hex}
    )


def preview(
    transport: Transport,
    repo: str,
    *,
    keep_newest: int | None = None,
    keep_younger_than_s: int | None = None,
    page_size: int = 1000,
) -> Iterator[dict[str, Any]]:
    """The artifacts the next cleanup would delete, oldest first, pages followed as they are
    read: of the saved rule, or of the limits given (then nothing needs to be saved)."""
    params: dict[str, str] = {"limit": str(page_size)}
    if keep_newest is not None:
        params["keepNewest"] = str(keep_newest)
    if keep_younger_than_s is not None:
        params["keepYoungerThanSeconds"] = str(keep_younger_than_s)
    what = f"retention preview of {repo}"
    for _ in range(MAX_PAGES):
        page = transport.json("GET", _path(repo, "/preview"), what, params=params)
        items = page.get("items") if isinstance(page, dict) else None
        cursor = page.get("nextCursor") if isinstance(page, dict) else None
        if not isinstance(items, list) or not (cursor is None or isinstance(cursor, str)):
            raise ClientError(f"{what}: unexpected answer")
        yield from items
        if not cursor:
            return
        params["cursor"] = cursor
    raise ClientError(f"{what}: more than {MAX_PAGES} pages")
