"""A repository's members in the console (issue 25 §2): the Members tab of a repository, for its
admins and the installation's administrators, as the API allows (`/members`, writer/catalog/
permissions.py): who may read, write or administer it, a page at a time, each level changed in
its row, a member removed after its confirmation page (confirm.py), and a form to add one.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from arkvory.shared.errors import ApiError, InvalidInput

from . import confirm
from .confirm import asks_first
from .forms import Form
from .internal import Refused, api_path
from .session import ConsoleUser, action, api_for, page, refusal_status, render, see_other
from .views import repository_path

PAGE_SIZE = "50"
LEVELS = ("read", "write", "admin")


def _members_path(repo: str) -> str:
    return repository_path(repo) + "/members"


async def _members(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                   form: Form | None = None) -> Response:
    name = request.path_params["repo"]
    api = api_for(request, user)
    repository = await api.fetch(api_path("repositories", name))
    listing = await api.fetch(api_path("repositories", name, "members"),
                              {"limit": PAGE_SIZE, "cursor": request.query_params.get("cursor") or None})
    context = {
        "repository": repository, "base": repository_path(repository["name"]),
        "listing": listing, "members": listing["items"], "levels": LEVELS, **user.abilities(repository["name"]),
        "form": {k: v for k, v in (form.fields if form else {}).items() if k in ("account", "level")},
    }
    return render(request, user, "members.html", context,
                  status=refusal_status(error) if error else 200, error=error.message if error else None)


@page
async def members_page(request: Request, user: ConsoleUser) -> Response:
    return await _members(request, user)


async def permissions_page(request: Request) -> Response:
    """The tab's first address: bookmarks of it land on the members."""
    return RedirectResponse(_members_path(request.path_params["repo"]), status_code=308)


@action
async def set_member(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["repo"]
    try:
        await api_for(request, user).change(
            "PUT", api_path("repositories", name, "members", form.text("account").strip()),
            {"level": form.text("level")}, key=form.optional("key"),
        )
    except (Refused, InvalidInput) as refusal:
        return await _members(request, user, error=refusal, form=form)
    return see_other(_members_path(name), "member-set")


@action
@asks_first(confirm.remove_member)
async def remove_member(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["repo"]
    try:
        await api_for(request, user).change(
            "DELETE", api_path("repositories", name, "members", form.text("account")), key=form.optional("key")
        )
    except (Refused, InvalidInput) as refusal:
        return await _members(request, user, error=refusal)
    return see_other(_members_path(name), "member-removed")
