"""Opening the storage the settings name, with the identity checks of SPEC §3 and §11.

The database records the storage id and its location (`file:` or `s3://BUCKET[/PREFIX]`); a process
configured with another ARKVORY_STORAGE_URL refuses to start and says which, before it looks at
any blob. Then the backend checks the id itself: the writer creates it on first start, every
other process only checks it (directory.py, s3.py).
"""

from __future__ import annotations

import asyncpg

from arkvory.shared.errors import StartupRefused
from arkvory.shared.settings import Settings

from .directory import prepare_storage, verify_storage
from .interface import BlobStorage

QUERY_TIMEOUT_S = 10


async def recorded_storage(conn: asyncpg.Connection) -> tuple[str | None, str | None]:
    """(storage id, location) as the database records them; (None, None) before the first start."""
    # to_jsonb: a schema from before the location column reads as file:, without failing.
    row = await conn.fetchrow(
        "SELECT storage_id::text AS storage_id, coalesce(to_jsonb(s) ->> 'location', 'file:') AS location"
        " FROM arkvory_storage s",
        timeout=QUERY_TIMEOUT_S,
    )
    return (None, None) if row is None else (row["storage_id"], row["location"])


def _require_location(recorded: str | None, configured: str) -> None:
    if recorded is not None and recorded != configured:
        raise StartupRefused(
            f"ARKVORY_STORAGE_URL: the database records its blobs at {recorded}, but this process has"
            f" {configured}: set ARKVORY_STORAGE_URL={recorded} (arkvory admin migrate-storage moves"
            " them)"
        )


async def open_storage(conn: asyncpg.Connection, settings: Settings, *, who: str) -> BlobStorage:
    """The storage for `who` ("the writer" creates it on first start; "a gateway", "the worker"
    and the offline tools only check it)."""
    storage_id, location = await recorded_storage(conn)
    _require_location(location, settings.storage_url)
    creates = who == "the writer"
    if settings.object_store is None:
        if creates:
            return await prepare_storage(conn, settings.data_dir)
        return await verify_storage(conn, settings.data_dir)
    from .s3 import prepare_object_storage, verify_object_storage  # obstore, only when used

    if creates:
        return await prepare_object_storage(conn, settings.object_store, settings.data_dir, storage_id)
    return await verify_object_storage(
        settings.object_store, settings.data_dir, storage_id, who, beside_writer=who == "the worker",
    )
