"""Moving a corrupt blob out of the store, keeping it as evidence, and telling every process.

A blob whose bytes are not its digest must never be served as if it were good. It is moved to
`<data>/quarantine/sha256/<digest>.<UTC time>` (the same filesystem: a rename, no copy), so the
content path finds no file and answers 503 `content_unavailable`, and a re-upload of the right
bytes places a good file under the digest again. Cached descriptors are the one place a moved file
lives on: `notify_moved` makes every process drop its own (shared/storage/open_blobs.py).

A good file can take the bad one's place between hashing and moving (a re-upload of the same
content replaces or links it). The move therefore compares the moved file with the one that was
hashed (device and inode) and, if it is another, links it back without replacing anything.
"""

from __future__ import annotations

import datetime
import os
import pathlib

import asyncpg

from arkvory.shared.storage import Storage, fsync_directory
from arkvory.shared.storage.open_blobs import CHANNEL

QUERY_TIMEOUT_S = 10


def quarantine_dir(storage: Storage) -> pathlib.Path:
    return storage.root / "quarantine" / "sha256"


def move_to_quarantine(storage: Storage, sha256: str, hashed: os.stat_result) -> pathlib.Path | None:
    """Move the blob file that was hashed (identified by `hashed`) out of the store; returns
    where it went, or None when it was no longer there (gone, or replaced by another file)."""
    target_dir = quarantine_dir(storage)
    target_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = target_dir / f"{sha256}.{stamp}"
    source = storage.blob_file(sha256)
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return None
    moved = os.stat(target)
    if (moved.st_dev, moved.st_ino) != (hashed.st_dev, hashed.st_ino):
        # Not the file we hashed: a re-upload put a good one there meanwhile. Put it back
        # unless yet another file arrived (link never replaces), and keep nothing of it.
        try:
            os.link(target, source)
        except FileExistsError:
            pass
        os.unlink(target)
        return None
    fsync_directory(target_dir)
    fsync_directory(os.path.dirname(source))
    return target


async def notify_moved(conn: asyncpg.Connection, sha256: str) -> None:
    """Every process drops its cached descriptor of `sha256` (delivered at commit when `conn`
    is in a transaction)."""
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, sha256, timeout=QUERY_TIMEOUT_S)
