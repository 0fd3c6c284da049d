"""The OpenAPI fragment of the account routes (writer/identity/accounts.py): login, logout, sign-up,
password change and the administrators' account management."""

from __future__ import annotations

from typing import Any

from . import device_cookies
from .account_names import MAX_ACCOUNT_NAME
from .. import openapi
from .passwords import MAX_PASSWORD


ACCOUNT_SCHEMA = {
    "type": "object",
    "required": ["id", "name", "admin", "disabled", "createdAt", "mustChangePassword"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string"},
        "admin": {"type": "boolean"},
        "disabled": {"type": "boolean"},
        "createdAt": {"type": "string", "format": "date-time"},
        "mustChangePassword": {"type": "boolean", "description": "an administrator reset the password: the"
                               " account's sessions may only change it (or log out) until it does"},
    },
}
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$",
         "description": "Unique without regard to case: `bob` and `BOB` are one name."}
# Login and sign-up (writer/identity/sign_in_guard.py): no other site's page may sign a browser in.
_SIGN_IN_GUARD = (
    " Only `Content-Type: application/json` (else 415); a request from another site's page (an `Origin`"
    " that is not this server, `Sec-Fetch-Site: cross-site` or `same-site`) is 403."
)
NEW_PASSWORD_SCHEMA = {"type": "string", "minLength": 8, "maxLength": MAX_PASSWORD}
NAME_PARAM = {
    "name": "name", "in": "path", "required": True, "description": "Account name, in any case.", "schema": _NAME,
}


def _ok(description: str, schema: dict | None = None, **extra: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, **extra}
    if schema is not None:
        answer["content"] = openapi.json_content(schema)
    return answer


def _credentials_object(*names: str, **schemas: dict) -> dict[str, Any]:
    return openapi.json_body({"type": "object", "required": list(names), "properties": schemas})


_SET_COOKIE = {"Set-Cookie": {"schema": {"type": "string"}, "description": "arkvory_session (HttpOnly, SameSite=Strict)"}}
_LOGIN_COOKIES = {"Set-Cookie": {"schema": {"type": "string"}, "description": (
    "arkvory_session (HttpOnly, SameSite=Strict), and a fresh arkvory_device cookie (Path=/api/v1/login,"
    " one year): sent back, it keeps this client signing in while guessers lock the account out")}}
_DEVICE_COOKIE = {
    "name": device_cookies.COOKIE, "in": "cookie", "required": False,
    "description": "From an earlier successful login as this account: limits this client on its own"
    " (5 failures a minute) instead of with every client without it.",
    "schema": {"type": "string", "maxLength": 127},
}

