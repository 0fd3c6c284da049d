"""The storage directory: its identity (SPEC §3) and the content-addressed blob layout
(upload files in use and their removal: upload_files.py).

The writer creates the layout and the storage id on first start; a gateway only verifies them
and never creates anything, so a gateway pointed at the wrong directory stops instead of
serving an empty store.
"""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import re
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import anyio
import anyio.lowlevel
import asyncpg

from arkvory.shared.errors import InsufficientStorage, StartupRefused

from .open_blobs import OpenBlobs, close_in_background

ID_FILE = "arkvory-storage-id"
UPLOAD_PREFIX = "upload-"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# errno values that mean "no room": the disk, or the user's or project's quota.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


T = TypeVar("T")


async def to_the_end(work: Awaitable[T]) -> T:
    """Await `work` to its end even when the caller is cancelled meanwhile, then raise the
    cancellation.

    A file operation handed to a thread cannot be stopped: a caller that holds the locks
    guarding those files (digest claims, file locks) must not let them go, by unwinding, before
    the thread is done. Shielded from anyio's cancel scopes (no re-delivery while we wait) and
    from a plain `Task.cancel()` alike."""
    future = asyncio.ensure_future(work)
    cancelled = False
    with anyio.CancelScope(shield=True):
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                cancelled = cancelled or not future.done()
            except Exception:
                pass  # the future's own error, raised below
    if cancelled:
        if not future.cancelled():
            future.exception()  # retrieved: the cancellation is what the caller must see
        raise asyncio.CancelledError()
    # Then re-check: a cancel that anyio held back while we were shielded is raised here, not
    # at whatever the caller awaits next.
    await anyio.lowlevel.checkpoint_if_cancelled()
    return future.result()


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in `path` durable (the file's own fsync does not)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_out_of_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def out_of_space(exc: OSError | None = None) -> InsufficientStorage:
    """The one 507 every writing path raises, whether the disk said ENOSPC or our reserve did."""
    reason = "the storage directory is full" if exc is not None else (
        "the upload would leave less free space than ARKVORY_MIN_FREE_BYTES"
    )
    return InsufficientStorage(f"{reason}; nothing was kept: free space or retry later")


class Storage:
    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self._blobs_prefix = str(self.blobs)
        self.tmp = root / "tmp"
        self.uploads = root / "uploads"  # resumable upload sessions (writer only)
        # Descriptors the download path reuses; closed off the event loop (open_blobs.py).
        self.open_blobs = OpenBlobs(self.blob_file, close=close_in_background)

    def blob_path(self, sha256: str) -> pathlib.Path:
        return pathlib.Path(self.blob_file(sha256))

    def blob_file(self, sha256: str) -> str:
        """The blob's path as a string: the download path opens one per request, and building
        a `pathlib.Path` costs as much as the open itself."""
        if not _SHA256.match(sha256):
            raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
        return f"{self._blobs_prefix}/{sha256[:2]}/{sha256[2:4]}/{sha256}"

    def upload_session_file(self, session_id: uuid.UUID) -> str:
        """Where a resumable upload session keeps its bytes (writer/upload_sessions.py)."""
        return os.path.join(self.uploads, str(session_id))

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still use in the storage directory."""
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def require_room(self, incoming: int, reserve: int) -> None:
        """Refuse (507) before writing `incoming` more bytes would leave under `reserve` free.

        Checked before an upload starts (from its declared size) and again per written batch,
        so a disk that fills meanwhile is noticed within one batch, not at ENOSPC."""
        if self.free_bytes() - incoming < reserve:
            raise out_of_space()

    def place_blob(self, source: str | os.PathLike, sha256: str, *, link: bool = False) -> bool:
        """Move (or hard-link) a complete, fsynced file into the store under its digest; True
        if another file was under the digest before (it is replaced: see below).

        Durable before it returns: a new `ab/` or `ab/cd/` directory is fsynced in its parent
        (a crash must not lose the directory entry the metadata row will point through), then
        the blob's own directory. With `link`, the source stays where it is (a retried publish
        can link it again).

        A file already under the digest is replaced, never kept: nobody has checked it since it
        was placed (it may have rotted on disk), while `source` holds the bytes the caller just
        hashed. Verifying the old file instead would re-read a blob of up to many GiB on every
        duplicate upload; a rename over it costs one directory entry, is atomic (a reader finds
        the old file or the new one, never none) and leaves descriptors already open on the
        old file with their bytes. The caller tells every process to drop its cached
        descriptor of the digest when this returns True.

        Callers publish inside a transaction that holds the digest's claim
        (writer/maintenance/blob_locks.py), so cleanup cannot unlink what we place here before
        the row that refers to it is committed; identical uploads share the claim and may
        replace each other's file, with the same verified bytes."""
        final = self.blob_path(sha256)
        self._make_durable_dirs(final.parent)
        if link:
            replaced = self._link_over(source, final)
        else:
            replaced = final.exists()
            os.replace(source, final)
        fsync_directory(final.parent)
        return replaced

    def _link_over(self, source: str | os.PathLike, final: pathlib.Path) -> bool:
        """Hard-link `source` as `final`, atomically replacing another file there; True if so."""
        try:
            os.link(source, final)
            return False
        except FileExistsError:
            if os.path.samefile(source, final):
                return False  # a retried publish: our link is already there
        # Linked under a temporary name, then renamed over the old file: a crash in between
        # leaves an extra link in tmp/, which the upload temp-file sweep removes.
        temporary = self.tmp / f"{UPLOAD_PREFIX}link-{uuid.uuid4().hex}"
        os.link(source, temporary)
        try:
            os.replace(temporary, final)
        finally:
            # rename() of two links to one file does nothing and leaves `temporary` in place.
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
        return True

    def _make_durable_dirs(self, directory: pathlib.Path) -> None:
        missing = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            try:
                new.mkdir()
            except FileExistsError:
                pass  # made meanwhile by a concurrent publish, which fsyncs its parent too
            fsync_directory(new.parent)

    def read_id_file(self) -> str | None:
        try:
            return (self.root / ID_FILE).read_text().strip()
        except FileNotFoundError:
            return None

    def create_layout(self, storage_id: str) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.uploads.mkdir(parents=True, exist_ok=True)
        if self.read_id_file() is None:
            # Write then rename, so a crash never leaves an empty id file behind.
            partial = self.root / f".{ID_FILE}.{os.getpid()}"
            partial.write_text(storage_id + "\n")
            os.replace(partial, self.root / ID_FILE)


