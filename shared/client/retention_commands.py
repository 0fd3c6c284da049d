"""`arkvory retention show|set|preview|disable REPO`: a repository's retention rule without curl
(issue 25 item 10), for its repository admins.

`set` saves the rule disabled unless `--enable` is given: `preview` lists what it would delete
first (the same query the cleanup task deletes by), and enabling is a second, explicit `set`.
`disable` keeps the rule and stops it; `disable --delete` removes it.
"""

from __future__ import annotations

import argparse
from typing import Any

from .cli_output import Output, human_size, text_table
from .credential_commands import duration_seconds, utc_minute

MIN_AGE_S = 60
MAX_AGE_S = 100 * 365 * 86400  # the writer's bounds (writer/catalog/retention_rules.py)
MAX_KEEP_NEWEST = 100_000
DEFAULT_SHOWN = 100
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def register(add) -> None:
    """Add the commands through `add(name, summary, handler, parent=None)` of commands.py."""
    retention = add("retention", "show, set, preview or disable a repository's retention rule (its admins)", None)
    actions = retention.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = add("show", "show the rule: its limits, whether it is enabled, when the cleanup last applied it",
               cmd_show, parent=actions)
    show.add_argument("repo", metavar="REPO")
    put = add(
        "set", "save the rule (disabled unless --enable): an artifact goes only when it is beyond the newest "
        "N and older than DURATION (one limit alone keeps by that one); a package version or an asset "
        "pointing at it always keeps it", cmd_set, parent=actions,
    )
    put.add_argument("repo", metavar="REPO")
    _limit_options(put)
    put.add_argument("--enable", action="store_true",
                     help="let the cleanup task delete by it (run `retention preview` first); without it the "
                     "rule is saved disabled")
    preview = add(
        "preview", "the dry run: list the artifacts the next cleanup would delete, oldest first (by the saved "
        "rule, enabled or not, or by the limits given)", cmd_preview, parent=actions,
    )
    preview.add_argument("repo", metavar="REPO")
    _limit_options(preview)
    preview.add_argument("--limit", type=_count(0, 10**9), default=DEFAULT_SHOWN, metavar="N",
                         help=f"list at most N of them (default {DEFAULT_SHOWN}; 0: all); all are counted")
    disable = add("disable", "stop the rule deleting (it stays, disabled); --delete removes it", cmd_disable,
                  parent=actions)
    disable.add_argument("repo", metavar="REPO")
    disable.add_argument("--delete", action="store_true", help="remove the rule instead of keeping it disabled")


def _limit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-newest", type=_count(1, MAX_KEEP_NEWEST), metavar="N",
                        help="keep the repository's newest N artifacts")
    parser.add_argument("--keep-younger-than", type=_age, metavar="DURATION",
                        help="keep the artifacts younger than this: Nd, Nh, Nm or Ns (at least 60s)")


def _count(low: int, high: int):
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text!r}")
        return int(text)

    return parse


def _age(text: str) -> int:
    seconds = duration_seconds(text)
    if seconds is None or not MIN_AGE_S <= seconds <= MAX_AGE_S:
        raise argparse.ArgumentTypeError(f"expected a duration like 30d, 12h or 90m, from 60s to 36500d; got {text!r}")
    return seconds


def duration_text(seconds: int | None) -> str:
    """3600 → '1h', 2592000 → '30d', 90 → '90s': the largest unit that divides it."""
    if seconds is None:
        return "-"
    for unit, size in _UNITS:
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    raise AssertionError("unreachable")


def _limits(args: argparse.Namespace) -> dict[str, int | None]:
    from .cli_parsing import CommandUsageError

    if args.keep_newest is None and args.keep_younger_than is None:
        raise CommandUsageError("give --keep-newest N, --keep-younger-than DURATION or both")
    return {"keep_newest": args.keep_newest, "keep_younger_than_s": args.keep_younger_than}


def _describe(rule: dict[str, Any]) -> str:
    keeps = []
    if rule.get("keepNewest") is not None:
        keeps.append(f"the newest {rule['keepNewest']}")
    if rule.get("keepYoungerThanSeconds") is not None:
        keeps.append(f"those younger than {duration_text(rule['keepYoungerThanSeconds'])}")
    return "keeps " + " and ".join(keeps) + " (and whatever a package version or an asset points at)"


def _rule_text(rule: dict[str, Any]) -> str:
    rows = [
        ("repository", str(rule.get("repository"))),
        ("keep newest", str(rule.get("keepNewest") if rule.get("keepNewest") is not None else "-")),
        ("keep younger than", duration_text(rule.get("keepYoungerThanSeconds"))),
        ("enabled", "yes" if rule.get("enabled") else "no (deletes nothing)"),
        ("updated", utc_minute(rule.get("updatedAt"))),
        ("last applied", utc_minute(rule["lastAppliedAt"]) if rule.get("lastAppliedAt") else "never"),
        ("deleted in all", str(rule.get("deletedTotal"))),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def cmd_show(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        rule = client.retention_rule(args.repo)
    output.result(rule, human=_rule_text(rule))
    return 0


def cmd_set(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    limits = _limits(args)
    with client_for(args) as client:
        rule = client.set_retention_rule(args.repo, enabled=args.enable, **limits)
    if rule.get("enabled"):
        output.note(f"the rule of {args.repo} {_describe(rule)}; enabled: the next cleanup deletes the rest")
    else:
        output.note(
            f"the rule of {args.repo} {_describe(rule)}; saved disabled: it deletes nothing. See what it would "
            f"delete with `arkvory retention preview {args.repo}`, then add --enable to this command"
        )
    output.result(rule, human=_rule_text(rule))
    return 0


def cmd_preview(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    asked = {"keep_newest": args.keep_newest, "keep_younger_than_s": args.keep_younger_than}
    shown: list[dict[str, Any]] = []
    count = size = 0
    with client_for(args) as client:
        for artifact in client.retention_preview(args.repo, **asked):
            count += 1
            size += artifact.get("size") or 0
            if args.limit == 0 or len(shown) < args.limit:
                shown.append(artifact)
    which = "these limits" if any(v is not None for v in asked.values()) else "its rule"
    output.note(f"by {which}, the next cleanup would delete {count} artifact(s) of {args.repo}, "
                f"{human_size(size)} (each one's blob goes once no artifact uses it)")
    if len(shown) < count:
        output.note(f"the oldest {len(shown)} are listed (--limit 0 lists all)")
    rows = [("ID", "CREATED", "SIZE", "NAME")] + [
        (str(a.get("id")), utc_minute(a.get("createdAt")), str(a.get("size")), str(a.get("name"))) for a in shown
    ]
    output.result({"count": count, "bytes": size, "artifacts": shown},
                  human=text_table(rows) if shown else "nothing would be deleted")
    return 0


def cmd_disable(args: argparse.Namespace, output: Output) -> int:
    from .cli_config import client_for

    with client_for(args) as client:
        if args.delete:
            client.delete_retention_rule(args.repo)
            output.note(f"deleted the retention rule of {args.repo}")
            output.result({"repository": args.repo, "deleted": True})
            return 0
        rule = client.retention_rule(args.repo)
        rule = client.set_retention_rule(
            args.repo, keep_newest=rule.get("keepNewest"), keep_younger_than_s=rule.get("keepYoungerThanSeconds"),
            enabled=False,
        )
    output.note(f"the retention rule of {args.repo} is disabled: it deletes nothing until enabled again")
    output.result(rule, human=_rule_text(rule))
    return 0
