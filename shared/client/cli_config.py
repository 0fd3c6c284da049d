"""Where the client commands find their server and token: `--url`, `ARKVORY_URL`, `ARKVORY_TOKEN`,
or a profile of the config file; and the library Client they make of it (`client_for`). A token is never a command-line option: other users can read
every process's arguments.

Order, first that has a value wins (what is typed beats what is exported beats what is filed):

- URLs: `--url` (repeatable) → an explicit `--profile`'s `url` → `ARKVORY_URL` (comma-separated)
  → the url of the profile chosen by `ARKVORY_PROFILE`, the file's `default_profile`, or
  `[profiles.default]`.
- token: an explicit `--profile`'s `token` → `ARKVORY_TOKEN` → that profile's `token`.

The file is `$XDG_CONFIG_HOME/arkvory/config.toml` (default `~/.config/arkvory/config.toml`):

    default_profile = "prod"
    [profiles.prod]
    url = "https://arkvory.example.com"      # or a list of URLs
    token = "pat_..."

A file holding a token must be readable by its owner only (like ssh's keys), or it is refused.
`arkvory login` writes a profile's url and token (cli_config_store.py).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

CONFIG_NAME = pathlib.Path("arkvory") / "config.toml"
DEFAULT_PROFILE = "default"
# What can travel in `Authorization: Bearer ...`: visible ASCII, no spaces (RFC 6750's b64token
# and then some); anything else would fail deep inside the HTTP library instead of here.
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")


class ConfigError(ValueError):
    """A problem the user fixes in the options, the environment or the config file (exit 2)."""

    exit_code = 2
    code = "usage"


@dataclass(frozen=True)
class Connection:
    """The server addresses to try, in order, and the token to present (None: anonymous)."""

    urls: tuple[str, ...]
    token: str | None = field(default=None, repr=False)
    profile: str | None = None


def config_path(environ: Mapping[str, str]) -> pathlib.Path:
    base = environ.get("XDG_CONFIG_HOME") or ""
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    if not os.path.isabs(base):
        home = environ.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".config")
    return pathlib.Path(base) / CONFIG_NAME


def resolve_connection(
    urls: Sequence[str] | None, profile: str | None, environ: Mapping[str, str], *, new_profile: bool = False
) -> Connection:
    """The connection of one command run, from its `--url`/`--profile` and the environment.
    `new_profile`: the command may name a profile the file does not hold yet (`login` makes it),
    so a profile not found is not an error; for every other command it is (a misspelt name)."""
    typed_urls = _parse_urls(urls or (), "--url")
    env_urls = _parse_urls((environ.get("ARKVORY_URL") or "").split(","), "ARKVORY_URL")
    env_token = (environ.get("ARKVORY_TOKEN") or "").strip() or None
    explicit = profile is not None
    chosen = profile if explicit else (environ.get("ARKVORY_PROFILE") or None)

    # The file is read only when something may come from it, so a broken or loose file does not
    # stand in the way of a run fully configured by options and environment.
    table: dict[str, Any] = {}
    if explicit or not (typed_urls or env_urls) or env_token is None:
        table, chosen = _profile_table(config_path(environ), chosen, required=chosen is not None and not new_profile)
    file_urls = _parse_urls(_as_list(table.get("url")), f"url of profile {chosen!r}") if table else ()
    file_token = table.get("token") if table else None
    if file_token is not None and not isinstance(file_token, str):
        raise ConfigError(f"token of profile {chosen!r} must be a string")
    file_token = (file_token or "").strip() or None

    # An explicit --profile outranks the environment; a profile chosen any other way ranks below.
    url_order = [typed_urls, file_urls, env_urls] if explicit else [typed_urls, env_urls, file_urls]
    final_urls = next((u for u in url_order if u), ())
    tokens = [(file_token, f"the token of profile {chosen!r}"), (env_token, "ARKVORY_TOKEN")]
    token, source = next(((t, s) for t, s in (tokens if explicit else tokens[::-1]) if t), (None, ""))
    if token is not None and not _TOKEN.fullmatch(token):
        # Said without the token itself: the message may end up in a shared log.
        raise ConfigError(f"{source} is not a token: expected visible ASCII characters, no spaces")
    if not final_urls:
        raise ConfigError(
            "no server: pass --url URL, set ARKVORY_URL, or give a profile a url in "
            f"{config_path(environ)}"
        )
    return Connection(urls=final_urls, token=token, profile=chosen)


def _profile_table(
    path: pathlib.Path, chosen: str | None, *, required: bool
) -> tuple[dict[str, Any], str | None]:
    """The `[profiles.NAME]` table to use (empty when there is none) and its name."""
    if not path.exists():
        if required:
            raise ConfigError(f"profile {chosen!r} asked for, but there is no config file {path}")
        return {}, chosen
    document = _load_checked(path)
    profiles = document.get("profiles", {})
    if not isinstance(profiles, dict) or not all(isinstance(t, dict) for t in profiles.values()):
        raise ConfigError(f"{path}: 'profiles' must hold tables like [profiles.NAME]")
    if chosen is None:
        default = document.get("default_profile")
        if default is not None and not isinstance(default, str):
            raise ConfigError(f"{path}: default_profile must be a string")
        chosen = default or (DEFAULT_PROFILE if DEFAULT_PROFILE in profiles else None)
        required = default is not None
    if chosen is None:
        return {}, None
    if chosen not in profiles:
        if required:
            known = ", ".join(sorted(profiles)) or "none"
            raise ConfigError(f"{path}: no profile {chosen!r} (profiles: {known})")
        return {}, chosen
    return profiles[chosen], chosen


def _load_checked(path: pathlib.Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        # Checked on the open file, not the name, so a swap between check and read is moot.
        mode = os.fstat(handle.fileno()).st_mode
        raw = handle.read()
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    if _holds_token(document) and stat.S_IMODE(mode) & 0o077:
        raise ConfigError(
            f"{path} holds a token but is readable by others (mode {stat.S_IMODE(mode):04o}); "
            f"refusing to use it: run  chmod 600 {path}"
        )
    return document


def _holds_token(document: dict[str, Any]) -> bool:
    profiles = document.get("profiles")
    if isinstance(profiles, dict):
        return any(isinstance(t, dict) and "token" in t for t in profiles.values())
    return "token" in document


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _parse_urls(values: Sequence[Any], where: str) -> tuple[str, ...]:
    urls = []
    for value in values:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a URL string, got {value!r}")
        text = value.strip()
        if not text:
            continue
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{where}: expected an http:// or https:// URL, got {_shown(text)!r}")
        if "@" in parts.netloc:
            raise ConfigError(
                f"{where}: credentials do not belong in a URL, got {_shown(text)!r}: set ARKVORY_TOKEN"
                " or run `arkvory login ACCOUNT`"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"{where}: a server URL takes no query or fragment, got {_shown(text)!r}")
        urls.append(text.rstrip("/"))
    return tuple(urls)


def _shown(text: str) -> str:
    """A refused URL as its error shows it, which a terminal or a CI log keeps: without a query,
    a fragment or a user and password, where a mistaken credential would sit (`?token=...`)."""
    cut = re.search(r"[?#]", text)
    head, tail = (text[: cut.start()], f"{cut.group()}…") if cut else (text, "")
    scheme, separator, rest = head.partition("://")
    if not separator:
        scheme, rest = "", head
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = f"…@{authority.rpartition('@')[2]}"
    return f"{scheme}{separator}{authority}{slash}{path}{tail}"


def client_for(args: argparse.Namespace):
    """The library's Client for a command run: its URLs and token (as above), its retries."""
    from . import Client

    connection = args.connection = resolve_connection(args.url, args.profile, os.environ)
    return Client(list(connection.urls), connection.token, retry=retry_policy(args))


def retry_policy(args: argparse.Namespace):
    """The library's retries, bounded by `--retries` and `--retry-time` where given."""
    from . import RetryPolicy

    limits: dict[str, Any] = {}
    if args.retries is not None:
        limits["max_attempts"] = args.retries + 1
    if args.retry_time is not None:
        limits["max_total_seconds"] = args.retry_time
    return RetryPolicy(**limits)
