"""The local read cache of object-store blobs (ARKVORY_CACHE_MAX_BYTES, SPEC §11): recently read
blobs kept as files in `ARKVORY_DATA_DIR/cache/`, each SHA-256 checked before it is used, served
zero-copy like a storage directory's files, evicted least recently used.

- **A hit** (`acquire`): the file is opened and its size, mtime, ctime and inode compared with
  what they were when its hash was checked; any difference (a write, a truncation, a copy put in
  its place) drops it and the read is a miss, so a changed file is refetched, never served. The
  descriptor goes to the sendfile path of shared/download/transfer.py.
- **A miss** (`reader`): one fill per digest, however many readers want it at once (single
  flight). The fill is one streaming GET of the whole object into `cache/filling/` (from a
  plain-http store on a connection of its own, received into reused page-aligned buffers,
  s3_direct.py; else obstore's stream), written with O_DIRECT in a worker thread
  (cache_files.py), renamed into `cache/blobs/` only once size and SHA-256 match. The hash trails
  the fill in a thread of its own at a lower priority (`_hash_behind`: from the fill's buffers
  while they are in memory, else reading the file back), so on a host short of CPU the downloads
  along with the fill come first and the fill completes right after. Every reader of the digest
  streams behind it (a `CacheReader`, read by shared/download/object_transfer.py through the
  token buckets exactly as the store's own bytes are): the fill's latest buffers (WINDOW) straight
  from memory, older bytes from the growing file. A response that read any byte of the file gets
  its last byte only once the hash matched (the file is not used before its check: a fill whose
  bytes do not match cuts those readers' connections); one sent wholly from the store's buffers
  completes as it would without a cache, which checks nothing either (clients check the
  Repr-Digest). Only a read of the whole blob starts a fill (a range joins one, else reads the
  store). The fill is the cache's own task: a reader that leaves does not stop it, but once
  every reader has left before the store sent the whole blob it stops (`_abandoned`): a
  dropped connection must not fetch a whole blob nobody reads.
- **Its first read re-reads it** (`_fly` with `recheck`): a file is sent as a hit only once its
  bytes were hashed again *from the disk* in this process, on its first read after its fill or
  after a restart (readers wait for that check, in a worker thread, about a second per GiB; once
  per file per process). The fill's hash is of the bytes as they came from the store, mostly
  from memory: a disk that stored other bytes (a write fault, rot before the first read) would
  otherwise be served until the next restart, and size, times and inode do not change with it.
  After a restart the directory is the index (`open`): every file is taken in (least recently
  filled first), untrusted until that first read: the process cannot know what happened to the
  directory while it was down. A file that fails is dropped (`discards["corrupt"]`) and fetched
  again from the store behind the same readers, who get the store's bytes.
- **The limit** holds for every file and every fill in progress: a fill reserves its blob's size
  first, evicting idle files least recently used; a file being read or filled is never evicted.
  A principal past its share of the limit evicts only files it filled (`_evict_for`: fair
  sharing). When no room can be made, or the blob alone is larger than the limit, the read goes to the
  store as without a cache (a bypass). An evicted or dropped file is first renamed away (so a new
  fill of the digest cannot be hit by it) and then unlinked in a worker thread (freeing a large
  file's blocks can take a while).

If the local disk fails a fill (full, unwritable), its readers carry on from the store where they
were (`fallback`); the store's own failures reach them as StorageError, as without a cache.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import pathlib
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from .cache_files import BufferPool, DirectReader, FillFile, file_matches, lower_priority
from .interface import BlobReader, StorageError, StorageUnavailable

log = logging.getLogger("arkvory.storage")

FILL_CHUNK = 4 * 1024 * 1024  # bytes per buffer asked of the store while filling
READ_CHUNK = 1024 * 1024  # bytes per pread of a reader behind a fill
# The fill's last buffers from the store stay in memory for the readers close behind it (they
# send them as they are: no read of the file, no wait for the disk), at least this much.
WINDOW = 8 * 1024 * 1024
WRITES_AHEAD = 4  # buffers of a fill waiting for its writing thread at most
HASH_PIECE = 4 * 1024 * 1024  # bytes per hashing step from memory
_SHA256 = re.compile(r"[0-9a-f]{64}")

Fallback = Callable[[int, int], Any]  # (start, length) -> a source like object_transfer.StoreSource


@dataclasses.dataclass(eq=False)
class _Entry:
    size: int
    # (size, mtime_ns, ctime_ns, inode) when its hash was checked; None: not trusted yet
    identity: tuple[int, int, int, int] | None = None
    users: int = 0  # readers holding the file open: never evicted meanwhile
    owner: Any = None  # the principal whose read filled it (None: found at start-up)


class _Flight:
    """One digest's fill (or re-check): what its readers may read so far, and its outcome."""

    def __init__(self, sha256: str, size: int, path: str) -> None:
        self.sha256 = sha256
        self.size = size
        self.path = path  # the file readers read behind the fill
        self.available = 0  # bytes of `path` they may read before the check
        # The last buffers received, (offset, bytes), from `window[0][0]` to `received`: the
        # fill's own buffers, which readers may send before they reach the file.
        self.window: collections.deque[tuple[int, memoryview]] = collections.deque()
        self.window_bytes = 0
        self.received = 0
        self.done = False
        self.error: BaseException | None = None
        self.task: asyncio.Task | None = None  # the fill from the store, while it runs
        self._progress = asyncio.Event()

    @property
    def ok(self) -> bool:
        return self.done and self.error is None

    def arrived(self, view: memoryview) -> None:
        """A buffer from the store, not yet in the file: readers may take it from memory."""
        self.window.append((self.received, view))
        self.window_bytes += len(view)
        self.received += len(view)
        self._wake()

    def advance(self, size: int) -> None:
        """`size` more bytes are in the file; buffers that are there and older than WINDOW go."""
        self.available += size
        window = self.window
        while window and self.window_bytes - len(window[0][1]) >= WINDOW:
            offset, view = window[0]
            if offset + len(view) > self.available:
                break
            window.popleft()
            self.window_bytes -= len(view)
        self._wake()

    def finish(self, error: BaseException | None = None) -> None:
        self.done, self.error = True, error
        self.window.clear()  # the file has it all now (or it is not to be read)
        self.window_bytes = 0
        self._wake()

    def in_memory(self, offset: int, most: int) -> memoryview | None:
        """Up to `most` bytes at `offset` from the window, without copying; None when the
        window does not hold `offset`."""
        for start, view in self.window:
            if start <= offset < start + len(view):
                skip = offset - start
                return view[skip:skip + most]
        return None

    def _wake(self) -> None:
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()

    async def progressed(self) -> None:
        await self._progress.wait()


