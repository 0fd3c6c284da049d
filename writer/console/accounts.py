"""Accounts (administrators), personal tokens (every account, its own) and managed service keys
(administrators): list, create, disable and enable, revoke, and adopt a suspended key.

A new token or key is shown once, in the answer to the form that made it (never in a URL, never
again; the page is not stored: `Cache-Control: no-store`). Its form says how long each kind lives
(SPEC §5, issue 25 §8): one that ends with this session (when it signs out, or at the latest at
the session's expiry, shown with how far off that is), or one that lives for a number of days,
which needs the password given again; the answer says which the new one is. An administrator may
revoke any account's personal token, as the API allows: the accounts page lists them all (the
API lists only the caller's own), and the tokens page takes any token's id.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled
from arkvory.shared.errors import ApiError, InvalidInput

from . import confirm
from .confirm import asks_first
from .forms import Form
from .internal import Refused, api_path
from .list_filters import fetch_listing, filters_of
from .session import ConsoleUser, action, api_for, page, refusal_status, render, runtime_of, see_other

DAY_S = 86400
TOKENS_SHOWN = 1000


def _error(error: Refused | ApiError | None) -> dict[str, Any]:
    return {"status": refusal_status(error) if error else 200, "error": error.message if error else None}


# -- accounts ------------------------------------------------------------------------------------


async def _accounts(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                    form: Form | None = None) -> Response:
    filters = filters_of(request, "accounts", "/console/accounts", "Find accounts")
    try:
        listing, refused = await fetch_listing(api_for(request, user), "/api/v1/accounts", request, filters)
    except Refused as refusal:
        if error is not None:
            raise
        return render(request, user, "error.html", {"title": "Accounts"}, **_error(refusal))
    error = error or refused
    fields = dict(form.fields) if form else {}
    fields.pop("password", None)  # never sent back to the browser
    tokens = await _tokens_of(request, [account["name"] for account in listing["items"]])
    return render(
        request, user, "accounts.html",
        {"listing": listing, "accounts": listing["items"], "tokens": tokens[:TOKENS_SHOWN],
         "tokens_cut": len(tokens) > TOKENS_SHOWN, "tokens_shown": TOKENS_SHOWN, "form": fields, "list_filters": filters},
        **_error(error),
    )


async def _tokens_of(request: Request, names: list[str]) -> list[dict[str, Any]]:
    """The personal tokens of the accounts on this page, for an administrator (whom the API just
    let list the accounts, and lets revoke any token): the API lists only the caller's own.
    Up to TOKENS_SHOWN + 1 rows: the extra one says the table is cut."""
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        rows = await conn.fetch(
            "SELECT c.id, a.name AS account, c.label, c.access, c.created_at, c.expires_at, c.last_used_at"
            " FROM arkvory_credentials c JOIN arkvory_accounts a ON a.id = c.account_id"
            " WHERE c.kind = 'pat' AND a.name = ANY($1::text[]) ORDER BY a.name, c.created_at, c.id LIMIT $2",
            names, TOKENS_SHOWN + 1, timeout=POOLED_QUERY_TIMEOUT_S,
        )
    return [dict(row) for row in rows]


@page
async def accounts_page(request: Request, user: ConsoleUser) -> Response:
    return await _accounts(request, user)


@action
async def create_account(request: Request, user: ConsoleUser, form: Form) -> Response:
    body = {"name": form.text("name"), "password": form.text("password"), "admin": form.checked("admin")}
    try:
        await api_for(request, user).change("POST", "/api/v1/accounts", body, key=form.optional("key"))
    except Refused as refusal:
        return await _accounts(request, user, error=refusal, form=form)
    return see_other("/console/accounts", "account-created")


async def _set_disabled(request: Request, user: ConsoleUser, form: Form, verb: str) -> Response:
    name = request.path_params["name"]
    try:
        await api_for(request, user).change("POST", api_path("accounts", name, verb), key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        return await _accounts(request, user, error=refusal)
    return see_other("/console/accounts", f"account-{verb}d")


@action
@asks_first(confirm.disable_account)
async def disable_account(request: Request, user: ConsoleUser, form: Form) -> Response:
    return await _set_disabled(request, user, form, "disable")


@action
async def enable_account(request: Request, user: ConsoleUser, form: Form) -> Response:
    return await _set_disabled(request, user, form, "enable")


# -- personal tokens -----------------------------------------------------------------------------


LIFETIMES = ("session", "days")


def _expiry(form: Form, body: dict[str, Any]) -> None:
    """The lifetime the form chose: `session` (it ends with this session: no password is sent,
    and the API caps its expiry at the session's), or `days` (it outlives the session, so the
    password is needed). A form without the choice sends what it holds."""
    lifetime = form.optional("lifetime")
    if lifetime is not None and lifetime not in LIFETIMES:
        raise InvalidInput("'lifetime' must be 'session' or 'days'")
    if form.optional("label") is not None:
        body["label"] = form.text("label")
    if lifetime == "session":
        return
    days = form.whole_number("expires_days", "expiry (days)")
    if days is not None:
        body["expiresInSeconds"] = days * DAY_S
    if form.optional("password") is not None:
        body["password"] = form.text("password")
    elif lifetime == "days":
        raise InvalidInput("a token or key that outlives this session needs your password: give it, or choose"
                           " one that ends with this session")


async def _session_ends(request: Request, user: ConsoleUser) -> dict[str, Any]:
    """This console session's id and expiry: what a token or key made without the password ends with."""
    pool = runtime_of(request).pool
    assert pool is not None
    async with pooled(pool) as conn:
        ends = await conn.fetchval("SELECT expires_at FROM arkvory_credentials WHERE id = $1",
                                   user.principal.credential_id, timeout=POOLED_QUERY_TIMEOUT_S)
    return {"session_id": str(user.principal.credential_id), "session_ends": ends}


