"""`arkvory login`, `arkvory password` and `arkvory token create|list|revoke`: credentials without
curl (SPEC §5); an administrator's managed keys are key_commands.py's, accounts account_commands.py's.

`login` signs in with the account's password, makes a personal token with it (the password
makes it, so it may outlive the session, which is then ended) and files the token in a profile
of the config file (shared/client/cli_config_store.py: mode 0600), with the writer's device
cookie, which the next `login` as that account sends back so that guessers who lock the account
out do not lock out this device. The token is never printed by `login`; `token create` prints
the new one once, for a machine that cannot log in (CI).

A password is never a command-line option or an environment variable (every local user can
read a process's arguments): on a terminal it is asked for without echo (getpass); otherwise
one line of standard input is the password, for scripts and tests:
`printf '%s\\n' "$PASSWORD" | arkvory login alice`.

`password` signs in with the current password (so it needs no stored token, and works after an
administrator's reset, whose session may do nothing else), changes it, and signs out; the
account's other sessions end, its tokens stay. After a reset, `login` stores nothing: it says to
run `arkvory password` first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import socket
import sys
import uuid
from typing import Any

from .cli_output import Output, text_table

DEFAULT_LIFETIME = "90d"
_DURATION = re.compile(r"(\d+)([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_LIFETIME_S = 366 * 86400
# A granted expiry this much earlier than asked was capped by the server (the maker's expiry).
CAPPED_SLACK_S = 120


def register(add) -> None:
    """Add the commands through `add(name, summary, handler, parent=None)` of commands.py."""
    login = add(
        "login", "sign in with your account's password and store a personal token in your config "
        "file, for every later command", cmd_login,
    )
    login.add_argument("account", metavar="ACCOUNT", help="your account's name")
    login.add_argument(
        "--access", choices=("read", "write"), default="write",
        help="what the stored token may do: read, or write too (default; within your permissions)",
    )
    _lifetime_option(login)
    login.add_argument("--label", help="the token's label in `token list` (default: arkvory login on HOST)")

    password = add(
        "password", "change your account's password (asks for the current one, then the new one twice; "
        "without a terminal: the two lines of standard input)", cmd_password,
    )
    password.add_argument("account", metavar="ACCOUNT", help="your account's name")

    token = add("token", "create, list or revoke your personal tokens", None)
    actions = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = add(
        "create", "make a personal token and print it (once: store it then), e.g. for CI", cmd_token_create,
        parent=actions,
    )
    create.add_argument(
        "--access", choices=("read", "write"), required=True,
        help="read (downloads, lists) or write (uploads and changes too, within your permissions)",
    )
    create.add_argument("--label", default="", help="what it is for, shown by `token list`")
    _lifetime_option(create)
    create.add_argument(
        "--password", action="store_true",
        help="re-enter your password (asked for, or read from standard input) so that the token may "
        "outlive the credential that makes it; without it, it expires at the latest with that one and "
        "is revoked with it",
    )
    add("list", "show your tokens: id, access, expiry, last use and label (never a secret)", cmd_token_list,
        parent=actions)
    revoke = add("revoke", "revoke a token: refused on every server from its next request", cmd_token_revoke,
                 parent=actions)
    revoke.add_argument("token_id", metavar="ID", help="the token's id (from `token list`)")


def _lifetime_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expires", type=parse_lifetime, default=parse_lifetime(DEFAULT_LIFETIME), metavar="DURATION",
        help=f"how long the token lasts: N, Ns, Nm, Nh or Nd, at most 366d (default {DEFAULT_LIFETIME})",
    )


def duration_seconds(text: str) -> int | None:
    """`30d`, `12h`, `90m`, `3600s` or `3600` → seconds; None when it is none of these."""
    found = _DURATION.fullmatch(text.strip())
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)] if found else None


def parse_lifetime(text: str) -> int:
    """`30d`, `12h`, `90m`, `3600s` or `3600` → seconds (1 s to 366 days)."""
    seconds = duration_seconds(text) or 0
    if not 1 <= seconds <= MAX_LIFETIME_S:
        raise argparse.ArgumentTypeError(f"expected a duration like 30d, 12h or 3600s, at most 366d; got {text!r}")
    return seconds


def read_password(prompt: str) -> str:
    """The password: asked for on a terminal (no echo), else the first line of standard input."""
    from .cli_parsing import CommandUsageError

    if sys.stdin.isatty():
        import getpass

        password = getpass.getpass(prompt)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CommandUsageError("no password given (type it at the prompt, or pipe it on standard input)")
    return password


# login ------------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace, output: Output) -> int:
    from . import Client
    from .cli_config import config_path, resolve_connection
    from .cli_config_store import stored_device_cookie, store_profile
    from .cli_config import retry_policy
    from .errors import AuthError

    # Only the URLs: the token, if any, is what this replaces; the profile may be a new one.
    connection = resolve_connection(args.url, args.profile, os.environ, new_profile=True)
    path = config_path(os.environ)
    environ_profile = os.environ.get("ARKVORY_PROFILE") or None
    device = stored_device_cookie(path, args.profile, environ_profile=environ_profile, account=args.account)
    password = read_password(f"password for {args.account}: ")
    label = args.label or f"arkvory login on {socket.gethostname()}"[:200]
    with Client(list(connection.urls), None, retry=retry_policy(args)) as client:
        session = client.login(args.account, password, device_cookie=device)
        if session.must_change_password:
            _end_quietly(client, session)
            raise AuthError(
                f"an administrator reset the password of {args.account}: set your own with `arkvory password"
                f" {args.account}` (the password you were given is the current one), then log in again",
                code="password_change_required",
            )
        try:
            created = client.create_token(
                access=args.access, label=label, expires_in_seconds=args.expires, password=password, session=session,
            )
        finally:
            _end_quietly(client, session)  # the token is what stays; the session has done its work
    stored = store_profile(
        path, args.profile, urls=connection.urls, token=created["token"], environ_profile=environ_profile,
        device_cookie=(args.account, session.device_cookie) if session.device_cookie else None,
    )
    output.note(
        f"logged in as {args.account}: a {created.get('access')} token (id {created.get('id')}, expires "
        f"{utc_minute(created.get('expiresAt'))}) is stored in profile '{stored.profile}' of {path}"
    )
    _notes_after_storing(output, stored)
    output.result({
        "account": args.account, "profile": stored.profile, "config": str(path),
        "token": {k: v for k, v in created.items() if k != "token"},
    })
    return 0


def _end_quietly(client, session) -> None:
    from .errors import ClientError

    try:
        client.logout(session)
    except ClientError:
        pass  # it expires by itself (ARKVORY_SESSION_LIFETIME)


# password ---------------------------------------------------------------------------------------


def read_new_password() -> str:
    """A new password: asked twice on a terminal (the two must match), else the next line of
    standard input."""
    from .cli_parsing import CommandUsageError

    new = read_password("new password: ")
    if sys.stdin.isatty() and read_password("new password again: ") != new:
        raise CommandUsageError("the two new passwords differ: nothing was changed")
    return new


def cmd_password(args: argparse.Namespace, output: Output) -> int:
    from . import Client
    from .cli_config import config_path, resolve_connection, retry_policy
    from .cli_config_store import stored_device_cookie

    connection = resolve_connection(args.url, args.profile, os.environ)
    environ_profile = os.environ.get("ARKVORY_PROFILE") or None
    device = stored_device_cookie(config_path(os.environ), args.profile, environ_profile=environ_profile,
                                  account=args.account)
    current = read_password(f"current password for {args.account}: ")
    new = read_new_password()
    with Client(list(connection.urls), None, retry=retry_policy(args)) as client:
        session = client.login(args.account, current, device_cookie=device)
        try:
            client.change_password(current, new, session=session)
        finally:
            _end_quietly(client, session)
    output.note(
        f"the password of {args.account} is changed: its other sessions ended, its personal tokens stay valid"
        + ("" if not session.must_change_password else "; log in again with `arkvory login`")
    )
    output.result({"account": args.account, "changed": True})
    return 0


def _notes_after_storing(output: Output, stored) -> None:
    if stored.backup is not None:
        output.note(f"the file was rewritten without its comments; the old one is {stored.backup}")
    if stored.default_profile != stored.profile:
        output.note(f"use it with --profile {stored.profile} or ARKVORY_PROFILE={stored.profile}")
    if os.environ.get("ARKVORY_TOKEN", "").strip():
        output.note("ARKVORY_TOKEN is set, and comes before a profile's token: unset it to use this one")
    previous = _token_id(stored.previous_token)
    if previous is not None:
        output.note(f"the profile's previous token stays valid until it expires: arkvory token revoke {previous}")


def _token_id(token: str | None) -> str | None:
    """The id in a personal token `pat_<32 hex>.<secret>` (public: it is what `token list` shows)."""
    found = re.fullmatch(r"pat_([0-9a-f]{32})\..+", token or "")
    return str(uuid.UUID(found.group(1))) if found else None


# token ------------------------------------------------------------------------------------------


def cmd_token_create(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    password = read_password("your password: ") if args.password else None
    with client_for(args) as client:
        created = client.create_token(
            access=args.access, label=args.label, expires_in_seconds=args.expires, password=password
        )
    output.note(
        f"token {created.get('id')} ({created.get('access')}, expires {utc_minute(created.get('expiresAt'))}) "
        "is shown only now: store it"
    )
    capped = _capped(created.get("expiresAt"), args.expires)
    if created.get("endsWith") or capped:
        # Made without the password: the writer revokes it with the token that made it (SPEC §5).
        output.note(
            f"it expires with the credential that made it{', sooner than asked' if capped else ' at the latest'}"
            ", and is revoked with it; --password makes one that outlives it"
        )
    output.result(created, human=created["token"])
    return 0


def cmd_token_list(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        tokens = client.list_tokens()
    rows = [("ID", "ACCESS", "EXPIRES", "LAST USED", "LABEL")] + [
        (
            str(t.get("id")), str(t.get("access")), utc_minute(t.get("expiresAt")),
            utc_minute(t.get("lastUsedAt")) if t.get("lastUsedAt") else "never", str(t.get("label") or ""),
        )
        for t in tokens
    ]
    output.result({"tokens": tokens}, human=text_table(rows) if tokens else "no tokens")
    return 0


def cmd_token_revoke(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for
    from .cli_parsing import CommandUsageError

    try:
        token_id = str(uuid.UUID(args.token_id))
    except ValueError:
        raise CommandUsageError(f"ID: expected a token id (a UUID, see `arkvory token list`), got {args.token_id!r}") from None
    with client_for(args) as client:
        client.revoke_token(token_id)
    output.note(f"revoked token {token_id}")
    output.result({"revoked": token_id})
    return 0


def utc_minute(value: Any) -> str:
    """An ISO timestamp from the server, to the minute in UTC (what a person compares)."""
    moment = _moment(value)
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else str(value)


def _moment(value: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(value)).astimezone(datetime.timezone.utc)
    except ValueError:
        return None


def _capped(expires_at: Any, asked_seconds: int) -> bool:
    moment = _moment(expires_at)
    if moment is None:
        return False
    asked = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=asked_seconds)
    return (asked - moment).total_seconds() > CAPPED_SLACK_S