class ReadCache:
    def __init__(self, directory: pathlib.Path, max_bytes: int, origin: Any,
                 counted: Callable[[str], None] = lambda result: None) -> None:
        """`origin`: the storage to fill from (its `open_range`); `counted(result)` is told
        of every GET the cache sends it ("ok" or "failed")."""
        if max_bytes <= 0:
            raise ValueError(f"max_bytes: expected a positive size, got {max_bytes}")
        self.directory = directory
        self.blobs = directory / "blobs"
        self.filling = directory / "filling"
        self.max_bytes = max_bytes
        self._origin = origin
        self._counted = counted
        self._index: collections.OrderedDict[str, _Entry] = collections.OrderedDict()  # LRU first
        self._flights: dict[str, _Flight] = {}
        self._tasks: set[asyncio.Task] = set()
        self._lent: dict[int, _Entry] = {}  # descriptor -> the entry it was lent for
        self._unlinker = concurrent.futures.ThreadPoolExecutor(1, "arkvory-cache-unlink")
        self.held = 0  # bytes of the files and the fills in progress
        self._owned: collections.Counter = collections.Counter()  # of `held`, by entry owner
        # What /health/metrics exports (shared/metrics.py `observe_read_cache`).
        self.requests = {"hit": 0, "miss": 0, "bypass": 0}
        self.fills = {"ok": 0, "failed": 0, "corrupt": 0, "abandoned": 0}
        self.discards = {"changed": 0, "corrupt": 0}
        self.evictions = 0

    # -- start-up --------------------------------------------------------------------------------

    @classmethod
    async def open(cls, directory: pathlib.Path, max_bytes: int, origin: Any,
                   counted: Callable[[str], None] = lambda result: None) -> ReadCache:
        """The cache in `directory`, rebuilt from the files there (off the event loop)."""
        cache = cls(directory, max_bytes, origin, counted)
        await asyncio.to_thread(cache._rebuild)
        return cache

    def _rebuild(self) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.filling.mkdir(parents=True, exist_ok=True)
        for leftover in os.scandir(self.filling):  # fills a stop interrupted
            os.unlink(leftover.path)
        found = []
        for top in os.scandir(self.blobs):
            if not top.is_dir(follow_symlinks=False):
                continue
            for item in os.scandir(top.path):
                name = item.name
                if _SHA256.fullmatch(name) and name[:2] == top.name and item.is_file(follow_symlinks=False):
                    stat = item.stat(follow_symlinks=False)
                    found.append((stat.st_mtime_ns, name, stat.st_size))
        for _, name, size in sorted(found):  # least recently filled first
            self._index[name] = _Entry(size)
            self._hold(self._index[name], size)
        self._evict_for(0)
        log.info("read cache %s: %d files, %d bytes (limit %d)", self.directory, len(self._index), self.held,
                 self.max_bytes)

    async def drained(self) -> None:
        """Wait until no fill runs (a download may end before its fill's hash is checked)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._unlinker.shutdown(wait=False)

    # -- hits ----------------------------------------------------------------------------------

    def path_of(self, sha256: str) -> str:
        return f"{self.blobs}/{sha256[:2]}/{sha256}"

    def acquire(self, sha256: str) -> int | None:
        """A descriptor of the checked file to send (give it back with `release`), or None: a
        miss (not cached, not checked yet, or changed since it was checked)."""
        entry = self._index.get(sha256)
        if entry is None or entry.identity is None:
            return None
        try:
            fd = os.open(self.path_of(sha256), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._drop(sha256, "changed")
            return None
        if _identity(os.fstat(fd)) != entry.identity:
            os.close(fd)
            log.warning("read cache: %s changed since its hash was checked: dropped, it is fetched again", sha256)
            self._drop(sha256, "changed")
            return None
        entry.users += 1
        self._lent[fd] = entry
        self._index.move_to_end(sha256)
        self.requests["hit"] += 1
        return fd

    def holds(self, sha256: str) -> bool:
        """A file of the digest is here, checked or waiting for its first read's check: reading
        it needs no store unless that check fails (so it is served while the store is down)."""
        flight = self._flights.get(sha256)
        return sha256 in self._index and (flight is None or flight.task is None)  # no fill runs

    def release(self, sha256: str, fd: int) -> None:
        entry = self._lent.pop(fd)
        entry.users -= 1
        os.close(fd)

    # -- misses --------------------------------------------------------------------------------

    def reader(self, sha256: str, size: int, start: int, length: int, fallback: Fallback,
               owner: Any = None) -> CacheReader | None:
        """A source of bytes [start, start + length) behind the digest's fill (started now if
        none runs); None when the blob is not to be cached (larger than the limit, or no room
        now, or none within the share of `owner`, the principal reading: `_evict_for`): read it
        from the store.

        Only a read of the whole blob starts a fill; a range joins one that runs, else it goes
        to the store. A range costs the store what it asks and no more: a fill started for
        `bytes=0-0` would fetch the whole blob (stopped once its reader left, `_abandoned`),
        and a client fetching a blob in consecutive ranges (a segmented downloader, a resumed
        download) would start a new fill from byte 0 for every range, each stopped at the
        range's end."""
        flight = self._flights.get(sha256)
        if flight is None:
            entry = self._index.get(sha256)
            if entry is not None and entry.identity is not None:
                # Checked since the caller's `acquire` missed: read the file as it is.
                flight = _Flight(sha256, entry.size, self.path_of(sha256))
                flight.advance(entry.size)
                flight.finish()
                self._index.move_to_end(sha256)
                self.requests["hit"] += 1
                entry.users += 1
                return CacheReader(self, flight, entry, start, length, fallback)
            if entry is not None and entry.size != size:
                self._drop(sha256, "corrupt")  # a file from before the restart, of another size
                entry = None
            # A file not read since its fill or since the restart: its bytes from the disk first.
            recheck = entry is not None
            if recheck:
                self._index.move_to_end(sha256)
            if entry is None:
                if start or length != size or not self._evict_for(size, owner):
                    self.requests["bypass"] += 1
                    return None
                entry = self._index[sha256] = _Entry(size, owner=owner)
                self._hold(entry, size)
            flight = self._flights[sha256] = _Flight(sha256, size, self.path_of(sha256))
            task = asyncio.get_running_loop().create_task(self._fly(flight, entry, recheck=recheck))
            if not recheck:
                flight.task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.requests["miss"] += 1
        entry = self._index[sha256]
        entry.users += 1
        return CacheReader(self, flight, entry, start, length, fallback)

    async def _fly(self, flight: _Flight, entry: _Entry, *, recheck: bool) -> None:
        """A fill from the store, or, `recheck`, the first read's check of a file that is there
        (then a fill if it fails). A filled file is not trusted for hits yet: its first read
        checks it (the module's docstring says why)."""
        sha256 = flight.sha256
        try:
            if recheck and await self._matches(flight.path, sha256, flight.size, entry):
                flight.advance(flight.size)
                flight.finish()
                return
            if recheck:
                log.warning("read cache: %s does not match its digest any more: fetched again", sha256)
                self.discards["corrupt"] += 1
                flight.task = asyncio.current_task()
            await self._fetch(flight)
            self.fills["ok"] += 1
            flight.finish()
        except BaseException as exc:
            if self._index.get(sha256) is entry:
                self._drop(sha256, None)
            flight.finish(exc if isinstance(exc, Exception) else StorageUnavailable("the cache fill was stopped"))
            if not isinstance(exc, Exception):
                raise
        finally:
            if self._flights.get(sha256) is flight:
                del self._flights[sha256]

    async def _fetch(self, flight: _Flight) -> None:
        """Stream the object into a new file of filling/ and rename it into place once its
        SHA-256 matches; raises StorageError (the store failed or sent other bytes) or OSError
        (this disk failed). Each buffer from the store is offered to the readers at once
        (`arrived`), then written in the fill's thread while the next ones arrive (the fill never
        waits for the disk unless WRITES_AHEAD buffers do). The hash trails behind in a thread of
        its own at a lower priority (`_hash_behind`): the fill never waits for it while bytes
        arrive, only before the rename."""
        sha256, size = flight.sha256, flight.size
        temporary = f"{self.filling}/{sha256}.{uuid.uuid4().hex}"
        flight.path, flight.available = temporary, 0
        file = None
        loop = asyncio.get_running_loop()
        writer = concurrent.futures.ThreadPoolExecutor(1, "arkvory-cache-fill")
        hashing: asyncio.Task | None = None
        try:
            try:
                file = FillFile(temporary, size)
                hashing = loop.create_task(_hash_behind(flight, temporary))
                hashing.add_done_callback(_retrieved)  # awaited only if the fill gets all the bytes
                direct = getattr(self._origin, "open_direct_range", None)
                ranged = None if direct is None or not size else direct(sha256, 0, size)
                buffers = self._streamed(sha256, size) if ranged is None else self._received(ranged)
                writes: collections.deque[asyncio.Future] = collections.deque()
                try:
                    async with contextlib.aclosing(buffers):
                        async for view in buffers:
                            if flight.received + len(view) > size:
                                break  # more than the blob's size: the check below refuses it
                            flight.arrived(view)
                            writes.append(loop.run_in_executor(
                                writer, functools.partial(file.write, view, aligned=ranged is not None)
                            ))
                            while len(writes) >= WRITES_AHEAD or (writes and writes[0].done()):
                                flight.advance(await writes.popleft())
                    writes.append(loop.run_in_executor(writer, file.finish))
                    while writes:
                        flight.advance(await writes.popleft())
                finally:
                    for pending in writes:  # after a failure: the thread finishes them
                        pending.add_done_callback(_retrieved)
                whole = flight.received == size and flight.available == size
                digest = await hashing if whole else None
            except StorageError:
                self._counted("failed")
                self.fills["failed"] += 1
                raise
            except OSError:
                self.fills["failed"] += 1
                raise
            if digest != sha256:
                self.fills["corrupt"] += 1
                raise StorageUnavailable(
                    f"the object store sent {flight.received} bytes for {sha256} that do not match its"
                    " digest: not cached, not served",
                )
            final = self.path_of(sha256)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(temporary, final)
            flight.path = final  # readers that open it from now on (no await since the rename)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        finally:
            if hashing is not None:
                hashing.cancel()  # its thread finishes the step it is in, then stops
            if file is not None:
                # In the fill's thread, after what it was given: never under a write.
                writer.submit(file.close)
            writer.shutdown(wait=False)

    async def _streamed(self, sha256: str, size: int) -> AsyncIterator[memoryview]:
        """The object's bytes as the origin's reader hands them out (obstore's buffers, or a
        directory's reads)."""
        reader: BlobReader = self._origin.open_range(sha256, 0, size, chunk_size=FILL_CHUNK)
        async with reader:
            self._counted("ok")
            async for buffer in reader:
                yield memoryview(buffer).cast("B")

    async def _received(self, ranged: Any) -> AsyncIterator[memoryview]:
        """The object's bytes received on a connection of the cache's own (s3_direct.py) into
        reused page-aligned buffers (BufferPool), FILL_CHUNK per system call, in a thread: one copy
        and no staging before the direct write (~0.3 CPU s/GiB less than obstore's buffers)."""
        await ranged.open()
        self._counted("ok")
        loop = asyncio.get_running_loop()
        receiver = concurrent.futures.ThreadPoolExecutor(1, "arkvory-cache-receive")
        pool = BufferPool(FILL_CHUNK)
        left = ranged.length
        try:
            while left:
                view = pool.take()[:min(FILL_CHUNK, left)]
                got = await loop.run_in_executor(receiver, ranged.receive_into, view)
                left -= got
                yield view[:got]
                del view
        finally:
            ranged.interrupt()  # a receive still running returns, then it closes in its thread
            receiver.submit(ranged.close)
            receiver.shutdown(wait=False)

    def _abandoned(self, flight: _Flight, entry: _Entry) -> None:
        """The last reader of a fill left before the store sent the whole blob: stop the fill.
        Else a client could, with one cheap request each (`Range: bytes=0-0`, or a connection
        dropped after the headers), make this process fetch whole blobs from the store and churn
        the cache with them, bytes no download's token bucket ever counts. The flight and its
        reservation go now, so a reader arriving next starts a fill of its own rather than
        joining one being stopped."""
        task = flight.task
        if task is None or task.done() or flight.done or flight.received >= flight.size:
            return
        if self._flights.get(flight.sha256) is flight:
            del self._flights[flight.sha256]
        if self._index.get(flight.sha256) is entry:
            del self._index[flight.sha256]
            self._hold(entry, -entry.size)
        self.fills["abandoned"] += 1
        task.cancel()

    async def _matches(self, path: str, sha256: str, size: int, entry: _Entry) -> bool:
        """Whether the file's bytes, read from the disk in a worker thread, have the digest; if
        so it is trusted for hits as it was while it was read (a change meanwhile: not trusted)."""
        try:
            before = _identity(os.stat(path))
        except FileNotFoundError:
            return False
        if not await asyncio.to_thread(file_matches, path, sha256, size):
            return False
        try:
            after = _identity(os.stat(path))
        except FileNotFoundError:
            return False
        if after != before:
            return False
        entry.identity = before
        return True

    # -- the limit -----------------------------------------------------------------------------

    def _hold(self, entry: _Entry, size: int) -> None:
        self.held += size
        if entry.owner is not None:
            self._owned[entry.owner] += size
            if not self._owned[entry.owner]:
                del self._owned[entry.owner]

    def _evict_for(self, size: int, owner: Any = None) -> bool:
        """Make room for `size` more bytes by evicting idle files, least recently used first;
        False when that cannot be done (nothing evicted then beyond what was idle anyway).

        Fair sharing: a principal whose fills would hold more than its share of the limit (the
        limit over the principals holding files, itself included) evicts only files it filled.
        Else one principal reading many distinct blobs once (a scan, or on purpose) would evict
        every other principal's files; now, past its share, it churns only its own, and its
        reads that cannot be cached so go to the store (a bypass). A principal holding nothing
        may always make room for one blob, however large against its share: else, with many
        principals, a blob larger than the limit over their number would never be cached."""
        if size > self.max_bytes:
            return False
        owned = self._owned[owner] if owner is not None else 0
        only_own = owned > 0 and owned + size > self.max_bytes / len(self._owned)
        for sha256, entry in list(self._index.items()):
            if self.held + size <= self.max_bytes:
                break
            if entry.users or sha256 in self._flights or (only_own and entry.owner != owner):
                continue
            self._drop(sha256, None)
            self.evictions += 1
        return self.held + size <= self.max_bytes

    def _drop(self, sha256: str, reason: str | None) -> None:
        """Forget a file and remove it: renamed away at once, unlinked in the background."""
        entry = self._index.pop(sha256, None)
        if entry is not None:
            self._hold(entry, -entry.size)
        if reason is not None:
            self.discards[reason] += 1
        doomed = f"{self.filling}/dropped-{uuid.uuid4().hex}"
        try:
            os.rename(self.path_of(sha256), doomed)
        except FileNotFoundError:
            return
        try:
            self._unlinker.submit(_unlink_quietly, doomed)
        except RuntimeError:  # closed: the process is stopping
            _unlink_quietly(doomed)

    @property
    def files(self) -> int:
        return len(self._index)


