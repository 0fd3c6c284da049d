"""The filters and order of each list page: a GET form above the list (a search works without any
script and its address can be bookmarked), its values handed to the API's list as they are (the
API checks them: a refusal is shown on the page, above an empty list), and kept by the pager.

The console asks for newest first where a list has a time (artifacts, tokens, keys, tasks): what
a person looks for after a build is its newest artifacts; the API keeps its own defaults for the
programs that page through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from ..tasks.kinds import KIND_NAMES
from ..tasks.store import STATUSES
from .internal import InternalApi, Refused

PAGE_SIZE = "50"
_ORDER_LABELS = {"newest": "newest first", "oldest": "oldest first", "name": "by name", "sha256": "by digest"}


@dataclasses.dataclass(frozen=True)
class Field:
    """One filter of a list: a text box, or a choice among `choices` (the first of which is the
    console's default when `default` is set; else "any")."""

    name: str
    label: str
    choices: tuple[str, ...] = ()
    default: str | None = None
    max_length: int = 255

    def choice_label(self, choice: str) -> str:
        return _ORDER_LABELS.get(choice, choice) if self.name == "order" else choice


def _order(*choices: str) -> Field:
    return Field("order", "Order", choices, default=choices[0])


@dataclasses.dataclass(frozen=True)
class ListFilters:
    """The filters of one list page, as one request chose them."""

    action: str
    label: str
    fields: tuple[Field, ...]
    chosen: Mapping[str, str]

    @property
    def narrowed(self) -> bool:
        """Whether a filter (not only an order) narrows the list."""
        return any(name != "order" for name in self.chosen)

    @property
    def order(self) -> str | None:
        field = next((f for f in self.fields if f.name == "order"), None)
        return None if field is None else self.chosen.get("order", field.default)

    def api_query(self, request: Request) -> dict[str, str]:
        """What to ask the API's list: the filters, the order (the console's default too), a page."""
        query = dict(self.chosen)
        if self.order is not None:
            query["order"] = self.order
        cursor = request.query_params.get("cursor")
        return {**query, "limit": PAGE_SIZE, **({"cursor": cursor} if cursor else {})}


PAGES: dict[str, tuple[Field, ...]] = {
    "repositories": (Field("prefix", "Name starts with", max_length=100),),
    "artifacts": (Field("prefix", "Name starts with"), Field("sha256", "SHA-256", max_length=64),
                  _order("newest", "oldest")),
    "packages": (Field("group", "Group"), Field("name", "Name"), Field("prefix", "Name starts with"),
                 _order("name", "newest", "oldest")),
    "assets": (Field("prefix", "Path starts with", max_length=1024),),
    "accounts": (Field("prefix", "Name starts with", max_length=64), _order("name", "newest", "oldest")),
    "tokens": (Field("prefix", "Label starts with", max_length=200), _order("newest", "oldest")),
    "keys": (Field("prefix", "Label starts with", max_length=200), _order("newest", "oldest")),
    "tasks": (Field("kind", "Kind", tuple(sorted(KIND_NAMES))), Field("status", "Status", STATUSES),
              _order("newest", "oldest")),
}


def filters_of(request: Request, page: str, action: str, label: str) -> ListFilters:
    """The filters `request` chose for the list page `page` (empty values: no filter)."""
    fields = PAGES[page]
    chosen = {}
    for field in fields:
        value = request.query_params.get(field.name)
        if value:  # the API bounds and checks it; the form's own bounds are only a help
            chosen[field.name] = value
    return ListFilters(action, label, fields, chosen)


async def fetch_listing(api: InternalApi, path: str, request: Request, filters: ListFilters) -> tuple[dict[str, Any], Refused | None]:
    """One page of the API's list at `path` with these filters; a refusal of what was typed
    (400) comes back beside an empty list, to be shown with the form that can correct it."""
    try:
        return await api.fetch(path, filters.api_query(request)), None
    except Refused as refusal:
        if refusal.status != 400:
            raise
        return {"items": [], "nextCursor": None}, refusal
