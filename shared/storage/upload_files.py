"""Upload files in use, and removing the abandoned ones: resumable sessions' `uploads/<id>` and
one-shot uploads' `tmp/upload-*` (SPEC §6: abandoned sessions expire; nothing partial stays).

Who removes them: the writer (at its start, on a session found expired, on DELETE, a sweep per
new session) and the worker's cleanup task, another process that sees nothing of the writer's
memory. What must never happen is a removal under the writer: of a file it receives into or
completes from, or of the row a repeated `complete` replays from. Timestamps cannot tell (a slow
body writes once per batch of 2 or 4 MiB, writer/uploads/store.py; a large part may outlast its
session's expiry), so the rule is a lock the kernel keeps across processes, and a database
statement that re-checks for itself:

- The writer holds a shared `flock` on an upload file for as long as it uses it: a part or a
  whole body from before its first write until its descriptor is closed, `complete` from before
  it reads the file until the session is published and its file unlinked (`open_in_use`), a
  one-shot upload from creating its temp file until it is published or removed (`hold_in_use`).
  The lock goes with the descriptor, so a writer that dies leaves nothing locked.
- Every removal first takes the file's exclusive `flock` without waiting, leaves the file alone
  when it cannot (in use: the next sweep looks again), and unlinks it while it holds the lock. A
  writer that opened the file meanwhile gets its shared lock only after that, sees that the path
  no longer names its file, and answers that the upload is gone.
- A session's row is deleted under its file's lock, rows first, then the file (a crash in
  between leaves a file without a row, which the orphan pass removes once old enough). A sweep's
  DELETE re-checks `expires_at < now()` in the same statement: a session that a recorded part or
  a `complete` pushed forward after the sweep's look (the latter waiting for the publication's
  row lock and then re-evaluated) is no longer expired and stays.

`flock` holds among the processes of one host; with directory storage they all run on one
(SPEC §1), and with an object store the upload files stay in the writer's ARKVORY_DATA_DIR, which
the worker shares by running beside it (shared/storage/s3.py `verify_object_storage`).
Unlinks, and the last close of an unlinked file (which frees its blocks: seconds for a
preallocated multi-GiB session), run in worker threads, never on an event loop.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable

import asyncpg

from arkvory.shared.errors import Busy

from .local import UPLOAD_PREFIX, LocalState, to_the_end

log = logging.getLogger("arkvory.storage")

QUERY_TIMEOUT_S = 10
SWEEP_BATCH = 100
# A removal holds a file for one statement and an unlink: a writer waits that long for it.
IN_USE_WAIT_S = QUERY_TIMEOUT_S + 5
_IN_USE_POLL_S = 0.02


# -- the writer: files in use ------------------------------------------------------------------


def hold_in_use(fd: int) -> None:
    """Mark a file this process has just created (no one else can hold it yet) as in use."""
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)


async def open_in_use(path: str, flags: int) -> int:
    """Open an existing upload file and hold it in use until the descriptor is closed.

    FileNotFoundError when it is gone, also when a removal took it while we were opening it;
    Busy when a removal holds it for longer than IN_USE_WAIT_S."""
    fd = os.open(path, flags)
    try:
        deadline = time.monotonic() + IN_USE_WAIT_S
        while not _try_flock(fd, fcntl.LOCK_SH):
            if time.monotonic() > deadline:
                raise Busy("a sweep is looking at this upload's file; retry in a moment", retry_after=2)
            await asyncio.sleep(_IN_USE_POLL_S)
        if not _still_named(fd, path):
            raise FileNotFoundError(errno.ENOENT, "removed while being opened", path)
    except BaseException:
        close_soon(fd)  # it may be the last reference to a removed file
        raise
    return fd


def close_soon(fd: int) -> None:
    """Close in a worker thread, not waited for: the last close of an unlinked file frees its
    blocks. The descriptor's number stays taken until then, so nothing reuses it meanwhile."""
    asyncio.get_running_loop().run_in_executor(None, os.close, fd)


