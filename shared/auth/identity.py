"""Who is asking (SPEC §5): principals from tokens, and what they may do.

The same code runs on every process, so a gateway checks permissions exactly as the writer.
Only digests of tokens are kept and compared (SHA-256 as the keys file and the database store
them, BLAKE2b for what a process remembers: `memo_key`); a token is never logged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
import tomllib
import uuid
from collections.abc import Iterable

from arkvory.shared.errors import Unauthorized

from .authorization import presented_token

_SCOPE = re.compile(r"^(admin|(read|write):(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,99}))$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_scope(value: str) -> bool:
    """A scope as the keys file and managed service keys accept it."""
    return bool(_SCOPE.match(value))


class KeysFileError(Exception):
    """ARKVORY_KEYS_FILE cannot be used; the message names the problem."""


@dataclasses.dataclass(frozen=True)
class Principal:
    """`id` is stable per account or key: it names the per-principal budget.

    Scopes use the keys-file grammar; an account's repository permissions become scopes too
    (`read` → read:<repo>, `write` → write:<repo>, `admin` → write:<repo> and admin:<repo>, the
    last one never accepted from a keys file). Database credentials carry `credential_id`, and
    sessions and personal tokens the `account_id` they act for.
    """

    id: str
    kind: str  # "key" (keys file) | "service" (managed key) | "account" | "anonymous"
    scopes: frozenset[str]
    account_id: uuid.UUID | None = None
    read_only: bool = False  # a `read` personal token: never writes, whatever its account may do
    credential_id: uuid.UUID | None = None
    credential_kind: str | None = None  # "session" | "pat" | "service_key" for database credentials
    # A session of an account whose password an administrator reset: it holds no scope and may
    # only set a new password or log out (writer/identity/account_lifecycle.py).
    password_change_required: bool = False

    @property
    def is_anonymous(self) -> bool:
        return self.kind == "anonymous"

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def may_read(self, repository: str) -> bool:
        # may_write's rule, then reading's own scopes: spelled out, as this runs on every
        # download (three calls and two sets before).
        scopes = self.scopes
        return (
            "admin" in scopes
            or "write:*" in scopes
            or "read:*" in scopes
            or f"write:{repository}" in scopes
            or f"read:{repository}" in scopes
        )

    def may_write(self, repository: str) -> bool:
        return self.is_admin or bool(self.scopes & {"write:*", f"write:{repository}"})

    def may_administer(self, repository: str) -> bool:
        """May manage the repository's permissions: an administrator or its repository admin."""
        return self.is_admin or f"admin:{repository}" in self.scopes


ANONYMOUS = Principal(id="anonymous", kind="anonymous", scopes=frozenset())


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def memo_key(token: str) -> bytes:
    """What a process remembers a token by (the key ring's `remembered`, the credential cache):
    its BLAKE2b digest, never the token itself. It costs less than half a SHA-256 through
    OpenSSL (no per-call set-up: CPython's own code; ~3.4 k instructions against ~8 k without
    SHA extensions), and it is as safe to keep: a 512-bit digest of a high-entropy token can be
    neither reversed nor matched by another token, so a hit names the same token."""
    return hashlib.blake2b(token.encode()).digest()


class KeyRing:
    """Service keys from the keys file, looked up by the SHA-256 of the bearer token.

    A token found once is remembered by its `memo_key`, so that its next requests skip the
    SHA-256. Only tokens of this ring's keys are remembered (at most one entry per token that
    matched a key, so the memo is as bounded as the keys file), and the ring never changes
    while the process runs (a new keys file takes a restart), so a remembered answer cannot
    go stale."""

    def __init__(self, principals_by_digest: dict[str, Principal]) -> None:
        self._by_digest = principals_by_digest
        self._remembered: dict[bytes, Principal] = {}

    @classmethod
    def empty(cls) -> KeyRing:
        return cls({})

    @classmethod
    def from_file(cls, path: pathlib.Path) -> KeyRing:
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise KeysFileError(f"ARKVORY_KEYS_FILE: cannot read {path}: {exc}") from exc
        entries = document.get("key", [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise KeysFileError(f"ARKVORY_KEYS_FILE: {path}: expected [[key]] tables")
        return cls.from_entries(entries, source=str(path))

    @classmethod
    def from_entries(cls, entries: Iterable[dict], source: str = "keys") -> KeyRing:
        scopes_by_id: dict[str, set[str]] = {}
        digests: dict[str, str] = {}
        for number, entry in enumerate(entries, start=1):
            where = f"ARKVORY_KEYS_FILE: {source}: [[key]] #{number}"
            key_id, digest, scopes = entry.get("id"), entry.get("sha256"), entry.get("scopes")
            if not isinstance(key_id, str) or not key_id:
                raise KeysFileError(f"{where}: expected a non-empty string 'id'")
            if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
                raise KeysFileError(f"{where}: expected 'sha256' as 64 hex digits")
            if not isinstance(scopes, list) or not all(
                isinstance(s, str) and _SCOPE.match(s) for s in scopes
            ):
                raise KeysFileError(
                    f"{where}: expected 'scopes' as a list of admin, read:*, write:*, "
                    "read:<repo>, write:<repo>"
                )
            if digest.lower() in digests:
                raise KeysFileError(f"{where}: the same token digest appears twice")
            digests[digest.lower()] = key_id
            # Several keys with one id are one principal (rotation): their scopes unite.
            scopes_by_id.setdefault(key_id, set()).update(scopes)
        principals = {
            key_id: Principal(id=f"key:{key_id}", kind="key", scopes=frozenset(scopes))
            for key_id, scopes in scopes_by_id.items()
        }
        return cls({digest: principals[key_id] for digest, key_id in digests.items()})

    def lookup(self, token: str, known: bytes | None = None) -> Principal | None:
        """The key's principal, or None; `known` is the token's `memo_key` if the caller has it."""
        # A dict lookup by digest leaks nothing useful: the attacker cannot choose digests.
        if known is None:
            known = memo_key(token)
        principal = self._remembered.get(known)
        if principal is None:
            principal = self._by_digest.get(token_digest(token))
            if principal is not None:
                self._remembered[known] = principal
        return principal

    def remembered(self, known: bytes) -> Principal | None:
        """The principal of a token found before, by its `memo_key`; None when not (yet)
        remembered: `lookup` decides."""
        return self._remembered.get(known)


def authenticate(keys: KeyRing, authorization: str | None) -> Principal:
    """The principal behind a keys-file token (Bearer, or Basic's password); ANONYMOUS when no
    credentials were sent. Every request path uses `credentials.resolve`, which also knows
    database credentials."""
    token = presented_token(authorization)
    if token is None:
        return ANONYMOUS
    principal = keys.lookup(token)
    if principal is None:
        raise Unauthorized("the token is not valid")
    return principal
