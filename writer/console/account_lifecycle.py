"""An administrator's password reset and account deletion in the console (issue 25 §1), each on a
page of its own reached from the accounts page: the page says what will happen before the
button does it, and the deletion page counts what the account holds (the API's `holds`), so a
click on the wrong row never deletes anyone. The deletion page is its confirmation: only its own
form (`confirm=yes`) deletes, as on confirm.py's pages.

The reset's password is typed twice and never sent back; the API ends the account's sessions
and makes it choose its own at its next sign-in (writer/identity/account_lifecycle.py). The API
refuses the caller's own account and the last administrator account; the page says why.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.errors import ApiError, InvalidInput

from .confirm import CONFIRM_FIELD, CONFIRMED
from .forms import Form
from .internal import Refused, api_path
from .session import ConsoleUser, action, api_for, page, refusal_status, render, see_other


async def _account_page(request: Request, user: ConsoleUser, template: str, *,
                        error: Refused | ApiError | None = None) -> Response:
    name = request.path_params["name"]
    try:
        account = await api_for(request, user).fetch(api_path("accounts", name))
    except Refused as refusal:
        if error is not None:
            raise
        return render(request, user, "error.html", {"title": "Accounts"}, status=refusal_status(refusal),
                      error=refusal.message)
    return render(request, user, template, {"account": account},
                  status=refusal_status(error) if error else 200, error=error.message if error else None)


@page
async def reset_page(request: Request, user: ConsoleUser) -> Response:
    return await _account_page(request, user, "account_reset.html")


@action
async def reset_password(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["name"]
    try:
        if form.text("password") != form.text("password_again"):
            raise InvalidInput("the two passwords differ: nothing was changed")
        await api_for(request, user).change(
            "POST", api_path("accounts", name, "password"), {"password": form.text("password")}, key=form.optional("key"),
        )
    except (Refused, InvalidInput) as refusal:
        return await _account_page(request, user, "account_reset.html", error=refusal)
    return see_other("/console/accounts", "account-password-reset")


@page
async def delete_page(request: Request, user: ConsoleUser) -> Response:
    return await _account_page(request, user, "account_delete.html")


@action
async def delete_account(request: Request, user: ConsoleUser, form: Form) -> Response:
    name = request.path_params["name"]
    if form.text(CONFIRM_FIELD) != CONFIRMED:
        # The page is this deletion's confirmation (confirm.py's rule): a form sent without
        # its `confirm` (an old page, a script) gets the page, and nobody is deleted.
        return await _account_page(request, user, "account_delete.html")
    try:
        await api_for(request, user).change("DELETE", api_path("accounts", name), key=form.optional("key"))
    except Refused as refusal:
        return await _account_page(request, user, "account_delete.html", error=refusal)
    return see_other("/console/accounts", "account-deleted")