async def _tokens(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                  created: dict[str, Any] | None = None, status: int | None = None) -> Response:
    filters = filters_of(request, "tokens", "/console/tokens", "Find your tokens")
    listing, refused = await fetch_listing(api_for(request, user), "/api/v1/tokens", request, filters)
    shown = _error(error or refused)
    if status is not None:
        shown["status"] = status
    return render(request, user, "tokens.html", {"listing": listing, "tokens": listing["items"], "created": created,
                                                 "list_filters": filters, **await _session_ends(request, user)}, **shown)


@page
async def tokens_page(request: Request, user: ConsoleUser) -> Response:
    return await _tokens(request, user)


@action
async def create_token(request: Request, user: ConsoleUser, form: Form) -> Response:
    try:
        body: dict[str, Any] = {"access": form.text("access", "read")}
        _expiry(form, body)
        answer = await api_for(request, user).change("POST", "/api/v1/tokens", body, key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        return await _tokens(request, user, error=refusal)
    # Shown once, in this answer (no redirect: the secret must not outlive this page).
    return await _tokens(request, user, created=answer.json(), status=201)


@action
@asks_first(confirm.revoke_token)
async def revoke_token(request: Request, user: ConsoleUser, form: Form) -> Response:
    token_id = request.path_params.get("token_id") or form.text("id").strip()
    try:
        await api_for(request, user).change("DELETE", api_path("tokens", token_id), key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        if form.text("back") == "accounts":
            return await _accounts(request, user, error=refusal)
        return await _tokens(request, user, error=refusal)
    return see_other("/console/accounts" if form.text("back") == "accounts" else "/console/tokens", "token-revoked")


# -- managed service keys ---------------------------------------------------------------------


async def _keys(request: Request, user: ConsoleUser, *, error: Refused | ApiError | None = None,
                created: dict[str, Any] | None = None, status: int | None = None) -> Response:
    filters = filters_of(request, "keys", "/console/keys", "Find service keys")
    try:
        listing, refused = await fetch_listing(api_for(request, user), "/api/v1/keys", request, filters)
    except Refused as refusal:
        if error is not None:
            raise
        return render(request, user, "error.html", {"title": "Service keys"}, **_error(refusal))
    shown = _error(error or refused)
    if status is not None:
        shown["status"] = status
    return render(request, user, "keys.html", {"listing": listing, "keys": listing["items"], "created": created,
                                               "list_filters": filters, **await _session_ends(request, user)}, **shown)


@page
async def keys_page(request: Request, user: ConsoleUser) -> Response:
    return await _keys(request, user)


@action
async def create_key(request: Request, user: ConsoleUser, form: Form) -> Response:
    try:
        body: dict[str, Any] = {"scopes": form.text("scopes").split()}
        _expiry(form, body)
        answer = await api_for(request, user).change("POST", "/api/v1/keys", body, key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        return await _keys(request, user, error=refusal)
    return await _keys(request, user, created=answer.json(), status=201)


@action
async def adopt_key(request: Request, user: ConsoleUser, form: Form) -> Response:
    """A suspended key (its maker account was disabled) becomes this administrator's; without
    their password it ends with this console session, as a key made here would."""
    key_id = request.path_params["key_id"]
    body: dict[str, Any] = {}
    if form.optional("password") is not None:
        body["password"] = form.text("password")
    try:
        await api_for(request, user).change("POST", api_path("keys", key_id, "adopt"), body, key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        return await _keys(request, user, error=refusal)
    return see_other("/console/keys", "key-adopted")


@action
@asks_first(confirm.revoke_key)
async def revoke_key(request: Request, user: ConsoleUser, form: Form) -> Response:
    key_id = request.path_params["key_id"]
    try:
        await api_for(request, user).change("DELETE", api_path("keys", key_id), key=form.optional("key"))
    except (Refused, ApiError) as refusal:
        return await _keys(request, user, error=refusal)
    return see_other("/console/keys", "key-revoked")
