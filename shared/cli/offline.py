"""`arkvory admin gc` and `arkvory admin scrub`: the cleanup and verify task kinds run offline,
with every server stopped (writer/worker/offline.py holds the locks and the exit statuses).
Part of the command line, not of the writer: `--dev` reads a running `arkvory dev`'s environment.

Both read ARKVORY_DATABASE_URL and ARKVORY_DATA_DIR (and the other ARKVORY_* settings, e.g.
ARKVORY_CLEANUP_GRACE), or `--dev [DIR]` for a stopped-but-present `arkvory dev` cluster, whose
PostgreSQL (and SeaweedFS) they start for their length (dev.offline_tool_environment).
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_USAGE = 2


def register(commands: argparse._SubParsersAction, admin: argparse._SubParsersAction) -> None:
    """Add `gc` and `scrub` to `arkvory admin`."""
    gc = admin.add_parser(
        "gc",
        help="offline cleanup: delete unreferenced blobs and stray files, expired uploads, keys "
        "and tasks (refuses while any gateway, the writer or the worker is up: exit 75)",
    )
    gc.add_argument(
        "--grace", type=int, metavar="SECONDS",
        help="keep blobs and stray files younger than this (default: ARKVORY_CLEANUP_GRACE)",
    )
    _common(gc).set_defaults(func=_runner("cleanup"))
    scrub = admin.add_parser(
        "scrub",
        help="offline verify: re-hash every stored blob and record missing or corrupt ones "
        "(refuses while any server is up: exit 75)",
    )
    _common(scrub).set_defaults(func=_runner("verify"))


def _common(action: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from . import DEFAULT_DEV_DIR as DEFAULT_DIR

    action.add_argument(
        "--params", metavar="JSON", default=None,
        help="the task's params as a JSON object (as for POST /api/v1/tasks)",
    )
    action.add_argument(
        "--dev", nargs="?", const=DEFAULT_DIR, metavar="DIR",
        help=f"use the database and storage of the stopped arkvory dev in DIR (default {DEFAULT_DIR}),"
        " starting its PostgreSQL for the command's length",
    )
    return action


def _runner(kind_name: str):
    def run(args: argparse.Namespace) -> int:
        from arkvory.shared.errors import InvalidInput, StartupError
        from arkvory.writer.worker.offline import run_offline
        from arkvory.writer.maintenance.kinds import KINDS

        from .main import _settings_or_exit

        from .dev import offline_tool_environment

        kind = KINDS[kind_name]
        try:
            params = json.loads(args.params) if args.params is not None else {}
            if getattr(args, "grace", None) is not None:
                params = {**(params or {}), "grace_seconds": args.grace}
            params = kind.validate_params(params)
        except json.JSONDecodeError as exc:
            print(f"arkvory: --params is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except InvalidInput as exc:
            print(f"arkvory: {exc}", file=sys.stderr)
            return EXIT_USAGE
        import asyncio  # here: every `arkvory` command loads this module, `get` needs no asyncio

        try:
            with offline_tool_environment(args.dev) as environ:
                settings = _settings_or_exit(environ)
                return asyncio.run(run_offline(kind, kind_name, params, settings))
        except StartupError as exc:  # no dev state, or its PostgreSQL did not start
            print(f"arkvory: {exc}", file=sys.stderr)
            return exc.exit_status

    return run
