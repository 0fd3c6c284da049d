"""`arkvory key list|adopt|revoke`: an administrator's managed service keys without curl (SPEC §5).

Disabling an account suspends the managed keys it made; `key list` shows them (state `suspended`) and
`key adopt ID` makes one the caller's: it works again, and ends with the caller's token (the
profile's) unless `--password` re-enters the caller's account password, read like `arkvory
login` reads it (asked on a terminal, else one line of standard input). Keys are made in the
console or with the API (`POST /api/v1/keys`).
"""

from __future__ import annotations

import argparse
import uuid

from .cli_output import Output, text_table
from .credential_commands import read_password, utc_minute


def register(add) -> None:
    """Add the commands through `add(name, summary, handler, parent=None)` of commands.py."""
    key = add("key", "list, adopt or revoke managed service keys (administrators)", None)
    actions = key.add_subparsers(dest="action", required=True, metavar="ACTION")
    add("list", "show every managed key: id, state, maker, expiry, scopes and label (never a secret)",
        cmd_key_list, parent=actions)
    adopt = add(
        "adopt", "make a key suspended by its maker's disable yours: it works again", cmd_key_adopt, parent=actions,
    )
    adopt.add_argument("key_id", metavar="ID", help="the key's id (from `key list`)")
    adopt.add_argument(
        "--password", action="store_true",
        help="re-enter your password (asked for, or read from standard input) so that the key may outlive "
        "the token adopting it; without it, it ends with that token",
    )
    revoke = add("revoke", "revoke a key: refused on every server from its next request", cmd_key_revoke,
                 parent=actions)
    revoke.add_argument("key_id", metavar="ID", help="the key's id (from `key list`)")


def _key_id(text: str) -> str:
    from .cli_parsing import CommandUsageError

    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise CommandUsageError(f"ID: expected a key id (a UUID, see `arkvory key list`), got {text!r}") from None


def cmd_key_list(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        keys = client.list_keys()
    rows = [("ID", "STATE", "MADE BY", "EXPIRES", "SCOPES", "LABEL")] + [
        (
            str(k.get("id")), "suspended" if k.get("suspendedAt") else "active",
            str(k.get("makerAccount") or k.get("madeThrough") or k.get("createdBy") or ""),
            utc_minute(k.get("expiresAt")), " ".join(k.get("scopes") or []), str(k.get("label") or ""),
        )
        for k in keys
    ]
    output.result({"keys": keys}, human=text_table(rows) if keys else "no managed keys")
    return 0


def cmd_key_adopt(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    key_id = _key_id(args.key_id)
    password = read_password("your password: ") if args.password else None
    with client_for(args) as client:
        adopted = client.adopt_key(key_id, password=password)
    lasts = (f"until {utc_minute(adopted.get('expiresAt'))}" if not adopted.get("endsWith")
             else f"until {utc_minute(adopted.get('expiresAt'))} at the latest, and ends with the token that adopted it"
             " (--password makes it outlive that token)")
    output.note(f"key {key_id} is yours now and works again, {lasts}")
    output.result(adopted)
    return 0


def cmd_key_revoke(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    key_id = _key_id(args.key_id)
    with client_for(args) as client:
        client.revoke_key(key_id)
    output.note(f"revoked key {key_id}")
    output.result({"revoked": key_id})
    return 0
