"""The host's local state, whichever backend holds the blobs: ARKVORY_DATA_DIR with the upload
sessions (`uploads/`) and one-shot upload temp files (`tmp/`), its free space, and the file helpers
both backends use (durable renames, out-of-space errors, work that must run to its end).
"""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import anyio
import anyio.lowlevel

from arkvory.shared.errors import InsufficientStorage

UPLOAD_PREFIX = "upload-"
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


class LocalState:
    """ARKVORY_DATA_DIR as upload files see it (writer/uploads/sessions.py, writer/uploads/publishing.py)."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.tmp = root / "tmp"
        self.uploads = root / "uploads"  # resumable upload sessions (writer only)

    def upload_session_file(self, session_id: uuid.UUID) -> str:
        """Where a resumable upload session keeps its bytes (writer/uploads/sessions.py)."""
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

    def create_local_dirs(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.uploads.mkdir(parents=True, exist_ok=True)