async def _database_storage_id(conn: asyncpg.Connection) -> str | None:
    value = await conn.fetchval("SELECT storage_id FROM arkvory_storage", timeout=10)
    return None if value is None else str(value)


async def prepare_storage(conn: asyncpg.Connection, root: pathlib.Path) -> Storage:
    """Writer: create the layout and id on first start, otherwise insist that they match.
    (What uploads left behind is swept next: shared/storage/upload_files.py `sweep_at_start`.)"""
    storage = Storage(root)
    recorded = await _database_storage_id(conn)
    on_disk = storage.read_id_file() if root.is_dir() else None
    if recorded is None and on_disk is None:
        storage_id = str(uuid.uuid4())
        root.mkdir(parents=True, exist_ok=True)
        storage.create_layout(storage_id)
        await conn.execute("INSERT INTO arkvory_storage (storage_id) VALUES ($1)", uuid.UUID(storage_id))
        return storage
    _require_match(root, recorded, on_disk)
    storage.create_layout(on_disk)  # re-creates missing sub-directories only
    return storage


async def verify_storage(conn: asyncpg.Connection, root: pathlib.Path) -> Storage:
    """Gateway: the directory, its id file and the database's id must all exist and agree."""
    if not root.is_dir():
        raise StartupRefused(
            f"storage directory {root} (ARKVORY_DATA_DIR) does not exist; "
            "a gateway never creates storage: start the writer first or fix the path"
        )
    storage = Storage(root)
    recorded = await _database_storage_id(conn)
    if recorded is None:
        raise StartupRefused(
            "the database has no storage id yet; a gateway never creates storage: "
            "start the writer first"
        )
    _require_match(root, recorded, storage.read_id_file())
    if not storage.blobs.is_dir():
        raise StartupRefused(f"storage directory {root} lacks {storage.blobs}")
    return storage


def _require_match(root: pathlib.Path, recorded: str | None, on_disk: str | None) -> None:
    if on_disk is None:
        raise StartupRefused(
            f"storage directory {root} (ARKVORY_DATA_DIR) has no {ID_FILE} file, but the "
            f"database expects storage id {recorded}: wrong directory or missing storage"
        )
    if recorded is None:
        raise StartupRefused(
            f"storage directory {root} has storage id {on_disk}, but the database has none: "
            "this directory belongs to another database"
        )
    if recorded != on_disk:
        raise StartupRefused(
            f"storage id mismatch: directory {root} has {on_disk}, the database expects "
            f"{recorded}: this directory belongs to another installation"
        )
