"""A repository's retention rule in the console (issue 25 item 10): the rule, the preview of what
the next cleanup would delete (of the saved rule, or of limits typed into the preview form, which
saves nothing), and the forms that save, disable and delete the rule (the last two after their
confirmation page, confirm.py).

Every read and change is the API's (writer/catalog/retention.py) as the signed-in account, so
only the repository's admins get past the first call. Enabling is explicit: the save form's
"enabled" box is never ticked for you, and saving without it leaves the rule disabled. Limits
are typed as a count and a duration (`30d`, `12h`, `90m`), as the CLI takes them.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.errors import ApiError, InvalidInput

from .catalog import _abilities, _base
from . import confirm
from .confirm import asks_first
from .forms import Form
from .internal import Refused, api_path
from .session import ConsoleUser, action, api_for, page, refusal_status, render, see_other

PREVIEW_PAGE = "50"
MAX_DIGITS = 12  # past every bound of the API; the API refuses what is out of range
_DURATION = re.compile(r"([0-9]{1,12})\s*([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_text(seconds: Any) -> str:
    """3600 → '1h', 2592000 → '30d': the largest unit that divides it; '' for None."""
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _limits_of(fields: dict[str, str]) -> dict[str, int | None]:
    """The API's limits from the form fields `keep_newest` (a count) and `keep_younger_than` (a
    duration); an empty field is no limit."""
    newest = (fields.get("keep_newest") or "").strip()
    younger = (fields.get("keep_younger_than") or "").strip().lower()
    if newest and not (newest.isascii() and newest.isdigit() and len(newest) <= MAX_DIGITS):
        raise InvalidInput("'keep newest' must be a whole number (digits only)")
    found = _DURATION.fullmatch(younger) if younger.isascii() else None
    if younger and found is None:
        raise InvalidInput("'keep younger than' must be a duration such as 30d, 12h or 90m")
    return {
        "keepNewest": int(newest) if newest else None,
        "keepYoungerThanSeconds": int(found.group(1)) * _UNIT_SECONDS[found.group(2)] if found else None,
    }


def _page_fields(request: Request) -> dict[str, str]:
    return {name: request.query_params.get(name, "") for name in ("keep_newest", "keep_younger_than")}


async def _retention(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                     form: Form | None = None) -> Response:
    name = request.path_params["repo"]
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", name))
    path = api_path("repositories", name, "retention")
    try:
        rule = await api.fetch(path)
    except Refused as refusal:
        if refusal.status != 404:
            raise
        rule = None
    typed = _page_fields(request)
    preview: dict[str, Any] | None = None
    try:
        asked = _limits_of(typed) if any(typed.values()) else None
        if asked is not None or rule is not None:
            query = {"limit": PREVIEW_PAGE, "cursor": request.query_params.get("cursor") or None}
            query.update({k: str(v) for k, v in (asked or {}).items() if v is not None})
            preview = await api.fetch(path + "/preview", query)
    except (Refused, InvalidInput) as refusal:
        error = error or refusal
    if form is not None:
        shown = {"keep_newest": form.text("keep_newest"), "keep_younger_than": form.text("keep_younger_than")}
    elif any(typed.values()):
        shown = typed
    elif rule is not None:
        shown = {"keep_newest": str(rule["keepNewest"] or ""), "keep_younger_than": duration_text(rule["keepYoungerThanSeconds"])}
    else:
        shown = {"keep_newest": "", "keep_younger_than": ""}
    return render(
        request, user, "repository_retention.html",
        {"repository": repository, "base": _base(repository["name"]), "rule": rule, "preview": preview,
         "typed": typed if any(typed.values()) else None, "shown": shown, "duration_text": duration_text,
         **_abilities(user, repository["name"])},
        status=refusal_status(error) if error else 200, error=error.message if error else None,
    )


@page
async def retention_page(request: Request, user: ConsoleUser) -> Response:
    return await _retention(request, user)


@action
async def save_rule(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["repo"]
    try:
        body = {**_limits_of(form.fields), "enabled": form.checked("enabled")}
        await api_for(request, user).change("PUT", api_path("repositories", name, "retention"), body,
                                            key=form.optional("key"))
    except (Refused, InvalidInput) as refusal:
        return await _retention(request, user, error=refusal, form=form)
    return see_other(f"/console/repositories/{name}/retention", "retention-saved")


@action
@asks_first(confirm.disable_retention)
async def disable_rule(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["repo"]
    api = api_for(request, user)
    path = api_path("repositories", name, "retention")
    try:
        rule = await api.fetch(path)
        body = {"keepNewest": rule["keepNewest"], "keepYoungerThanSeconds": rule["keepYoungerThanSeconds"],
                "enabled": False}
        await api.change("PUT", path, body, key=form.optional("key"))
    except Refused as refusal:
        return await _retention(request, user, error=refusal)
    return see_other(f"/console/repositories/{name}/retention", "retention-disabled")


@action
@asks_first(confirm.delete_retention)
async def delete_rule(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["repo"]
    try:
        await api_for(request, user).change("DELETE", api_path("repositories", name, "retention"),
                                            key=form.optional("key"))
    except Refused as refusal:
        return await _retention(request, user, error=refusal)
    return see_other(f"/console/repositories/{name}/retention", "retention-deleted")
