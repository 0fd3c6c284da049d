"""Device cookies for login limits (OWASP, "Slow Down Online Guessing Attacks with Device
Cookies"): a client that signed in to an account carries proof of it, and is then limited on its
own instead of waiting for the account's lockout (writer/identity/login_limits.py).

A cookie is `v1.<issued>.<nonce>.<mac>`: the nonce names the device (its own limit), the
issue time (Unix seconds) bounds its life to `LIFETIME_S` whatever the browser keeps, and the
MAC is HMAC-SHA256 over the folded account name (account_names.py), the issue time and the
nonce with the writer's `login_device` secret (migration 0008). It holds nothing secret and
grants nothing but a limit of its own: the password is still checked. Each successful login
issues a fresh one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time

import asyncpg

from arkvory.shared.db import POOLED_QUERY_TIMEOUT_S, pooled

from .account_names import fold

COOKIE = "arkvory_device"
LIFETIME_S = 365 * 86400
PATH = "/api/v1/login"  # sent only where it matters, never with downloads
_SHAPE = re.compile(r"v1\.([0-9]{1,12})\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})")


class DeviceCookies:
    """Signs and checks device cookies; the secret is read from the database once."""

    def __init__(self, clock=time.time) -> None:
        self._secret: bytes | None = None
        self._clock = clock

    async def load_secret(self, pool: asyncpg.Pool) -> None:
        if self._secret is None:
            async with pooled(pool) as conn:
                self._secret = await conn.fetchval(
                    "SELECT secret FROM arkvory_server_secrets WHERE name = 'login_device'", timeout=POOLED_QUERY_TIMEOUT_S
                )
            assert self._secret is not None, "migration 0008 makes the login_device secret"

    def issue(self, account_name: str) -> str:
        issued = str(int(self._clock()))
        nonce = secrets.token_urlsafe(16)
        return f"v1.{issued}.{nonce}.{self._mac(account_name, issued, nonce)}"

    def device_of(self, cookie: str | None, account_name: str) -> str | None:
        """The device's nonce when `cookie` is one this writer issued for `account_name` and
        still within its lifetime; None for anything else (absent, forged, expired, another
        account's)."""
        match = _SHAPE.fullmatch(cookie) if cookie and len(cookie) < 128 else None
        if match is None:
            return None
        issued, nonce, mac = match.groups()
        if not 0 <= self._clock() - int(issued) < LIFETIME_S:
            return None
        if not hmac.compare_digest(mac, self._mac(account_name, issued, nonce)):
            return None
        return nonce

    def _mac(self, account_name: str, issued: str, nonce: str) -> str:
        assert self._secret is not None, "load_secret first"
        # The name in the one form that names an account (and keys its limit): a cookie earned as
        # `BOB` is `bob`'s, as `BOB` signs in to `bob`. NUL cannot occur in a name.
        message = "\0".join(("arkvory-device-v1", fold(account_name), issued, nonce)).encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
