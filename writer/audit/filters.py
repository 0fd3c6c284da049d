"""The audit list's filters, read from a query (the API's, and the console's form, which sends
the same names): each one checked and bounded, an unknown name refused, and turned into SQL
conditions of the list's one query. Pure: no request, no database.

    principal   a principal id (account:<uuid>, service:<uuid>, key:<id>, tool:<command>), or a
                name (account name, keys-file key id, managed key label), without regard to case
    action      an action (repository.delete), or a family of them (repository)
    repository  the repository the change was in
    target      what it changed (an artifact id, an account name, group/name/version, ...)
    outcome     ok | refused
    since       entries at or after this time (ISO 8601; without an offset: UTC)
    until       entries before this time
    order       newest (the default) | oldest
    limit, cursor  pagination.py's
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable

from arkvory.shared.errors import InvalidInput

from .actions import ACTION_NAMES, FAMILIES

NAMES = ("principal", "action", "repository", "target", "outcome", "since", "until", "order", "limit", "cursor")
OUTCOMES = ("ok", "refused")
ORDERS = ("newest", "oldest")
MAX_TEXT = 500
MAX_TIME = 64


@dataclasses.dataclass(frozen=True)
class AuditFilters:
    principal_id: str | None = None
    principal_name: str | None = None
    actions: tuple[str, ...] | None = None
    repository: str | None = None
    target: str | None = None
    outcome: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    newest_first: bool = True

    @classmethod
    def from_query(cls, items: Iterable[tuple[str, str]]) -> AuditFilters:
        """From the query's (name, value) pairs; 400 naming the parameter on anything wrong."""
        given: dict[str, str] = {}
        for name, value in items:
            if name not in NAMES:
                raise InvalidInput(f"unknown query parameter {name!r}; known: {', '.join(NAMES)}")
            if name in given:
                raise InvalidInput(f"query parameter {name!r} is given more than once")
            given[name] = value
        values = {name: value for name, value in given.items() if value != "" and name not in ("limit", "cursor")}
        principal = _text(values, "principal")
        order = values.get("order", "newest")
        if order not in ORDERS:
            raise InvalidInput(f"query parameter 'order' must be one of: {', '.join(ORDERS)}")
        outcome = values.get("outcome")
        if outcome is not None and outcome not in OUTCOMES:
            raise InvalidInput(f"query parameter 'outcome' must be one of: {', '.join(OUTCOMES)}")
        since, until = _time(values, "since"), _time(values, "until")
        if since is not None and until is not None and until <= since:
            raise InvalidInput("query parameter 'until' must be later than 'since'")
        return cls(
            principal_id=principal if principal is not None and ":" in principal else None,
            principal_name=principal if principal is not None and ":" not in principal else None,
            actions=_actions(values.get("action")),
            repository=_text(values, "repository"),
            target=_text(values, "target"),
            outcome=outcome,
            since=since,
            until=until,
            newest_first=order == "newest",
        )

    def conditions(self, first: int = 1) -> tuple[list[str], list[object]]:
        """SQL conditions on arkvory_audit and their arguments, numbered from `$first`: only those
        of the filters given, so each query plans for the index its filters can use."""
        conditions: list[str] = []
        arguments: list[object] = []

        def add(sql: str, value: object) -> None:
            arguments.append(value)
            conditions.append(sql.format(f"${first + len(arguments) - 1}"))

        if self.principal_id is not None:
            add("actor_id = {}", self.principal_id)
        if self.principal_name is not None:
            add("lower(actor_name) = lower({})", self.principal_name)
        if self.actions is not None:
            add("action = ANY({}::text[])", list(self.actions))
        if self.repository is not None:
            add("repository = {}", self.repository)
        if self.target is not None:
            add("target = {}", self.target)
        if self.outcome is not None:
            add("outcome = {}", self.outcome)
        if self.since is not None:
            add("at >= {}", self.since)
        if self.until is not None:
            add("at < {}", self.until)
        return conditions, arguments


def _text(values: dict[str, str], name: str) -> str | None:
    value = values.get(name)
    if value is None:
        return None
    if len(value) > MAX_TEXT or not value.isprintable():
        raise InvalidInput(f"query parameter {name!r} must be 1-{MAX_TEXT} printable characters")
    return value


def _actions(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if value in ACTION_NAMES:
        return (value,)
    if value in FAMILIES:
        return tuple(name for name in ACTION_NAMES if name.startswith(value + "."))
    raise InvalidInput(
        f"query parameter 'action' must be an action or a family of them ({', '.join(FAMILIES)});"
        f" actions: {', '.join(ACTION_NAMES)}"
    )


def _time(values: dict[str, str], name: str) -> datetime.datetime | None:
    value = values.get(name)
    if value is None:
        return None
    try:
        if len(value) > MAX_TIME:
            raise ValueError
        moment = datetime.datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        return moment.astimezone(datetime.UTC)  # year 1 at +14:00 is before year 1 in UTC: refused
    except (ValueError, OverflowError):
        raise InvalidInput(
            f"query parameter {name!r} must be a time such as 2026-01-31T12:00:00Z (ISO 8601)"
        ) from None
