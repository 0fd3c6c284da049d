"""`arkvory login` files its token in a profile of the config file that
shared/client/cli_config.py reads, and beside it the writer's device cookie for the account
(`[profiles.NAME.device_cookies]`, by account name in lower case as the writer folds it), which
the next `arkvory login` as that account sends back: a device that signed in before is then
limited on its own, never locked out by someone else's wrong guesses (SPEC §5).

The file is replaced whole and atomically (a temporary file in the same directory, created with
mode 0600 before a byte is written, then renamed), so no reader ever sees half a file and the
token is never readable by others, not even for a moment. Its directory is made 0700 when
missing. The standard library reads TOML but writes none, so the document is written back by
`dumps` below, which keeps every value but not comments or layout: when the rewrite would lose
any, the old file is kept beside it as `config.toml.bak` (0600) and the caller says so. A file
that is not valid TOML is never overwritten.
"""

from __future__ import annotations

import datetime
import math
import os
import pathlib
import re
import string
import tempfile
import tomllib
from dataclasses import dataclass, field
from typing import Any

from .cli_config import DEFAULT_PROFILE, ConfigError
from .errors import LocalIOError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)  # the writer's fold of names
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


@dataclass(frozen=True)
class Stored:
    """What storing changed: the profile written, its previous token (never shown), the profile
    a run without --profile uses, and the copy of the old file when its comments were lost."""

    profile: str
    previous_token: str | None = field(repr=False)
    default_profile: str
    backup: pathlib.Path | None


def store_profile(
    path: pathlib.Path,
    profile: str | None,
    *,
    urls: tuple[str, ...],
    token: str,
    environ_profile: str | None,
    device_cookie: tuple[str, str] | None = None,
) -> Stored:
    """Set `[profiles.PROFILE]`'s url and token in the file at `path` (created if missing), and
    `device_cookie` (account name, cookie) in its device_cookies. Without `profile`, the one a run
    without --profile uses: `environ_profile` (ARKVORY_PROFILE), else the file's
    default_profile, else `default`."""
    raw = _read(path)
    try:
        document = tomllib.loads(raw) if raw is not None else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); fix it or move it away, then log in again") from None
    default = _default_profile(document, environ_profile)
    profile = profile or default
    profiles = document.setdefault("profiles", {})
    if not isinstance(profiles, dict) or not isinstance(profiles.setdefault(profile, {}), dict):
        raise ConfigError(f"{path}: 'profiles' must hold tables like [profiles.NAME]; fix it, then log in again")
    table = profiles[profile]
    previous = table.get("token") if isinstance(table.get("token"), str) else None
    table["url"] = urls[0] if len(urls) == 1 else list(urls)
    table["token"] = token
    if device_cookie is not None:
        cookies = table.setdefault("device_cookies", {})
        if not isinstance(cookies, dict):
            cookies = table["device_cookies"] = {}  # not ours to keep: `arkvory login` writes this one
        account, cookie = device_cookie
        cookies[account.translate(_ASCII_LOWER)] = cookie
    text = dumps(document)
    backup = None
    if raw is not None and dumps(tomllib.loads(raw)) != raw:
        backup = path.with_name(path.name + ".bak")
        _replace(backup, raw)
    _replace(path, text)
    return Stored(profile, previous, default, backup)


def stored_device_cookie(
    path: pathlib.Path, profile: str | None, *, environ_profile: str | None, account: str
) -> str | None:
    """The device cookie that `store_profile` filed for `account` in the profile it would write,
    or None (none filed, or no file to read: storing the new token reports the file's problems)."""
    try:
        raw = _read(path)
        document = tomllib.loads(raw) if raw is not None else {}
    except (LocalIOError, tomllib.TOMLDecodeError):
        return None
    table = document.get("profiles", {})
    table = table.get(profile or _default_profile(document, environ_profile)) if isinstance(table, dict) else None
    cookies = table.get("device_cookies") if isinstance(table, dict) else None
    cookie = cookies.get(account.translate(_ASCII_LOWER)) if isinstance(cookies, dict) else None
    return cookie if isinstance(cookie, str) else None


def _default_profile(document: dict[str, Any], environ_profile: str | None) -> str:
    default = document.get("default_profile")
    return environ_profile or (default if isinstance(default, str) and default else DEFAULT_PROFILE)


def dumps(document: dict[str, Any]) -> str:
    """TOML for a document as tomllib reads it (tables, arrays of plain values, scalars)."""
    lines: list[str] = []
    _table(lines, [], document)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(lines: list[str], prefix: list[str], table: dict[str, Any]) -> None:
    plain = [(k, v) for k, v in table.items() if not isinstance(v, dict)]
    nested = [(k, v) for k, v in table.items() if isinstance(v, dict)]
    if prefix and (plain or not nested):
        lines.append("")
        lines.append(f"[{'.'.join(_key(p) for p in prefix)}]")
    for key, value in plain:
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in nested:
        _table(lines, [*prefix, key], value)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)  # TOML's inf, -inf and nan
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list) and not any(isinstance(v, dict) for v in value):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    # An array of tables: rare in this file, and more than `arkvory login` should rewrite.
    raise ConfigError("the config file holds an array of tables; add the token to it by hand")


def _string(text: str) -> str:
    escaped = "".join(
        _ESCAPES.get(ch) or (f"\\u{ord(ch):04X}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch) for ch in text
    )
    return f'"{escaped}"'


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalIOError(f"cannot read {path}: {exc}") from None


def _replace(path: pathlib.Path, text: str) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkstemp creates the file 0600 (whatever the umask) before anything is written to it.
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise LocalIOError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        os.unlink(temporary)
        if isinstance(exc, OSError):
            raise LocalIOError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
