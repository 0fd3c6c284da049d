"""`arkvory account list|show|reset-password|delete`: an administrator's accounts without curl
(SPEC §5, issue 25 §1).

`reset-password NAME` sets a password the administrator chooses, read like `arkvory login` reads
one (asked twice on a terminal, else one line of standard input; never an argument): the
account's sessions end and it must set its own at its next sign-in (`arkvory password NAME`).
`delete NAME` ends the account's credentials on every server at once, suspends the managed keys
it made (`arkvory key adopt`), removes its permissions and keeps its artifacts, which still say
who uploaded them. Neither works on the caller's own account; the last administrator account is
deleted only with a keys-file key.
"""

from __future__ import annotations

import argparse

from .cli_output import Output, text_table
from .credential_commands import read_new_password, utc_minute


def register(add) -> None:
    """Add the commands through `add(name, summary, handler, parent=None)` of commands.py."""
    account = add("account", "list, show, reset the password of or delete accounts (administrators)", None)
    actions = account.add_subparsers(dest="action", required=True, metavar="ACTION")
    add("list", "show every account: name, administrator, state, password to change, created",
        cmd_account_list, parent=actions)
    show = add("show", "show one account and what it holds: sessions, tokens, keys it made, repositories",
               cmd_account_show, parent=actions)
    show.add_argument("name", metavar="NAME", help="the account's name")
    reset = add(
        "reset-password", "set another account's password (asked for, or read from standard input): its "
        "sessions end and it must set its own at its next sign-in", cmd_account_reset, parent=actions,
    )
    reset.add_argument("name", metavar="NAME", help="the account's name")
    delete = add(
        "delete", "delete an account: its sessions and tokens end at once, the keys it made are suspended, "
        "its permissions go, its artifacts stay", cmd_account_delete, parent=actions,
    )
    delete.add_argument("name", metavar="NAME", help="the account's name")


def _state(account: dict) -> str:
    state = "disabled" if account.get("disabled") else "enabled"
    return state + (", must change password" if account.get("mustChangePassword") else "")


def cmd_account_list(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        accounts = client.list_accounts()
    rows = [("NAME", "ADMIN", "STATE", "CREATED")] + [
        (str(a.get("name")), "yes" if a.get("admin") else "no", _state(a), utc_minute(a.get("createdAt")))
        for a in accounts
    ]
    output.result({"accounts": accounts}, human=text_table(rows) if accounts else "no accounts")
    return 0


def _holds(holds: dict) -> str:
    return (f"{holds.get('sessions')} session(s), {holds.get('tokens')} personal token(s), "
            f"{holds.get('keysMade')} managed key(s) it made, a permission on {holds.get('repositories')} repositories")


def cmd_account_show(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        account = client.account(args.name)
    human = "\n".join([
        f"name      {account.get('name')} ({'administrator' if account.get('admin') else 'account'}, {_state(account)})",
        f"id        {account.get('id')}",
        f"created   {utc_minute(account.get('createdAt'))}",
        f"holds     {_holds(account.get('holds') or {})}",
    ])
    output.result(account, human=human)
    return 0


def cmd_account_reset(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    password = read_new_password()
    with client_for(args) as client:
        account = client.reset_password(args.name, password)
    output.note(
        f"the password of {account.get('name')} is reset and {account.get('sessionsEnded')} session(s) ended: at its"
        f" next sign-in it must set its own (`arkvory password {account.get('name')}`, or the console)"
    )
    output.result(account)
    return 0


def cmd_account_delete(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        deleted = client.delete_account(args.name)
    output.note(f"deleted account {deleted.get('name')}: ended {_holds(deleted.get('ended') or {})}; its artifacts stay")
    output.result(deleted)
    return 0
