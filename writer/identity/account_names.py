"""Account names (SPEC §5): their shape, and the one folded form in which `bob` and `BOB` are one
name, used alike for uniqueness, sign-in, the login limits and the device cookies.

The fold lowers the ASCII letters A-Z and nothing else, in Python (`fold`) and in PostgreSQL
(`FOLDED_NAME`, the expression migration 0012 indexes uniquely). Why not more: a name is ASCII
(`ACCOUNT_NAME`), so A-Z is all of case there, and the richer folds disagree with each other.
Python's `casefold()` maps 'ſ' to 's', the Kelvin sign to 'k' and 'İ' to 'i' plus a combining dot;
PostgreSQL's `lower()` follows the database's locale ('I' becomes 'ı' under tr_TR, 'İ' becomes 'i'
under most others). With two folds, a login name could reach an account through the database's
while the limits counted it under another key of Python's: one more lockout window per spelling.
With `COLLATE "C"`, PostgreSQL's `lower()` changes exactly A-Z whatever the database's locale, as
`fold` does, so both sides agree on every string. A login name that is not ASCII folds to itself
on both sides: it matches no account, and is limited under a key of its own.
"""

from __future__ import annotations

import re
import string

from arkvory.shared.errors import InvalidInput

ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MAX_ACCOUNT_NAME = 64
# The folded name of arkvory_accounts, as SQL; its unique index (migration 0012) is on exactly this.
FOLDED_NAME = 'lower(name COLLATE "C")'
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def fold(name: str) -> str:
    """The form in which two account names are the same name (module docstring)."""
    return name.translate(_ASCII_LOWER)


def check_account_name(name: object) -> str:
    """A name a new account may take (as typed: the account keeps its spelling); else 400."""
    if not isinstance(name, str) or not ACCOUNT_NAME.fullmatch(name):
        raise InvalidInput(
            "'name' must be 1-64 characters of letters, digits, '.', '_', '@' and '-', "
            "starting with a letter or digit"
        )
    return name
