"""`arkvory` subcommands of this package (registered by shared/cli/main.py): `arkvory worker`."""

from __future__ import annotations

import argparse
import os
import sys

EXIT_USAGE = 2


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the task worker; the same settings rules and exit statuses as `serve`."""
    from arkvory.shared import logs
    from arkvory.shared.errors import StartupError
    from arkvory.shared.auth.identity import KeyRing, KeysFileError
    from arkvory.shared.settings import SettingsError, format_problems

    from .startup import worker_settings

    try:
        settings = worker_settings(os.environ)
    except SettingsError as exc:
        print(format_problems(exc), file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_format, settings.log_level, settings.access_log)
    try:
        keys = KeyRing.from_file(settings.keys_file) if settings.keys_file else KeyRing.empty()
    except KeysFileError as exc:
        print(f"arkvory: invalid setting {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def main() -> int:
        import asyncpg

        from arkvory.shared import db
        from arkvory.shared.errors import DatabaseUnavailable

        from .process import WorkerProcess
        from .startup import bind_health_port, check_database

        try:
            version, storage = await check_database(settings)
            pool = await db.create_pool(settings)
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            raise DatabaseUnavailable(
                f"the database failed during start-up: {exc.__class__.__name__}: {exc}"
            ) from exc
        try:
            sock = bind_health_port(settings)
            process = WorkerProcess(settings, keys, pool, storage, version)
            return await process.run(sock)
        finally:
            await _close_pool(pool)

    try:
        import uvloop

        return uvloop.run(main())
    except StartupError as exc:
        print(f"arkvory: {exc}", file=sys.stderr)
        return exc.exit_status


async def _close_pool(pool) -> None:
    """Close the pool, but never wait long on a database that may be gone."""
    import asyncio

    import asyncpg

    try:
        await asyncio.wait_for(pool.close(), 5.0)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        pool.terminate()


def register(commands: argparse._SubParsersAction, admin: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the top-level `commands` and to `arkvory admin`."""
    worker = commands.add_parser(
        "worker",
        help="run the background tasks (cleanup, verify); one active worker per database, others stand by",
    )
    worker.set_defaults(func=cmd_worker)
