"""The token an `Authorization` header carries: `Bearer <token>`, or HTTP Basic with the token
as the password and any user name (issue 25 §9, which overrides SPEC §5's "only Bearer"), for
the tools that speak only Basic: `curl -u`, wget, aria2, git's credential helpers, package
managers. GitLab, GitHub and Artifactory take tokens the same way.

Tokens only, never an account's password: the Basic password goes exactly where a bearer token
goes (the key ring's digest, the database token's shape, then its digest) and is refused with the
same words when it is none. No password is checked, so no login limit applies, and the user name
is never read: it names no account, so neither the answer nor its time says anything about
accounts. One token sent either way is one string, hence one credential-cache entry (its
`memo_key`) and one principal with one budget.

Hostile values stay bounded and decode one way only: at most MAX_BASIC_CHARS of base64 in the
standard alphabet with its padding (no whitespace or stray characters skipped), split at the
first colon (RFC 7617: a user name has none, a password may), the password then read as UTF-8
(or Latin-1, as older clients send) and without control characters. A refusal never repeats
what was sent.
"""

from __future__ import annotations

import base64
import binascii
import re

from arkvory.shared.errors import Unauthorized

# base64 of 768 bytes: a long user name and any token this server makes (at most 109 characters)
# or a keys file holds, with room to spare; the whole head is bounded too (http/refusals.py).
MAX_BASIC_CHARS = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

EXPECTED = "expected 'Authorization: Bearer <token>', or Basic with a token as the password"
MALFORMED_BASIC = (
    "expected 'Authorization: Basic <base64 of user:token>' (a token as the password, any user name; "
    "an account's password is never accepted here)"
)


def presented_token(authorization: str | None) -> str | None:
    """The token of an `Authorization` header (Bearer, or Basic's password); None without one.
    Any other scheme, or a malformed Basic value, is 401."""
    if authorization is None:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    scheme = scheme.lower()
    if scheme == "bearer" and credentials:
        return credentials
    if scheme == "basic" and credentials:
        return _basic_password(credentials)
    raise Unauthorized(EXPECTED)


def _basic_password(credentials: str) -> str:
    if len(credentials) > MAX_BASIC_CHARS:
        raise Unauthorized(MALFORMED_BASIC)
    try:
        # validate=True: only the standard alphabet and correct padding, nothing skipped.
        pair = base64.b64decode(credentials, validate=True)
    except (binascii.Error, ValueError):  # ValueError: a str that is not ASCII
        raise Unauthorized(MALFORMED_BASIC) from None
    _user, colon, password = pair.partition(b":")  # the user name is never read
    if not colon or not password:
        raise Unauthorized(MALFORMED_BASIC)
    try:
        token = password.decode("utf-8")
    except UnicodeDecodeError:
        token = password.decode("latin-1")
    if _CONTROL.search(token):
        raise Unauthorized(MALFORMED_BASIC)
    return token
