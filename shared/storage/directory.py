"""The directory backend (`ARKVORY_STORAGE_URL=file:`): its identity (SPEC §3) and the
content-addressed blob layout in ARKVORY_DATA_DIR (upload files in use and their removal:
upload_files.py).

The writer creates the layout and the storage id on first start; a gateway only verifies them
and never creates anything, so a gateway pointed at the wrong directory stops instead of
serving an empty store.

Every blob is a local file: downloads send it zero-copy (`acquire_file`), publishing is a rename
or a link inside the digest's claim (`place_blob`), and nothing needs staging.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from arkvory.shared.errors import StartupRefused

from .interface import BlobNotFound, BlobStat, ListedBlob, Offload, StorageUnavailable
from .local import UPLOAD_PREFIX, LocalState, fsync_directory
from .open_blobs import OpenBlobs, close_in_background

ID_FILE = "arkvory-storage-id"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_HEX2 = re.compile(r"^[0-9a-f]{2}$")
READ_CHUNK = 1024 * 1024


class Storage(LocalState):
    kind = "file"
    location = "file:"

    def __init__(self, root: pathlib.Path) -> None:
        super().__init__(root)
        self.blobs = root / "blobs" / "sha256"
        self._blobs_prefix = str(self.blobs)
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

    # -- the storage interface (interface.py) ----------------------------------------------

    def acquire_file(self, sha256: str) -> int:
        return self.open_blobs.acquire(sha256)

    def release_file(self, sha256: str, fd: int) -> None:
        self.open_blobs.release(sha256, fd)

    def open_range(
        self, sha256: str, start: int, length: int, *, chunk_size: int = READ_CHUNK, if_match: str | None = None
    ) -> FileRange:
        """(`if_match` needs nothing here: a range is read through one descriptor.)"""
        return FileRange(self.blob_file(sha256), start, length, chunk_size)

    async def stat(self, sha256: str) -> BlobStat | None:
        try:
            found = os.stat(self.blob_file(sha256))
        except FileNotFoundError:
            return None
        return BlobStat(sha256, found.st_size, found.st_mtime, version=f"{found.st_dev}:{found.st_ino}")

    async def stage(self, source: str | os.PathLike, sha256: str, size: int) -> None:
        """Nothing to do: `publish` renames or links the file within the same filesystem."""

    async def publish(self, source: str | os.PathLike, sha256: str, size: int, *, link: bool = False) -> bool:
        return await asyncio.to_thread(self.place_blob, source, sha256, link=link)

    async def listing(self, *, offload: Offload | None = None) -> AsyncIterator[list[ListedBlob]]:
        """One page per `blobs/sha256/<ab>/` directory."""
        run = offload or asyncio.to_thread
        try:
            tops = sorted(e.name for e in os.scandir(self.blobs) if _HEX2.match(e.name))
        except FileNotFoundError:
            tops = []
        for top in tops:
            page = await run(self._files_under, top)
            if page:
                yield page

    def _files_under(self, top: str) -> list[ListedBlob]:
        found = []
        try:
            middles = [e for e in os.scandir(self.blobs / top) if _HEX2.match(e.name)]
        except (FileNotFoundError, NotADirectoryError):
            return found
        for middle in middles:
            try:
                entries = list(os.scandir(middle.path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                name = entry.name
                if not _SHA256.match(name) or name[:2] != top or name[2:4] != middle.name:
                    continue  # not ours: leave it for a person to look at
                try:
                    if entry.is_file(follow_symlinks=False):
                        stat = entry.stat(follow_symlinks=False)
                        found.append(ListedBlob(name, stat.st_size, stat.st_mtime))
                except FileNotFoundError:
                    continue
        found.sort(key=lambda blob: blob.sha256)
        return found

    async def delete(self, digests: list[str], *, offload: Offload | None = None) -> None:
        await (offload or asyncio.to_thread)(self._unlink_all, digests)

    def _unlink_all(self, digests: list[str]) -> None:
        for sha256 in digests:
            try:
                os.unlink(self.blob_file(sha256))
            except FileNotFoundError:
                pass

    async def check(self) -> None:
        if not self.blobs.is_dir():
            raise StorageUnavailable(f"storage directory {self.root} (ARKVORY_DATA_DIR) lacks {self.blobs}",
                                     setting="ARKVORY_DATA_DIR")

    # -- the directory's own ---------------------------------------------------------------------

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
        (writer/blobs/locks.py), so cleanup cannot unlink what we place here before
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

    async def read_storage_id(self) -> str | None:
        """The interface's identity: the id file (a few bytes on a local disk: read in place)."""
        return self.read_id_file()

    def create_layout(self, storage_id: str) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.create_local_dirs()
        if self.read_id_file() is None:
            # Write then rename, so a crash never leaves an empty id file behind.
            partial = self.root / f".{ID_FILE}.{os.getpid()}"
            partial.write_text(storage_id + "\n")
            os.replace(partial, self.root / ID_FILE)


class FileRange:
    """A range of a blob file as buffers (interface.BlobReader), read in a worker thread: for
    the callers that need buffers rather than a descriptor (a copy to another storage)."""

    def __init__(self, path: str, start: int, length: int, chunk_size: int) -> None:
        self._path = path
        self._offset = start
        self._left = length
        self._chunk = max(1, chunk_size)
        self._fd: int | None = None

    async def __aenter__(self) -> FileRange:
        try:
            self._fd = await asyncio.to_thread(os.open, self._path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BlobNotFound(f"no file {self._path}", setting="ARKVORY_DATA_DIR") from None
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> FileRange:
        return self

    async def __anext__(self) -> Any:
        if not self._left:
            raise StopAsyncIteration
        if self._fd is None:
            raise StorageUnavailable(f"the read of {self._path} is closed", setting="ARKVORY_DATA_DIR")
        data = await asyncio.to_thread(os.pread, self._fd, min(self._left, self._chunk), self._offset)
        if not data:
            raise StorageUnavailable(f"{self._path} is shorter than recorded", setting="ARKVORY_DATA_DIR")
        self._offset += len(data)
        self._left -= len(data)
        return data

    async def aclose(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


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
