"""Upload sessions on disk and in this process: the preallocated session file, the hash of
its recorded prefix, who is writing which part, and the sweep of expired sessions.

A session's bytes live in one file, `<data>/uploads/<id>`, preallocated at creation (its
space is reserved then, so a full disk is a 507 at creation, not in the middle of an upload);
part `i` covers `[i * partSize, min(size, (i + 1) * partSize))`. One process (the writer,
under its lock) writes session files, so the in-process registry is the whole truth about
which parts are being received and which completions are running in this process; the
worker's sweep, another process, sees the same through the lock the writer holds on a session
file it uses (shared/storage/upload_files.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import threading
import uuid
from typing import Any

import asyncpg

from arkvory.shared.db import pooled
from arkvory.shared.errors import Conflict
from arkvory.shared.storage import BlobStorage, StorageError, fsync_directory, is_out_of_space, out_of_space
from arkvory.shared.storage.upload_files import remove_upload_sessions, sweep_upload_sessions


log = logging.getLogger("arkvory.uploads")

MiB = 1024 * 1024
MIN_PART = 1 * MiB
MAX_PART = 64 * MiB
DEFAULT_PART = 8 * MiB
MAX_PARTS = 10_000  # bounds a session's rows and its JSON; with 64 MiB parts: 625 GiB
HASH_READ = 8 * MiB
PUBLISH_READ = 8 * MiB  # bytes read, hashed and sent to a publication at a time
OPEN_WAIT_S = 2.0  # how long a part fed as it arrives waits for its publication to open
SEND_WAIT_S = 30.0  # ... and for the store to take a batch (obstore waits while its parts are in flight)


class PrefixHash:
    """The whole file's SHA-256 over its first parts, advanced in a worker thread as parts are
    recorded, so `complete` hashes only what is left (usually nothing) instead of the whole
    file after the last part. Recorded parts never change on disk, so hashing them early is
    the same as hashing them at the end. In memory only: after a restart `complete` hashes
    from the start.

    On an object store, for a session that declared its SHA-256, the same pass sends each
    hashed piece to a `publication` (shared/storage/s3_client.py `Publication`): a multipart
    upload to the blob's key, fed while the upload still arrives, which `complete` makes
    visible only after the whole digest is checked (uploads.py `_publish`). The digest then
    covers exactly the bytes sent. A store that fails drops the publication (`complete`
    publishes from the file as before).

    The part the prefix needs next, when it arrives in this process, is fed from the receiving
    batches instead of read back (`InlineFeed`); out of order parts, and parts recorded before a
    restart, are read back from the file as above."""

    def __init__(self, storage: BlobStorage | None = None, sha256: str | None = None) -> None:
        self.digest = hashlib.sha256()
        self.next_index = 0
        self.recorded: set[int] = set()
        self.task: asyncio.Task | None = None
        # Where to publish while hashing: (storage, declared sha256) until opened, then the
        # publication; None when there is none (or no more).
        self.publish_to: tuple[Any, str] | None = (storage, sha256) if storage is not None and sha256 else None
        self.publication: Any = None
        self.feeding: InlineFeed | None = None  # the part fed from a request right now

    def drop_publication(self) -> None:
        publication, self.publication, self.publish_to = self.publication, None, None
        if publication is not None:
            publication.abandon()

    def whole_publication(self, sha256: str, size: int) -> Any:
        """The publication, taken, if it holds all `size` bytes of the blob `sha256`; else None."""
        publication = self.publication
        if publication is None or publication.sha256 != sha256 or publication.sent != size or publication.abandoned:
            return None
        self.publication = self.publish_to = None
        return publication


class ActiveUploads:
    """Parts being received, completions running and prefix hashes, per session (this process only)."""

    MAX_PREFIXES = 64  # a bound on memory; a session without one is hashed at complete
    # Publications fed at once (each holds up to ~5 × 16 MiB in obstore's buffers); a session
    # beyond them publishes at complete.
    MAX_PUBLICATIONS = 4

    def __init__(self) -> None:
        self.parts: dict[uuid.UUID, set[int]] = {}
        self.completing: dict[uuid.UUID, asyncio.Task] = {}
        self.prefixes: dict[uuid.UUID, PrefixHash] = {}

    def _prefix_for(self, session: asyncpg.Record, index: int, storage: BlobStorage | None) -> PrefixHash | None:
        prefix = self.prefixes.get(session["id"])
        if prefix is None:
            if index != 0 or len(self.prefixes) >= self.MAX_PREFIXES:
                return None  # a prefix starts with part 0 received in this process
            # Only an object store publishes early (the directory backend links the file).
            publishing = sum(1 for p in self.prefixes.values() if p.publish_to is not None)
            early = hasattr(storage, "open_publication") and publishing < self.MAX_PUBLICATIONS
            prefix = self.prefixes[session["id"]] = PrefixHash(storage if early else None, session["sha256"])
        return prefix

    def part_recorded(self, session: asyncpg.Record, index: int, path: str, storage: BlobStorage | None = None) -> None:
        prefix = self._prefix_for(session, index, storage)
        if prefix is None:
            return
        prefix.recorded.add(index)
        if prefix.task is None or prefix.task.done():
            prefix.task = asyncio.ensure_future(_advance(prefix, session, path))

    async def start_inline(
        self, session: asyncpg.Record, index: int, path: str, storage: BlobStorage | None = None
    ) -> InlineFeed | None:
        """A feed for part `index` while it arrives, if the prefix publishes, it is the part the
        prefix needs next and nothing else advances the prefix now; else None (the part is read back once
        recorded, as any other). The caller finishes the feed once the part is recorded, or
        abandons it."""
        prefix = self._prefix_for(session, index, storage)
        if prefix is None or prefix.next_index != index or prefix.feeding is not None:
            return None
        if prefix.publish_to is None:
            # Nothing to publish (a directory, or a publication given up): the part's whole-file
            # hash is left to `_advance`, which reads it back in a thread of its own after the
            # part is recorded, on the other core; fed here it would be a second SHA-256 in the
            # receiving thread, and a directory's upload took ~12 % longer (bench/upload.py).
            return None
        if prefix.task is not None and not prefix.task.done():
            return None
        feed = prefix.feeding = InlineFeed(prefix, session, index, path)
        if prefix.publication is None and prefix.publish_to is not None and index == 0:
            await _open_publication_soon(prefix, session)
        return feed

    def forget(self, session_id: uuid.UUID) -> None:
        prefix = self.prefixes.pop(session_id, None)
        if prefix is not None:
            prefix.drop_publication()

    def claim(self, session: uuid.UUID, indexes: range) -> None:
        busy = self.parts.setdefault(session, set())
        if session in self.completing or busy.intersection(indexes):
            raise Conflict("this part (or the session) is being received or completed right now; retry")
        busy.update(indexes)

    def release(self, session: uuid.UUID, indexes: range) -> None:
        busy = self.parts.get(session)
        if busy is not None:
            busy.difference_update(indexes)
            if not busy:
                del self.parts[session]

    def busy(self, session: uuid.UUID) -> bool:
        return bool(self.parts.get(session)) or session in self.completing


async def _advance(prefix: PrefixHash, session: asyncpg.Record, path: str) -> None:
    while prefix.next_index in prefix.recorded:
        offset, size = part_span(session, prefix.next_index)
        try:
            if prefix.publish_to is not None:
                await _hash_and_publish(prefix, session, path, offset, size)
            else:
                await asyncio.to_thread(hash_range, path, offset, size, prefix.digest)
        except OSError:
            prefix.next_index = -1  # the file is gone (deleted, expired): complete will say so
            prefix.drop_publication()
            return
        prefix.recorded.discard(prefix.next_index)
        prefix.next_index += 1


async def _open_publication(prefix: PrefixHash, session: asyncpg.Record) -> None:
    """The prefix's publication, opened at its first part; none (and no more tries) when the
    store has the blob already or cannot be reached."""
    storage, sha256 = prefix.publish_to  # type: ignore[misc]
    try:
        prefix.publication = await storage.open_publication(sha256, session["size"])
    except StorageError as exc:
        log.warning("upload %s: not publishing while receiving (%s)", session["id"], exc.message)
        prefix.publication = None
    if prefix.publication is None:
        prefix.publish_to = None


async def _open_publication_soon(prefix: PrefixHash, session: asyncpg.Record) -> None:
    """`_open_publication` for a part about to be fed, waited for at most OPEN_WAIT_S: the part's
    body waits meanwhile, and a store that does not answer (retries, timeouts) must not hold up
    receiving to local disk. Too late: no publication for this session (complete publishes from
    the file), and one that opens after all is dropped."""
    opening = asyncio.ensure_future(_open_publication(prefix, session))
    done, _ = await asyncio.wait([opening], timeout=OPEN_WAIT_S)
    if opening in done:
        opening.result()
        return
    prefix.publish_to = None
    log.warning("upload %s: the store did not answer within %g s; publishing at complete instead",
                session["id"], OPEN_WAIT_S)

    def drop_late(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is None:
            prefix.drop_publication()

    opening.add_done_callback(drop_late)


async def _hash_and_publish(prefix: PrefixHash, session: asyncpg.Record, path: str, offset: int, size: int) -> None:
    """Hash [offset, offset + size) of the file into the prefix and send the same bytes to its
    publication (opened at the first part); the rest is only hashed once it fails."""
    if prefix.publication is None:
        await _open_publication(prefix, session)
        if prefix.publication is None:
            await asyncio.to_thread(hash_range, path, offset, size, prefix.digest)
            return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        end = offset + size
        while offset < end:
            piece = await asyncio.to_thread(_read_and_hash, fd, offset, min(PUBLISH_READ, end - offset), prefix.digest)
            offset += len(piece)
            publication = prefix.publication
            if publication is None:
                continue  # dropped meanwhile (forgotten, or the store failed): hashing only
            try:
                await publication.write(piece)
            except StorageError as exc:
                log.warning("upload %s: publishing while receiving failed (%s); complete publishes from the file",
                            session["id"], exc.message)
                prefix.drop_publication()
    finally:
        os.close(fd)


class InlineFeed:
    """One part fed to its session's prefix while the part arrives (ActiveUploads.start_inline):
    the receiver hashes each batch into `digest` (a copy of the prefix's, so a part that fails
    leaves the prefix as it was) and `send`s it to the prefix's publication, in order. `finish`
    (the part is recorded) makes the copy the prefix's; `abandon` (it was not) drops the
    publication if any of the part's bytes reached it, so no unverified byte is ever published:
    `complete` then publishes from the file."""

    def __init__(self, prefix: PrefixHash, session: asyncpg.Record, index: int, path: str) -> None:
        self.prefix, self.session, self.index, self.path = prefix, session, index, path
        self.digest = prefix.digest.copy()
        self.offset = part_span(session, index)[0]  # where the next byte sent belongs in the blob
        self.sent_any = False
        self.ended = False

    async def send(self, batch: memoryview) -> None:
        """On the loop: the batch to the publication, if there is one and it holds exactly the
        bytes before this one; a store that fails drops it. Never raises."""
        prefix = self.prefix
        offset, self.offset = self.offset, self.offset + len(batch)
        publication = prefix.publication
        if publication is None or self.ended:
            return
        if publication.sent != offset:
            prefix.drop_publication()  # it missed bytes (cannot happen in order; never guess)
            return
        self.sent_any = True
        writing = asyncio.ensure_future(publication.write(batch))
        try:
            done, _ = await asyncio.wait([writing], timeout=SEND_WAIT_S)
            if not done:
                # A store that hangs (obstore waits up to its request timeout) must not hold up
                # receiving to local disk: go on without it.
                writing.add_done_callback(_retrieved)
                log.warning("upload %s: the store took more than %g s to take %d bytes; complete publishes"
                            " from the file", self.session["id"], SEND_WAIT_S, len(batch))
                prefix.drop_publication()
                return
            writing.result()
        except StorageError as exc:
            log.warning("upload %s: publishing while receiving failed (%s); complete publishes from the file",
                        self.session["id"], exc.message)
            prefix.drop_publication()
        except Exception:
            log.exception("upload %s: publishing while receiving failed; complete publishes from the file",
                          self.session["id"])
            prefix.drop_publication()

    def finish(self) -> None:
        """On the loop, once the part is recorded: the prefix covers it; parts recorded meanwhile
        out of order are read back from the file after it."""
        if self.ended:
            return
        self.ended = True
        prefix = self.prefix
        prefix.feeding = None
        prefix.digest = self.digest
        prefix.next_index = self.index + 1
        if prefix.next_index in prefix.recorded and (prefix.task is None or prefix.task.done()):
            prefix.task = asyncio.ensure_future(_advance(prefix, self.session, self.path))

    def abandon(self) -> None:
        """The part was not recorded (wrong bytes, cut, refused): the prefix stays where it was."""
        if self.ended:
            return
        self.ended = True
        if self.prefix.feeding is self:
            self.prefix.feeding = None
        if self.sent_any:
            self.prefix.drop_publication()


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # a write given up on: its failure was dealt with already


def _read_and_hash(fd: int, offset: int, size: int, digest) -> bytes:
    """Worker thread: `size` bytes of the file at `offset`, fed into `digest`."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(f"an upload file is shorter than {offset + size} bytes")
    digest.update(data)
    return data


