"""Your own password (issue 25 §1): the page every account reaches from its name at the top of
the console, and the only page of a session whose password an administrator reset
(session.PASSWORD_PATH).

The change is the API's (`POST /api/v1/account/password`, with the current password): it ends
the account's other sessions, keeps its personal tokens, and after a reset gives this session
the account's permissions back. The new password is typed twice, so that a typo does not lock
its owner out; neither is ever sent back to the browser.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.errors import ApiError, InvalidInput

from .forms import Form
from .internal import Refused
from .session import ConsoleUser, action, api_for, page, refusal_status, render, see_other


def _page(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None) -> Response:
    return render(request, user, "password.html", {},
                  status=refusal_status(error) if error else 200, error=error.message if error else None)


@page
async def password_page(request: Request, user: ConsoleUser) -> Response:
    return _page(request, user)


@action
async def change_password(request: Request, user: ConsoleUser, form: Form) -> Response:
    try:
        if form.text("new_password") != form.text("new_password_again"):
            raise InvalidInput("the two new passwords differ: nothing was changed")
        await api_for(request, user).change(
            "POST", "/api/v1/account/password",
            {"oldPassword": form.text("current_password"), "newPassword": form.text("new_password")},
            key=form.optional("key"),
        )
    except (Refused, InvalidInput) as refusal:
        return _page(request, user, error=refusal)
    return see_other("/console/", "password-changed")
