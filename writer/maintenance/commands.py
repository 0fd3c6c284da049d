"""`arkvory` subcommands of this package (registered by shared/cli.py)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction, admin: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the top-level `commands` and to `arkvory admin`."""