def part_count(size: int, part_size: int) -> int:
    return math.ceil(size / part_size)


def part_span(session: asyncpg.Record, index: int) -> tuple[int, int]:
    """(offset, size) of part `index`."""
    offset = index * session["part_size"]
    return offset, min(session["size"], offset + session["part_size"]) - offset


def session_path(storage: BlobStorage, session_id: uuid.UUID) -> str:
    return storage.upload_session_file(session_id)


# Held over the free-space check and the preallocation of a session file, in whichever worker
# thread runs them: two creates must not both see the same free space and both take it (the
# second would leave the disk under ARKVORY_MIN_FREE_BYTES). A thread lock, not an asyncio one:
# a cancelled request's thread still runs to its end, and holds it until then.
_RESERVING = threading.Lock()


def allocate_session_file(path: str, size: int, storage: BlobStorage, reserve: int) -> None:
    """Worker thread: the session's file, with its space reserved now, so that a full disk is
    a 507 at creation rather than in the middle of the upload, and concurrent sessions cannot
    promise the same free space twice (statvfs counts what fallocate took, and `_RESERVING`
    makes the check and the fallocate one step)."""
    try:
        with _RESERVING:
            storage.require_room(size, reserve)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                if size:
                    try:
                        os.posix_fallocate(fd, 0, size)
                    except OSError as exc:
                        if is_out_of_space(exc):
                            raise
                        os.ftruncate(fd, size)  # a filesystem without fallocate: sparse
            except BaseException:
                os.close(fd)
                raise
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(storage.uploads)
    except BaseException as exc:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if is_out_of_space(exc):
            raise out_of_space(exc) from None  # type: ignore[arg-type]
        raise


