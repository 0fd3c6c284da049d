"""What the worker checks before it does anything (`arkvory worker`): its settings, the schema
the writer migrated, the storage the writer created, and its health port.

The worker never migrates and never creates storage (the writer does both): a schema older or
newer than this code, or storage that is missing or belongs to another database, stops it with
exit 78 and a message saying which. Exit statuses are those of `serve`: 2 settings, 69 database
unreachable, 78 refused; 1 when the health port cannot be bound.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

import asyncpg

from arkvory.shared import db
from arkvory.shared.cluster.replication import ReplicationWatch
from arkvory.shared.errors import PortUnavailable, StartupRefused
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, open_storage

# The worker serves no downloads and has its own port variable: the writer's and gateways'
# variables below are not its own, so it can read the same common.env as every process.
NOT_THE_WORKERS = (
    "ARKVORY_ROLE",
    "ARKVORY_PORT",
    "ARKVORY_GATEWAY_SLOTS",
    "ARKVORY_GATEWAY_SLOT",
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND",
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL",
    "ARKVORY_SHARE_MODE",  # (demand mode without the two above would refuse to start)
)


def worker_settings(environ: Mapping[str, str]) -> Settings:
    """The settings from the environment, without the variables that are not the worker's."""
    return Settings.from_env({k: v for k, v in environ.items() if k not in NOT_THE_WORKERS})


async def check_schema(conn: asyncpg.Connection) -> int:
    version = await db.schema_version(conn)
    if not version:
        raise StartupRefused(
            "the database has no Arkvory schema yet; the worker never migrates: start the writer first"
        )
    if version < db.CODE_SCHEMA_VERSION:
        raise StartupRefused(
            f"the database schema is version {version}, older than this worker's "
            f"{db.CODE_SCHEMA_VERSION}: start the upgraded writer first (it migrates), then the worker"
        )
    if version > db.CODE_SCHEMA_VERSION:
        raise StartupRefused(
            f"the database schema is version {version}, newer than this worker's "
            f"{db.CODE_SCHEMA_VERSION}: run the worker from the newer Arkvory version"
        )
    return version


async def check_storage(conn: asyncpg.Connection, settings: Settings) -> BlobStorage:
    """The storage the writer created, with the id the database records (as a gateway checks);
    with an object store, ARKVORY_DATA_DIR must be the writer's (the worker sweeps its upload
    files: shared/storage/s3.py)."""
    root = settings.data_dir
    if settings.object_store is None and not root.is_dir():
        raise StartupRefused(
            f"storage directory {root} (ARKVORY_DATA_DIR) does not exist; the worker never "
            "creates storage: start the writer first or fix the path"
        )
    recorded = await conn.fetchval("SELECT storage_id FROM arkvory_storage", timeout=db.QUERY_TIMEOUT_S)
    if recorded is None:
        raise StartupRefused(
            "the database has no storage id yet; the worker never creates storage: start the writer first"
        )
    return await open_storage(conn, settings, who="the worker")


def bind_health_port(settings: Settings) -> socket.socket:
    """Bind before anything else runs, so a port in use is refused before the worker waits
    for its lock."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.worker_port))
    except OSError as exc:
        sock.close()
        raise PortUnavailable(
            f"cannot listen on {settings.host}:{settings.worker_port} "
            f"(ARKVORY_HOST, ARKVORY_WORKER_PORT): {exc.strerror}"
        ) from None
    sock.set_inheritable(True)
    return sock


async def check_database(settings: Settings) -> tuple[int, BlobStorage]:
    """(schema version, storage) after the checks, on a connection closed again afterwards."""
    conn = await db.connect(settings.database_url)
    try:
        version = await check_schema(conn)
        storage = await check_storage(conn, settings)
        await ReplicationWatch().at_start(conn)  # warns once if a failover could lose renewals
    finally:
        await conn.close()
    return version, storage