async def _hash_behind(flight: _Flight, path: str) -> str:
    """The SHA-256 of the fill's bytes, computed in order in a thread of its own at a lower
    priority (cache_files.lower_priority) while the fill goes on: from the fill's buffers while
    the window still holds them, from the file (read back with O_DIRECT, only what is written)
    once the hash has fallen behind the window, as it does on a host with no core to spare.
    Waits for bytes as they come; the fill cancels it if it fails."""
    loop = asyncio.get_running_loop()
    hasher = concurrent.futures.ThreadPoolExecutor(1, "arkvory-cache-hash", initializer=lower_priority)
    digest = hashlib.sha256()
    hashed = 0
    file: DirectReader | None = None
    try:
        while hashed < flight.size:
            view = flight.in_memory(hashed, HASH_PIECE)
            if view is not None:
                await loop.run_in_executor(hasher, digest.update, view)
                hashed += len(view)
            elif hashed < flight.available:
                if file is None:
                    file = await loop.run_in_executor(hasher, DirectReader, path)
                hashed += await loop.run_in_executor(hasher, file.hash_range, digest, hashed, flight.available)
            else:
                await flight.progressed()
        return digest.hexdigest()
    finally:
        if file is not None:
            hasher.submit(file.close)  # after the step in progress: never under a read
        hasher.shutdown(wait=False)


