"""Query parameters a route declares: any other is 400 naming it, and so is one given twice.

A misspelt or unsupported filter (`?sha25=…`, or `?sha256=` where the route has none) would
otherwise be ignored and answer the whole list as if it were the filtered one; a repeated one
would silently take one of its values. Each /api/v1 route declares what it reads: the writer's
routes through their OpenAPI operation (writer/request_inputs.py wraps them), the content routes
every process serves through their own list (shared/download/content.py). A route then reads
a value with `query_value`, which refuses a name the route did not declare: the declaration
cannot fall behind the code without the route failing its own tests.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.types import Scope

from arkvory.shared.errors import InvalidInput

DECLARED_KEY = "arkvory.query_declared"  # in the scope: the names the matched route declared
_NAME_SHOWN = 64  # of a client's parameter name in the error


def checked_query(scope: Scope, declared: Collection[str], route: str) -> QueryParams:
    """The request's query parameters, after refusing any that `route` does not declare or that
    is given more than once (400 naming it); remembers `declared` for `query_value`."""
    scope[DECLARED_KEY] = declared
    raw = scope.get("query_string", b"")
    params = QueryParams(raw)
    if not raw:
        return params
    seen: set[str] = set()
    for name, _ in params.multi_items():
        if name not in declared:
            takes = ", ".join(sorted(declared)) if declared else "none"
            raise InvalidInput(f"unknown query parameter {_shown(name)} for {route} (it takes: {takes})")
        if name in seen:
            raise InvalidInput(f"query parameter {name!r} is given more than once")
        seen.add(name)
    return params


def query_value(request: Request, name: str) -> str | None:
    """The value of the declared query parameter `name`, or None when the request has none."""
    declared = request.scope.get(DECLARED_KEY)
    # A route reading what it did not declare is this program's mistake (a 500, found by its tests).
    assert declared is not None and name in declared, f"the route reads undeclared query parameter {name!r}"
    return request.query_params.get(name)


def _shown(name: str) -> str:
    cut = name[:_NAME_SHOWN] + ("…" if len(name) > _NAME_SHOWN else "")
    return repr(cut)
