"""The argparse class of every `arkvory` subcommand (shared/cli/main.py passes it to its subparsers).

argparse hands a subcommand's unknown options back to the top-level parser, which reports them
with the top-level usage (`arkvory [-h] {serve,dev,...}`): a user who mistyped one option of
`arkvory get` would not see get's options. Here the subcommand's own parser reports them.
"""

from __future__ import annotations

import argparse


class SubcommandParser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


class CommandUsageError(ValueError):
    """Arguments that parse but do not make sense together (exit 2, reported like any error)."""

    exit_code = 2
    code = "usage"