class CacheReader:
    """Bytes [start, start + length) of a blob behind its fill, as object_transfer.StoreSource
    hands them out (`fill`, `take`, `buffered`, `aclose`). A range that read any byte from the
    fill's file gets its last byte only once the fill's hash matched; one sent wholly from the
    store's own buffers (the fill's window) does not wait, as without a cache."""

    def __init__(self, cache: ReadCache, flight: _Flight, entry: _Entry, start: int, length: int,
                 fallback: Fallback) -> None:
        self._cache = cache
        self._flight = flight
        self._entry = entry
        self._offset = start
        self._end = start + length
        self._fallback_factory = fallback
        self._fallback: Any = None
        self._fd: int | None = None
        self._from_file = False  # some of the bytes came from the file, not the store's buffers
        self._view = memoryview(b"")
        self.buffered = 0

    async def fill(self) -> None:
        flight = self._flight
        while not self.buffered:
            if self._fallback is not None:
                await self._fallback.fill()
                self.buffered = self._fallback.buffered
                return
            if flight.done and flight.error is not None:  # what it wrote is not to be read
                if isinstance(flight.error, StorageError):
                    raise flight.error
                # This disk failed the fill (full, unwritable): the rest comes from the store.
                log.warning("read cache: the fill of %s failed (%s): reading from the store", flight.sha256, flight.error)
                self._fallback = self._fallback_factory(self._offset, self._end - self._offset)
                continue
            if flight.ok:
                in_file = from_store = self._end
            else:
                # The file's last byte for this response waits for the hash (the file is not
                # used before its check); bytes sent as they came from the store need not,
                # exactly as without a cache, unless this reader has read the file already.
                in_file = min(self._end - 1, flight.available)
                from_store = min(self._end - 1 if self._from_file else self._end, flight.received)
            if self._offset < from_store:
                view = flight.in_memory(self._offset, min(from_store - self._offset, READ_CHUNK))
                if view is not None:  # just arrived from the store: sent as it is
                    self._offset += len(view)
                    self._view = view
                    self.buffered = len(view)
                    return
            if self._offset < in_file:
                self._read(in_file - self._offset)
                return
            await flight.progressed()

    def _read(self, size: int) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(self._flight.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # dropped (changed on disk) before this reader opened it
                raise StorageUnavailable(f"the read cache's file of {self._flight.sha256} is gone") from None
        size = min(size, READ_CHUNK)
        self._from_file = True
        data = os.pread(self._fd, size, self._offset)
        if len(data) != size:
            raise StorageUnavailable(f"the read cache's file of {self._flight.sha256} ended early")
        self._offset += size
        self._view = memoryview(data)
        self.buffered = size

    def take(self, most: int) -> memoryview:
        if self._fallback is not None:
            piece = self._fallback.take(most)
            self.buffered = self._fallback.buffered
            return piece
        head = self._view[:most]
        self._view = self._view[len(head):]
        self.buffered -= len(head)
        return head

    async def aclose(self) -> None:
        self._view = memoryview(b"")
        self.buffered = 0
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._entry is not None:
            entry, self._entry = self._entry, None
            entry.users -= 1
            if not entry.users:
                self._cache._abandoned(self._flight, entry)
        if self._fallback is not None:
            await self._fallback.aclose()


def _identity(found: os.stat_result) -> tuple[int, int, int, int]:
    """What must not change between a file's check and its use: size, mtime, ctime, inode."""
    return found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a write behind a failed fill: its error is not news


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