async def remove_own_file(path: str | os.PathLike, fd: int | None = None) -> None:
    """Unlink a file this process is done with, then close its descriptor if given, in a worker
    thread and to the end (a cancel waits for it)."""
    await to_the_end(asyncio.to_thread(_unlink_then_close, path, fd))


def _unlink_then_close(path: str | os.PathLike, fd: int | None) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _try_flock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _still_named(fd: int, path: str) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


# -- removals: take each file exclusively, or leave it -------------------------------------------


class _Held:
    """Upload files one removal holds exclusively; taken and let go in worker threads."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}
        self.in_use: set[str] = set()

    def take(self, paths: Iterable[str]) -> None:
        """Hold each file nobody uses; a missing one is neither held nor in use (nothing to guard)."""
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            except OSError:
                self.in_use.add(path)  # not a plain file of ours: leave it for a person
                continue
            if _try_flock(fd, fcntl.LOCK_EX):
                self.fds[path] = fd
            else:
                os.close(fd)
                self.in_use.add(path)

    def remove(self, paths: Iterable[str]) -> int:
        """Unlink those of `paths` held here, then let every held file go; returns how many."""
        removed = 0
        try:
            for path in paths:
                if path in self.fds:
                    try:
                        os.unlink(path)
                        removed += 1
                    except FileNotFoundError:
                        pass
        finally:
            while self.fds:
                os.close(self.fds.popitem()[1])
        return removed


def _remove_unused(paths: Iterable[str], limit: int | None = None) -> int:
    """Worker thread: unlink each of `paths` that nobody uses, one at a time, until `limit` are
    gone; returns how many."""
    removed = 0
    for path in paths:
        if limit is not None and removed >= limit:
            break
        held = _Held()
        held.take([path])
        removed += held.remove([path])
    return removed


# -- one-shot temp files ---------------------------------------------------------------------------


def remove_stale_uploads(storage: LocalState, older_than_s: float, limit: int | None = None) -> int:
    """Worker thread: remove upload temp files older than `older_than_s` that no writer holds (a
    crash left them, or a publish's temporary link: Storage.place_blob), at most `limit` of
    them; returns how many.

    A file being received is held by its writer however long ago it was written (module
    docstring); the age only spares a file created a moment ago, before its lock was taken."""
    removed = _remove_unused(_stale_uploads(storage, older_than_s), limit)
    if removed:
        log.info("removed %d stale upload temp file(s) from %s", removed, storage.tmp)
    return removed


def any_stale_upload(storage: LocalState, older_than_s: float) -> bool:
    """Worker thread: whether an upload temp file is older than `older_than_s` (in use or not)."""
    return bool(_stale_uploads(storage, older_than_s))


def _stale_uploads(storage: LocalState, older_than_s: float) -> list[str]:
    cutoff = time.time() - older_than_s
    try:
        entries = list(os.scandir(storage.tmp))
    except FileNotFoundError:
        return []
    stale = []
    for entry in entries:
        if not entry.name.startswith(UPLOAD_PREFIX) or not entry.is_file(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                stale.append(entry.path)
        except FileNotFoundError:
            continue
    return stale


# -- resumable sessions ----------------------------------------------------------------------------

_DELETE_SESSIONS = """
DELETE FROM arkvory_uploads
WHERE id = ANY($1::uuid[]) AND (NOT $2 OR expires_at < now()) AND (NOT $3 OR status = 'open')
RETURNING id
"""


async def remove_upload_sessions(
    conn: asyncpg.Connection, storage: LocalState, ids: list[uuid.UUID], *, only_expired: bool = True,
    only_open: bool = False,
) -> list[uuid.UUID]:
    """Remove these sessions, rows and files, except those in use (their file is held) and, with
    `only_expired`, those no longer expired when their row is deleted, with `only_open` those
    completed meanwhile (a repeated `complete` replays from the row); returns the ids removed."""
    paths = {session_id: storage.upload_session_file(session_id) for session_id in ids}
    held = _Held()
    removed: list[uuid.UUID] = []
    try:
        await to_the_end(asyncio.to_thread(held.take, paths.values()))
        free = [session_id for session_id in ids if paths[session_id] not in held.in_use]
        if free:
            rows = await conn.fetch(
                _DELETE_SESSIONS, free, only_expired, only_open, timeout=QUERY_TIMEOUT_S
            )
            removed = [row["id"] for row in rows]
    finally:
        await to_the_end(asyncio.to_thread(held.remove, [paths[session_id] for session_id in removed]))
    return removed


_EXPIRED_PAGE = """
SELECT id, expires_at FROM arkvory_uploads
WHERE expires_at < now() AND ($1::timestamptz IS NULL OR (expires_at, id) > ($1, $2::uuid))
ORDER BY expires_at, id LIMIT $3
"""


async def sweep_upload_sessions(
    conn: asyncpg.Connection,
    storage: LocalState,
    *,
    orphans_older_than_s: float | None = None,
    skip: Callable[[uuid.UUID], bool] | None = None,
    removed: Callable[[uuid.UUID], None] | None = None,
    limit: int | None = None,
) -> int:
    """Remove upload sessions past their expiry, rows and files, but none in use; returns how
    many. Run at the writer's start (before it serves), by the writer's session routes, and by
    the worker's cleanup. With `orphans_older_than_s`, session files without a row (a crash
    before the create committed, a repository deleted with its sessions) go too once that old,
    so a session being created right now is never touched. `skip` spares sessions this process
    knows busy (one query less); `removed` hears of each session removed; `limit` (a task's
    budget) bounds how many sessions and orphan files go in all."""
    count = 0
    after: tuple = (None, None)
    while limit is None or count < limit:
        page = SWEEP_BATCH if limit is None else min(SWEEP_BATCH, limit - count)
        rows = await conn.fetch(_EXPIRED_PAGE, *after, page, timeout=QUERY_TIMEOUT_S)
        if not rows:
            break
        after = (rows[-1]["expires_at"], rows[-1]["id"])  # in use ones stay behind us
        ids = [r["id"] for r in rows if skip is None or not skip(r["id"])]
        gone = await remove_upload_sessions(conn, storage, ids) if ids else []
        for session_id in gone:
            if removed is not None:
                removed(session_id)
        count += len(gone)
        if len(rows) < page:
            break
    if orphans_older_than_s is not None and (limit is None or count < limit):
        left = None if limit is None else limit - count
        count += await _remove_orphan_session_files(conn, storage, orphans_older_than_s, left)
    if count:
        log.info("removed %d expired or orphaned upload session(s)", count)
    return count


async def _remove_orphan_session_files(
    conn: asyncpg.Connection, storage: LocalState, older_than_s: float, limit: int | None
) -> int:
    candidates = await asyncio.to_thread(_old_session_files, storage, older_than_s)
    if not candidates:
        return 0
    known = {
        r["id"] for r in await conn.fetch(
            "SELECT id FROM arkvory_uploads WHERE id = ANY($1::uuid[])", list(candidates), timeout=QUERY_TIMEOUT_S
        )
    }
    orphans = [path for session_id, path in candidates.items() if session_id not in known]
    return await to_the_end(asyncio.to_thread(_remove_unused, orphans, limit))


def _old_session_files(storage: LocalState, older_than_s: float) -> dict[uuid.UUID, str]:
    cutoff = time.time() - older_than_s
    try:
        entries = list(os.scandir(storage.uploads))
    except FileNotFoundError:
        return {}
    found: dict[uuid.UUID, str] = {}
    for entry in entries:
        try:
            session_id = uuid.UUID(entry.name)
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                found[session_id] = entry.path
        except (ValueError, FileNotFoundError):
            continue
    return found


async def sweep_at_start(conn: asyncpg.Connection, storage: LocalState, older_than_s: float) -> None:
    """Writer start-up, under the writer lock and before the port is open: what a crash left
    (temp files and orphan session files older than `older_than_s`) and expired sessions."""
    await to_the_end(asyncio.to_thread(remove_stale_uploads, storage, older_than_s))
    await sweep_upload_sessions(conn, storage, orphans_older_than_s=older_than_s)