def hash_range(path: str, offset: int, size: int, digest) -> None:
    """Worker thread: feed `size` bytes of the file from `offset` into `digest`."""
    with open(path, "rb", buffering=0) as file:
        file.seek(offset)
        left = size
        while left:
            chunk = file.read(min(HASH_READ, left))
            if not chunk:
                raise OSError(f"{path} is shorter than {offset + size} bytes")
            digest.update(chunk)
            left -= len(chunk)


async def whole_digest(registry: ActiveUploads, session: asyncpg.Record, path: str) -> str:
    """The file's SHA-256: the prefix hashed while parts arrived, then the rest."""
    prefix = registry.prefixes.get(session["id"])
    if prefix is not None and prefix.task is not None:
        await prefix.task
    if prefix is None or prefix.next_index < 0:
        prefix = PrefixHash()
    offset = min(session["size"], prefix.next_index * session["part_size"])
    digest = prefix.digest.copy()  # the prefix stays as it is for a repeated complete
    await asyncio.to_thread(hash_range, path, offset, session["size"] - offset, digest)
    return digest.hexdigest()


async def remove_sessions(
    conn: asyncpg.Connection, storage: BlobStorage, ids: list[uuid.UUID], *, only_expired: bool = True,
    only_open: bool = False,
) -> list[uuid.UUID]:
    """Sessions and their files, except those in use; returns the ids removed (shared/storage/upload_files.py)."""
    return await remove_upload_sessions(
        conn, storage, ids, only_expired=only_expired, only_open=only_open
    )


async def sweep_expired_uploads(
    pool: asyncpg.Pool, storage: BlobStorage, *, orphans_older_than_s: float | None = None,
    busy: ActiveUploads | None = None, limit: int | None = None,
) -> int:
    """Remove sessions past their expiry with their files; returns how many. For the worker's
    periodic cleanup (on the writer's host) and the writer's own sweeps; sessions `busy` in
    this process are left alone, and so are those any process holds in use
    (shared/storage/upload_files.py holds the rules)."""
    async with pooled(pool) as conn:
        return await sweep_upload_sessions(
            conn, storage, orphans_older_than_s=orphans_older_than_s,
            skip=busy.busy if busy is not None else None,
            removed=busy.forget if busy is not None else None,
            limit=limit,
        )
