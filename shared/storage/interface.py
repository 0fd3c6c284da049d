"""The storage interface: what every caller uses, whichever backend holds the blobs (SPEC §3, §11).

    BlobStorage                 directory.py `Storage` (file:), s3.py `ObjectStorage` (s3://)
    ├── the host's local state  root (ARKVORY_DATA_DIR), tmp/, uploads/, free space
    ├── reading                 acquire_file/release_file (a local file, sent zero-copy),
    │                           open_range (streamed buffers), stat
    ├── writing (the writer)    stage (outside any transaction), publish (under the digest claim)
    ├── maintenance             listing, delete (and each backend's own quarantine of a
    │                           corrupt blob)
    ├── reachability            check (the probe loop of shared/storage/health.py)
    └── identity                read_storage_id (what opening.py checks, what `admin init` prints)

Who calls what:
- the content path (shared/download/transfer.py) asks `acquire_file` first: a descriptor is sent
  with sendfile (the directory's file, or a checked file of an object store's read cache,
  read_cache.py), None means "stream it":
  shared/download/object_transfer.py reads `open_range` segments through the token buckets, or,
  for a fast stream to a plain-TCP client, asks the object store's `open_direct_range` (a
  `PipedReader`, s3_direct.py: the bytes arrive in a pipe and are spliced to the client; only
  `ObjectStorage` has it, and it answers None for a store reached over TLS or a proxy; the read
  cache's fill receives the same into its own buffers);
- uploads (writer/uploads/publishing.py for both kinds of upload) `stage` a verified file, then `publish` it
  inside the transaction that holds the digest's claim (writer/blobs/locks.py);
  no transaction is open across a call that reaches an object store (tests/test_code_rules.py);
- cleanup lists and deletes (writer/maintenance/cleanup.py), verify re-hashes through
  `open_range` and quarantines (writer/maintenance/verify.py);
- start-up opens the backend the settings name and checks its identity (shared/storage/__init__.py
  `open_storage`).

Errors are the backend's translation of what went wrong, one line for an operator that names the
setting to look at and never a secret; the HTTP edge turns them into 503s (`unavailable`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

# Runs a blocking function off the event loop: cleanup passes its own low-priority disk thread.
Offload = Callable[..., Awaitable[Any]]


# --- errors ------------------------------------------------------------------------------------


class StorageError(Exception):
    """One line for an operator; `setting` names the variable to look at, if one is to blame."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.setting = setting


class BlobNotFound(StorageError):
    """No blob (object) under that digest (key)."""


class StorageUnavailable(StorageError):
    """The store cannot be reached or failed (connection, timeout, 5xx, a cut stream): retry
    later."""


class StorageRefused(StorageError):
    """The store answers but will not serve us: credentials, bucket, or another installation's."""


# --- what a backend says -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlobStat:
    sha256: str
    size: int
    modified: float | None  # POSIX time: a file's mtime, an object's LastModified
    # The digest the store recorded beside the bytes (an object's x-amz-meta-sha256); None for a
    # file, whose name is all there is.
    stored_sha256: str | None = None
    # Tells one stored copy from its replacement: an object's ETag, a file's (device, inode).
    version: str | None = None


@dataclasses.dataclass(frozen=True)
class ListedBlob:
    sha256: str
    size: int
    modified: float  # POSIX time


class BlobReader(Protocol):
    """Bytes [start, start + length) of one blob as buffers (each supports memoryview), never
    ending short: fewer bytes than asked for raise StorageUnavailable. Use as

        async with storage.open_range(sha256, start, length) as reader:
            async for buffer in reader: ...

    Leaving the block early cuts the read (its connection is closed, not reused half-read)."""

    async def __aenter__(self) -> BlobReader: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    def __aiter__(self) -> BlobReader: ...

    async def __anext__(self) -> Any: ...

    async def aclose(self) -> None: ...


class PipedReader(Protocol):
    """Bytes of one blob arriving in a pipe (s3_direct.py `DirectRange`): `fill` puts at least one
    byte in `pipe_fd` (StorageError as for a BlobReader, never ending short); the reader moves
    them out with splice and says how many (`consumed`), or copies a few (`read`)."""

    buffered: int

    @property
    def pipe_fd(self) -> int: ...

    async def fill(self) -> None: ...

    def consumed(self, count: int) -> None: ...

    def read(self, most: int) -> bytes: ...

    async def aclose(self) -> None: ...


class BlobStorage(Protocol):
    kind: str  # "file" or "s3"
    location: str  # "file:" or "s3://BUCKET[/PREFIX]": recorded in the database, never a secret
    # The host's local state (ARKVORY_DATA_DIR): upload sessions and one-shot temp files (and,
    # with an object store, the read cache). With the directory backend the blobs live there too.
    root: pathlib.Path
    tmp: pathlib.Path
    uploads: pathlib.Path

    def upload_session_file(self, session_id: uuid.UUID) -> str: ...

    def free_bytes(self) -> int: ...

    def require_room(self, incoming: int, reserve: int) -> None: ...

    # -- reading -----------------------------------------------------------------------------

    def acquire_file(self, sha256: str) -> int | None:
        """A descriptor of a local copy to send zero-copy (give it back with `release_file`),
        or None: stream it with `open_range`. FileNotFoundError when a local blob is missing."""
        ...

    def release_file(self, sha256: str, fd: int) -> None: ...

    def open_range(
        self, sha256: str, start: int, length: int, *, chunk_size: int = ..., if_match: str | None = None
    ) -> BlobReader:
        """`if_match`: a `BlobStat.version` the bytes must come from (an object's ETag), so that
        the segments of one download never join two stored copies."""
        ...

    async def stat(self, sha256: str) -> BlobStat | None:
        """None when no blob is stored under the digest."""
        ...

    # -- writing (the writer) --------------------------------------------------------------------

    async def stage(self, source: str | os.PathLike, sha256: str, size: int) -> None:
        """Before the publishing transaction: bring a verified file's bytes to the store (the
        long part of publishing to an object store; nothing for a directory). Keeps an existing
        blob only after checking its size and recorded digest."""
        ...

    async def publish(self, source: str | os.PathLike, sha256: str, size: int, *, link: bool = False) -> bool:
        """Inside the transaction that holds the digest's claim, after `stage` and the check that
        no removal touched the digest since (writer/blobs/locks.py): make sure the
        verified bytes are stored under the digest, without calling an object store (a directory
        links the file; an object store has it from `stage`); True if another copy was replaced
        (every process drops what it kept of the old one)."""
        ...

    # -- maintenance ------------------------------------------------------------------------------

    def listing(self, *, offload: Offload | None = None) -> AsyncIterator[list[ListedBlob]]:
        """Every stored blob, a page at a time (digest order within a page)."""
        ...

    async def delete(self, digests: list[str], *, offload: Offload | None = None) -> None:
        """Remove these blobs (absent ones are fine). The caller marked their removals first
        and holds no transaction or claim meanwhile (writer/blobs/locks.py)."""
        ...

    async def check(self) -> None:
        """Reach the storage now; StorageUnavailable or StorageRefused when it cannot serve."""
        ...

    # -- identity (SPEC §3, §11) ---------------------------------------------------------------------

    async def read_storage_id(self) -> str | None:
        """The storage id the storage itself records (the directory's id file, the store's
        identity object), None when it has none yet; StorageError when it cannot be read."""
        ...
