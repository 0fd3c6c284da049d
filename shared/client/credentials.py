"""An account's credentials through the writer's API (SPEC §5): a login session from a password,
a password change, personal tokens made, listed and revoked, and (administrators) managed keys
listed, adopted and revoked, and accounts listed, shown, reset and deleted.

Every route here is the writer's: on a read gateway the transport moves on to the next URL.
Answers holding a secret are read here and handed back, never logged; `Session` keeps its token
out of its `repr`.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
import uuid
from typing import Any

from .errors import ClientError, UsageError
from .transport import Transport

# What `access` may be called: the API's two levels, and "write" for the second, as users say it.
ACCESS_LEVELS = {"read": "read", "write": "read-write", "read-write": "read-write"}
MAX_EXPIRY_S = 366 * 86400  # the writer's bound (writer/identity/tokens.py)
# A server that never ends a list does not keep the client looping: the writer's largest
# ARKVORY_MAX_TOKENS_PER_ACCOUNT (10000) fits in 10 pages of 1000, expired tokens included twice over,
# and 100,000 managed keys is far past what an installation makes.
MAX_PAGES = 100
# The writer's device cookie (its writer/identity/device_cookies.py): sent back at the next login as the
# same account, it keeps this client signing in while others' wrong guesses lock the account.
DEVICE_COOKIE = "arkvory_device"
_DEVICE_COOKIE_VALUE = re.compile(r"[A-Za-z0-9._-]{1,127}")  # what the writer issues, and no more


@dataclasses.dataclass(frozen=True)
class Session:
    """A login session: its bearer token (never shown), id, expiry and the account's JSON, and
    the device cookie the writer set with it (None if it set none), for the next login."""

    token: str = dataclasses.field(repr=False)
    id: str
    expires_at: str
    account: dict[str, Any]
    device_cookie: str | None = dataclasses.field(default=None, repr=False)

    @property
    def must_change_password(self) -> bool:
        """An administrator reset the password: this session may only change it or log out."""
        return self.account.get("mustChangePassword") is True


def login(transport: Transport, name: str, password: str, device_cookie: str | None = None) -> Session:
    """Sign in with the account's password, sending `device_cookie` (a `Session.device_cookie`
    of an earlier login as this account) when given. A retried login makes a second session (the
    server never records a login's answer): the spare one expires with ARKVORY_SESSION_LIFETIME."""
    headers = None
    if device_cookie is not None and _DEVICE_COOKIE_VALUE.fullmatch(device_cookie):
        headers = {"Cookie": f"{DEVICE_COOKIE}={device_cookie}"}
    what = f"login as {name}"
    response = transport.request("POST", "/api/v1/login", what, json={"name": name, "password": password},
                                 headers=headers)
    try:
        body = response.json()
        return Session(
            token=body["token"], id=body["sessionId"], expires_at=body["expiresAt"], account=body["account"],
            device_cookie=_set_device_cookie(response.headers.get_list("set-cookie")),
        )
    except (ValueError, KeyError, TypeError):
        raise ClientError(f"{what}: unexpected answer") from None


def _set_device_cookie(set_cookies: list[str]) -> str | None:
    """The device cookie's value among a login answer's Set-Cookie headers."""
    for header in set_cookies:
        name, _, value = header.split(";", 1)[0].partition("=")
        if name.strip() == DEVICE_COOKIE and _DEVICE_COOKIE_VALUE.fullmatch(value.strip()):
            return value.strip()
    return None


def logout(transport: Transport, session: Session) -> None:
    transport.request("POST", "/api/v1/logout", "logout", headers=_bearer(session))


def create_token(
    transport: Transport,
    *,
    access: str,
    label: str = "",
    expires_in_seconds: int | None = None,
    password: str | None = None,
    session: Session | None = None,
) -> dict[str, Any]:
    """A new personal token: the answer's JSON, with the secret in `token` (shown only here).

    Made with the client's own token, or `session`; it expires at the latest with the
    credential that makes it (`expiresAt` says what was granted) unless `password`, the
    account's own, is sent with it."""
    if access not in ACCESS_LEVELS:
        raise UsageError(f"access: expected read or write, got {access!r}")
    if expires_in_seconds is not None and not 1 <= expires_in_seconds <= MAX_EXPIRY_S:
        raise UsageError(f"expires: expected 1 second to 366 days, got {expires_in_seconds} s")
    body: dict[str, Any] = {"access": ACCESS_LEVELS[access], "label": label}
    if expires_in_seconds is not None:
        body["expiresInSeconds"] = expires_in_seconds
    if password is not None:
        body["password"] = password
    created = transport.json("POST", "/api/v1/tokens", "create a token", json=body, headers=_bearer(session))
    if not isinstance(created, dict) or not isinstance(created.get("token"), str):
        raise ClientError("create a token: unexpected answer")
    return created


def list_tokens(transport: Transport, page_size: int = 1000) -> list[dict[str, Any]]:
    """The account's personal tokens (id, label, access, createdAt, expiresAt, lastUsedAt, and
    who made them), oldest first, every page followed: never a secret. (An account holds at most
    the writer's ARKVORY_MAX_TOKENS_PER_ACCOUNT live ones, so the list is short.)"""
    return _every_page(transport, "/api/v1/tokens", "list tokens", page_size)


def list_keys(transport: Transport, page_size: int = 1000) -> list[dict[str, Any]]:
    """Every managed service key (an administrator's call), oldest first, every page followed:
    never a secret; `suspendedAt` is set on a key whose maker account was disabled."""
    return _every_page(transport, "/api/v1/keys", "list keys", page_size)


def _every_page(transport: Transport, path: str, what: str, page_size: int) -> list[dict[str, Any]]:
    items_seen: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        params = {"limit": str(page_size)}
        if cursor:
            params["cursor"] = cursor
        page = transport.json("GET", path, what, params=params)
        items = page.get("items") if isinstance(page, dict) else None
        cursor = page.get("nextCursor") if isinstance(page, dict) else None
        if not isinstance(items, list) or not (cursor is None or isinstance(cursor, str)):
            raise ClientError(f"{what}: unexpected answer")
        items_seen.extend(items)
        if not cursor:
            return items_seen
    raise ClientError(f"{what}: more than {MAX_PAGES} pages")


def adopt_key(transport: Transport, key_id: str, password: str | None = None) -> dict[str, Any]:
    """Make a suspended managed key (its maker account was disabled) the caller's, an
    administrator's: it works again, and ends with the caller's credential unless `password`,
    the caller's account's own, is sent. The key's JSON (never its secret)."""
    body: dict[str, Any] = {} if password is None else {"password": password}
    # Without a password the writer records the key: a retry after a lost answer replays it.
    headers = None if password is not None else {"Idempotency-Key": uuid.uuid4().hex}
    adopted = transport.json(
        "POST", f"/api/v1/keys/{urllib.parse.quote(key_id, safe='')}/adopt", f"adopt key {key_id}",
        json=body, headers=headers,
    )
    if not isinstance(adopted, dict) or "id" not in adopted:
        raise ClientError(f"adopt key {key_id}: unexpected answer")
    return adopted


def revoke_key(transport: Transport, key_id: str) -> None:
    """Revoke a managed service key (an administrator's call), with one Idempotency-Key for every
    attempt."""
    transport.request(
        "DELETE", f"/api/v1/keys/{urllib.parse.quote(key_id, safe='')}", f"revoke key {key_id}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def revoke_token(transport: Transport, token_id: str) -> None:
    """Revoke a personal token (yours; an administrator's: anyone's). One Idempotency-Key for
    every attempt, so a retry after a lost answer is not a 404."""
    transport.request(
        "DELETE", f"/api/v1/tokens/{urllib.parse.quote(token_id, safe='')}", f"revoke token {token_id}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def change_password(transport: Transport, old: str, new: str, session: Session | None = None) -> None:
    """Change the account's own password (with `session`, or the client's token). It ends the
    account's other sessions; its personal tokens stay. Never retried with a recorded key: the
    server does not record a request that holds a password (a lost answer: try the new one)."""
    transport.request(
        "POST", "/api/v1/account/password", "change the password",
        json={"oldPassword": old, "newPassword": new}, headers=_bearer(session),
    )


def list_accounts(transport: Transport, page_size: int = 1000) -> list[dict[str, Any]]:
    """Every account, by name (an administrator's call), every page followed."""
    return _every_page(transport, "/api/v1/accounts", "list accounts", page_size)


def show_account(transport: Transport, name: str) -> dict[str, Any]:
    """One account (an administrator's call), with `holds`: what deleting it would end."""
    return transport.json("GET", f"/api/v1/accounts/{urllib.parse.quote(name, safe='')}", f"account {name}")


def reset_password(transport: Transport, name: str, password: str) -> dict[str, Any]:
    """Set another account's password (an administrator's call): its sessions end, and it must
    set its own at its next sign-in. The account's JSON, with `sessionsEnded`."""
    return transport.json(
        "POST", f"/api/v1/accounts/{urllib.parse.quote(name, safe='')}/password", f"reset the password of {name}",
        json={"password": password},
    )


def delete_account(transport: Transport, name: str) -> dict[str, Any]:
    """Delete an account (an administrator's call), with one Idempotency-Key for every attempt:
    a retry after a lost answer replays it instead of answering 404."""
    return transport.json(
        "DELETE", f"/api/v1/accounts/{urllib.parse.quote(name, safe='')}", f"delete account {name}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def _bearer(session: Session | None) -> dict[str, str] | None:
    return None if session is None else {"Authorization": f"Bearer {session.token}"}