OPENAPI_PATHS: dict[str, Any] = {
    "/api/v1/login": {"post": {
        "summary": "Log in: a session token, also set as the arkvory_session cookie (never recorded by Idempotency-Key)",
        "description": "The name in any case (`BOB` signs in to `bob`). Limited per client address (20 a minute,"
        " through ARKVORY_TRUSTED_PROXIES) and per account name in any case (5 failures a minute), or per device"
        " for a client that sends its arkvory_device cookie: 429 with Retry-After." + _SIGN_IN_GUARD,
        "security": [{}],
        "parameters": [openapi.IDEMPOTENCY_KEY, _DEVICE_COOKIE],
        "requestBody": _credentials_object(
            "name", "password", name={"type": "string", "minLength": 1, "maxLength": 64},
            password={"type": "string", "minLength": 1, "maxLength": MAX_PASSWORD}),
        "responses": {
            "200": _ok("Logged in", {"type": "object", "required": ["token", "sessionId", "expiresAt", "account",
                                                                 "mustChangePassword"],
                                     "properties": {"token": {"type": "string", "pattern": "^dps_"},
                                                    "sessionId": {"type": "string", "format": "uuid"},
                                                    "expiresAt": {"type": "string", "format": "date-time"},
                                                    "account": ACCOUNT_SCHEMA,
                                                    "mustChangePassword": {"type": "boolean", "description": (
                                                        "an administrator reset the password: this session may"
                                                        " only change it (POST /api/v1/account/password) or log"
                                                        " out; elsewhere 403 password_change_required")}}},
                     headers=_LOGIN_COOKIES),
            **openapi.errors(400, 401, 403, 413, 415, 429),
        },
    }},
    "/api/v1/logout": {"post": {
        "summary": "End this session, and what it made without the password given again, and clear its cookie",
        "parameters": [openapi.IDEMPOTENCY_KEY],
        "responses": {"204": _ok("Logged out", headers=_SET_COOKIE), **openapi.errors(400, 401)},
    }},
    "/api/v1/register": {"post": {
        "summary": "Self-registration (404 unless ARKVORY_ALLOW_SIGNUP)",
        "description": "A name taken in any case is 409." + _SIGN_IN_GUARD,
        "security": [{}],
        "parameters": [openapi.IDEMPOTENCY_KEY],
        "requestBody": _credentials_object("name", "password", name=_NAME, password=NEW_PASSWORD_SCHEMA),
        "responses": {"201": _ok("Account created", ACCOUNT_SCHEMA), **openapi.errors(400, 403, 404, 409, 413, 415, 429)},
    }},
    "/api/v1/account/password": {"post": {
        "summary": "Change your password (needs the old one); ends your other sessions, and what they made without"
        " the password given again",
        "description": "Wrong old passwords are limited per account (5 a minute) for its signed-in credentials"
        " only: a lockout by guessers at the login does not stop it. The new password must differ from the old"
        " one (400). After an administrator's reset, the old password is the one they set, and the change"
        " clears `mustChangePassword`.",
        "parameters": [openapi.IDEMPOTENCY_KEY],
        "requestBody": _credentials_object(
            "oldPassword", "newPassword", oldPassword={"type": "string", "minLength": 1, "maxLength": MAX_PASSWORD},
            newPassword=NEW_PASSWORD_SCHEMA),
        "responses": {"204": _ok("Changed"), **openapi.errors(400, 401, 403, 413, 429)},
    }},
    "/api/v1/accounts": {
        "post": {
            "summary": "Create an account (admin)",
            "parameters": [openapi.IDEMPOTENCY_KEY],
            "requestBody": _credentials_object(
                "name", "password", name=_NAME, password=NEW_PASSWORD_SCHEMA, admin={"type": "boolean", "default": False}),
            "responses": {"201": _ok("Created", ACCOUNT_SCHEMA), **openapi.errors(400, 401, 403, 409, 413)},
        },
        "get": {
            "summary": "List accounts (admin), by name (without regard to case) or newest or oldest first, one page at a time",
            "parameters": [
                openapi.query_param("prefix", "Only accounts whose name starts with this, without regard to case.",
                                    schema={"type": "string", "minLength": 1, "maxLength": MAX_ACCOUNT_NAME}),
                openapi.order_param("name", ("name", "newest", "oldest"), sorted_by="creation; `name`: by name "
                                    "without regard to case"),
                *openapi.page_params(),
            ],
            "responses": {"200": _ok("One page", openapi.page_of(ACCOUNT_SCHEMA)), **openapi.errors(400, 401, 403)},
        },
    },
    "/api/v1/accounts/{name}/disable": {"post": {
        "summary": "Disable an account (admin): its sessions and tokens end at once, the managed keys it made are"
        " suspended until an admin adopts them",
        "description": "An account cannot disable itself (403); the last enabled administrator account is disabled"
        " only with a keys-file admin key (409 otherwise).",
        "parameters": [NAME_PARAM, openapi.IDEMPOTENCY_KEY],
        "responses": {"200": _ok("Disabled", ACCOUNT_SCHEMA), **openapi.errors(400, 401, 403, 404, 409, 422)},
    }},
    "/api/v1/accounts/{name}/enable": {"post": {
        "summary": "Enable a disabled account (admin); what the disable ended or suspended stays so",
        "parameters": [NAME_PARAM, openapi.IDEMPOTENCY_KEY],
        "responses": {"200": _ok("Enabled", ACCOUNT_SCHEMA), **openapi.errors(400, 401, 403, 404, 409, 422)},
    }},
}
