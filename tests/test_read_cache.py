"""The read cache (shared/storage/read_cache.py) on real files, filled from a real directory
backend as its origin: one fill per digest however many read at once, a wrong fill never kept and
no response that read its file completed (those sent from the store's own buffers complete, as
without a cache), the hash trailing the fill from memory or from the file, a file's first read
checking its bytes on the disk (a disk that stored them wrongly is caught), the limit held (never
evicting a file being read), a changed file dropped and refetched, and the directory as the index
after a restart, re-checked. The same on a real SeaweedFS through real processes:
tests/test_s3_cache.py."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os

import pytest

from arkvory.shared.storage import StorageUnavailable
from arkvory.shared.storage.directory import Storage
from arkvory.shared.storage.cache_files import ALIGN, DirectReader, FillFile
from arkvory.shared.storage.read_cache import FILL_CHUNK, ReadCache, _Flight, _hash_behind

from .harness import eventually_async

pytestmark = pytest.mark.timeout(30)

KiB = 1024


class Origin(Storage):
    """The directory backend, counting the ranges the cache opens on it; with `pause_before`, a
    range stops before that buffer (`paused` is set) until `resume` is set."""

    def __init__(self, root):
        super().__init__(root)
        self.blobs.mkdir(parents=True)
        self.opened = 0
        self.pause_before: int | None = None
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    def put(self, data: bytes, under: str | None = None) -> str:
        sha256 = under or hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return sha256

    def open_range(self, sha256, start, length, **options):
        self.opened += 1
        reader = super().open_range(sha256, start, length, **options)
        return reader if self.pause_before is None else PausingRange(reader, self)


class PausingRange:
    """The directory backend's range (a BlobReader) that stops before buffer `pause_before`."""

    def __init__(self, inner, origin: Origin) -> None:
        self.inner = inner
        self.origin = origin
        self.handed = 0

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info):
        await self.inner.__aexit__(*exc_info)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.handed == self.origin.pause_before:
            self.origin.paused.set()
            await self.origin.resume.wait()
        self.handed += 1
        return await self.inner.__anext__()

    async def aclose(self):
        await self.inner.aclose()


def no_fallback(start, length):
    raise AssertionError("the cache fell back to the store")


async def read_all(
    cache: ReadCache, sha256: str, size: int, start: int = 0, length: int | None = None, *, settle: bool = True,
    owner: str | None = None,
) -> bytes:
    """What a download would send: a hit's file, or the bytes behind the fill; then, `settle`,
    wait for the fill to end (a reader may finish before the fill's hash is checked)."""
    length = size - start if length is None else length
    fd = cache.acquire(sha256)
    if fd is not None:
        try:
            return os.pread(fd, length, start)
        finally:
            cache.release(sha256, fd)
    reader = cache.reader(sha256, size, start, length, no_fallback, owner=owner)
    assert reader is not None, "bypassed"
    out = bytearray()
    try:
        while len(out) < length:
            await reader.fill()
            out += reader.take(reader.buffered)
    finally:
        await reader.aclose()
    if settle:
        await cache.drained()
    return bytes(out)


def hit(cache: ReadCache, sha256: str) -> bool:
    """Whether a download now would be a hit (the descriptor is given back at once)."""
    fd = cache.acquire(sha256)
    if fd is None:
        return False
    cache.release(sha256, fd)
    return True


@pytest.fixture
def origin(tmp_path):
    return Origin(tmp_path / "origin")


def test_fifty_readers_of_a_cold_blob_make_one_fill_and_then_it_is_a_hit(origin, tmp_path):
    data = os.urandom(3 * 1024 * KiB + 5)
    sha256 = origin.put(data)

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 10 * 1024 * KiB, origin)
        ranges = [(0, len(data))] * 45 + [(7, 100), (1024 * KiB - 1, 3), (len(data) - 1, 1), (0, 1), (5, 2 * 1024 * KiB)]
        bodies = await asyncio.gather(*(read_all(cache, sha256, len(data), s, n) for s, n in ranges))
        assert [b == data[s:s + n] for b, (s, n) in zip(bodies, ranges)] == [True] * 50
        assert origin.opened == 1
        assert cache.fills == {"ok": 1, "failed": 0, "corrupt": 0, "abandoned": 0}
        assert cache.requests["miss"] == 50
        # Its first read after the fill checks the file's bytes on the disk (not the store) ...
        assert await read_all(cache, sha256, len(data)) == data
        assert cache.requests == {"hit": 0, "miss": 51, "bypass": 0} and origin.opened == 1
        assert await read_all(cache, sha256, len(data)) == data  # ... then it is a hit
        assert cache.requests["hit"] == 1 and origin.opened == 1
        assert cache.held == len(data) and os.listdir(cache.filling) == []
        cache.close()

    asyncio.run(run())


def test_a_wrong_fill_is_not_kept_and_no_read_of_its_file_completes(origin, tmp_path):
    """The store sends other bytes than the digest's. A reader that streams along with the fill
    gets them from the store's own buffers and completes, as it would without a cache (and
    without waiting for the hash); a reader that read the fill's file never gets its last byte:
    it is cut when the hash does not match. Nothing is kept, the next read fills afresh."""
    size = 7 * FILL_CHUNK  # the fill's buffers: the origin stops before the last one
    data = os.urandom(size)
    sha256 = hashlib.sha256(data).hexdigest()
    stored = os.urandom(size)
    origin.put(stored, under=sha256)
    origin.pause_before = 6

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 64 * 1024 * KiB, origin)
        along = asyncio.create_task(read_all(cache, sha256, size, settle=False))
        await origin.paused.wait()
        # Six buffers in, at least the first two written and out of the window (WINDOW): the
        # first MiB now comes from the file.
        behind = cache.reader(sha256, size, 0, 1024 * KiB, no_fallback)
        got = bytearray()

        async def read_behind():
            while True:
                await behind.fill()
                got.extend(behind.take(behind.buffered))

        reading = asyncio.create_task(read_behind())
        await eventually_async(lambda: len(got) >= 1024 * KiB - 1, "the file read up to its last byte")
        assert len(got) == 1024 * KiB - 1 and not reading.done()  # its last byte waits for the hash
        origin.resume.set()
        with pytest.raises(StorageUnavailable, match="do not match its digest"):
            await reading
        await behind.aclose()
        assert bytes(got) == stored[:len(got)]
        assert await along == stored  # as the store sent them: a download without a cache
        await cache.drained()
        assert cache.fills["corrupt"] == 1 and cache.held == 0 and cache.acquire(sha256) is None
        await eventually_async(lambda: os.listdir(cache.filling) == [], "the fill's file unlinked")
        origin.pause_before = None
        origin.put(data)  # repaired: the next read fills afresh
        assert await read_all(cache, sha256, size) == data
        await cache.drained()
        assert cache.fills["ok"] == 1 and await read_all(cache, sha256, size) == data and hit(cache, sha256)
        cache.close()

    asyncio.run(run())


def test_a_fill_whose_readers_all_left_early_stops_and_frees_its_room(origin, tmp_path):
    """A whole read whose connection is gone after one byte: the fill of the whole blob stops
    instead of fetching it all, bytes no token bucket counts, and its reservation is freed at
    once; a fill that a reader still waits on goes on; the next reader fills afresh."""
    size = 6 * FILL_CHUNK
    data = os.urandom(size)
    sha256 = origin.put(data)
    origin.pause_before = 1  # the store sends one buffer, then nothing for now

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 64 * 1024 * KiB, origin)
        leaving = cache.reader(sha256, size, 0, size, no_fallback)
        await leaving.fill()
        assert bytes(leaving.take(1)) == data[:1]
        await leaving.aclose()  # the client is gone
        await asyncio.wait_for(cache.drained(), 5)  # stopped, not waiting on the store
        assert cache.fills["abandoned"] == 1 and cache.fills["ok"] == 0
        assert cache.held == 0 and cache.files == 0 and cache.acquire(sha256) is None
        await eventually_async(lambda: os.listdir(cache.filling) == [], "the fill's file removed by its thread")

        origin.paused.clear()
        whole = asyncio.create_task(read_all(cache, sha256, size, settle=False))  # all of it, and ...
        await origin.paused.wait()
        first = cache.reader(sha256, size, 0, 1, no_fallback)  # ... one byte, behind its fill
        await first.fill()
        assert bytes(first.take(1)) == data[:1]
        await first.aclose()  # the whole read still waits: the fill goes on
        origin.resume.set()
        assert await whole == data
        await cache.drained()
        assert cache.fills == {"ok": 1, "failed": 0, "corrupt": 0, "abandoned": 1}
        assert await read_all(cache, sha256, size) == data and hit(cache, sha256) and origin.opened == 2
        cache.close()

    asyncio.run(run())


def test_only_a_whole_read_starts_a_fill_a_range_of_a_cold_blob_goes_to_the_store(origin, tmp_path):
    """`Range: bytes=0-0`, or the consecutive ranges of a segmented download, cost the store
    what they ask: no fill of the whole blob starts for them (each would be stopped at its
    range's end, and the next range would start again from byte 0)."""
    data = os.urandom(3 * FILL_CHUNK)
    sha256 = origin.put(data)

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 64 * 1024 * KiB, origin)
        for start, length in ((0, 1), (0, FILL_CHUNK), (FILL_CHUNK, 2 * FILL_CHUNK), (1, len(data) - 1)):
            assert cache.reader(sha256, len(data), start, length, no_fallback) is None
        assert cache.requests == {"hit": 0, "miss": 0, "bypass": 4}
        assert origin.opened == 0 and cache.held == 0
        assert await read_all(cache, sha256, len(data)) == data  # the whole blob: filled
        assert cache.fills["ok"] == 1 and origin.opened == 1
        for _ in range(2):  # a range joins the file's first-read check, then hits
            assert await read_all(cache, sha256, len(data), FILL_CHUNK, 5) == data[FILL_CHUNK:FILL_CHUNK + 5]
        assert cache.requests["hit"] == 1 and origin.opened == 1
        cache.close()

    asyncio.run(run())


def test_the_hash_behind_a_fill_reads_back_from_the_file_what_the_window_no_longer_holds(tmp_path):
    """The fill's hash trails it: from the fill's buffers while they are in memory, from the
    file (direct reads, any alignment) once it has fallen behind them."""
    size = 21 * 1024 * KiB + 123
    data = os.urandom(size)
    path = tmp_path / "filling"
    path.write_bytes(data)
    flight = _Flight(hashlib.sha256(data).hexdigest(), size, str(path))
    start, end = 5 * 1024 * KiB + 7, 9 * 1024 * KiB + 13
    flight.received = start
    flight.arrived(memoryview(data)[start:end])  # only these bytes are still in memory
    flight.received = size
    flight.advance(size)
    assert flight.in_memory(start, 1) is not None and flight.in_memory(0, 1) is None

    async def run():
        return await _hash_behind(flight, str(path))

    assert asyncio.run(run()) == flight.sha256
    for first, last in ((0, size), (4095, 4097), (size - 5, size), (3, 8 * 1024 * KiB + 9)):
        digest = hashlib.sha256()
        reader = DirectReader(str(path))
        try:
            done = first
            while done < last:
                done += reader.hash_range(digest, done, last)
        finally:
            reader.close()
        assert digest.hexdigest() == hashlib.sha256(data[first:last]).hexdigest()


def test_a_fill_file_whose_writes_fail_even_buffered_raises_rather_than_retrying(tmp_path, monkeypatch):
    """A direct write refused with EINVAL is retried through the page cache once; an EINVAL then
    is the error, as in the staged path, never a retry loop that holds the fill's thread."""
    file = FillFile(str(tmp_path / "fill"), 2 * ALIGN)
    try:
        if not file.direct:
            pytest.skip("this filesystem refuses O_DIRECT")
        real_write, attempts = os.write, []

        def refusing(fd, data):
            if fd != file.fd:
                return real_write(fd, data)
            attempts.append(fd)
            if len(attempts) > 5:
                raise RuntimeError("retried EINVAL without end")
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(os, "write", refusing)
        with pytest.raises(OSError) as raised:
            file.write(memoryview(bytes(2 * ALIGN)), aligned=True)  # as a BufferPool buffer's view
        assert raised.value.errno == errno.EINVAL and not file.direct and len(attempts) == 2
    finally:
        monkeypatch.undo()
        file.close()


def on_disk(cache: ReadCache) -> int:
    """Bytes of the cached files (an evicted one is unlinked in the background, maybe while
    this looks)."""
    total = 0
    for top in os.scandir(cache.blobs):
        for entry in os.scandir(top.path):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    return total


def test_the_limit_holds_least_recently_used_goes_first_and_a_file_being_read_stays(origin, tmp_path):
    blobs = [os.urandom(100 * KiB) for _ in range(5)]
    digests = [origin.put(b) for b in blobs]
    size = 100 * KiB

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 3 * size, origin)
        for sha256, data in zip(digests[:3], blobs[:3]):
            assert await read_all(cache, sha256, size) == data
        assert await read_all(cache, digests[0], size) == blobs[0]  # its first read checks it
        held = cache.acquire(digests[0])  # being read (sendfile)...
        assert held is not None
        for sha256, data in zip(digests[1:3], blobs[1:3]):
            assert await read_all(cache, sha256, size) == data  # ... and then the least recent
        assert await read_all(cache, digests[3], size) == blobs[3]  # evicts 1, not 0
        assert cache.evictions == 1 and cache.held == 3 * size
        assert cache.acquire(digests[1]) is None
        assert os.pread(held, 10, 0) == blobs[0][:10]
        cache.release(digests[0], held)
        assert await read_all(cache, digests[4], size) == blobs[4]  # now 0 can go
        assert cache.evictions == 2 and cache.held <= 3 * size
        assert cache.acquire(digests[0]) is None
        assert cache.held == 3 * size
        await eventually_async(lambda: on_disk(cache) == 3 * size, "the evicted files unlinked")
        # Larger than the whole limit: not cached, read from the store.
        assert cache.reader(digests[0], 3 * size + 1, 0, 10, no_fallback) is None
        assert cache.requests["bypass"] == 1
        cache.close()

    asyncio.run(run())


def test_a_principal_reading_many_blobs_evicts_only_its_own_files_past_its_share(origin, tmp_path):
    """Fair sharing: one principal reading blob after blob once (a scan, or an attack on the
    cache) must not evict another's files. Past its share of the limit (the limit over the
    principals holding files) it evicts only what it filled; without that, plain LRU, the
    scan flushed everyone else's files. One principal with nothing cached may always make room
    for one blob."""
    size = 100 * KiB
    blobs = [os.urandom(size) for _ in range(9)]
    digests = [origin.put(b) for b in blobs]

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 4 * size, origin)
        for sha256, data in zip(digests[:2], blobs[:2]):
            assert await read_all(cache, sha256, size, owner="victim") == data
        for sha256, data in zip(digests[2:8], blobs[2:8]):
            assert await read_all(cache, sha256, size, owner="scanner") == data
        for sha256, data in zip(digests[:2], blobs[:2]):  # still there: read from the file
            assert await read_all(cache, sha256, size, owner="victim") == data
        assert origin.opened == 8
        assert cache.held == 4 * size and cache.evictions == 4
        assert [cache.acquire(d) is None for d in digests[2:6]] == [True] * 4  # its own went
        # The victim's next blob is within its share again only by evicting its own.
        assert await read_all(cache, digests[8], size, owner="victim") == blobs[8]
        assert cache.acquire(digests[0]) is None and cache.held == 4 * size
        # A principal with nothing cached may make room for one blob larger than its share.
        large = os.urandom(2 * size)
        assert await read_all(cache, origin.put(large), 2 * size, owner="newcomer") == large
        assert cache.held == 4 * size
        cache.close()

    asyncio.run(run())


def test_a_changed_file_is_dropped_and_fetched_again(origin, tmp_path):
    data = os.urandom(200 * KiB)
    sha256 = origin.put(data)

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 1024 * KiB, origin)
        assert await read_all(cache, sha256, len(data)) == data
        assert await read_all(cache, sha256, len(data)) == data and hit(cache, sha256)  # checked
        with open(cache.path_of(sha256), "r+b") as file:  # bit rot, or a person
            file.seek(1000)
            file.write(b"\0" * 10)
        assert cache.acquire(sha256) is None and cache.discards["changed"] == 1
        assert await read_all(cache, sha256, len(data)) == data
        assert origin.opened == 2
        assert await read_all(cache, sha256, len(data)) == data and hit(cache, sha256)  # checked
        os.truncate(cache.path_of(sha256), 10)
        assert await read_all(cache, sha256, len(data)) == data
        assert origin.opened == 3 and cache.discards["changed"] == 2
        cache.close()

    asyncio.run(run())


def test_after_a_restart_files_are_rechecked_before_use_and_a_corrupt_one_is_fetched_again(origin, tmp_path):
    good, bad = os.urandom(150 * KiB), os.urandom(120 * KiB)
    good_sha, bad_sha = origin.put(good), origin.put(bad)

    async def fill():
        cache = await ReadCache.open(tmp_path / "cache", 1024 * KiB, origin)
        for sha256, data in ((good_sha, good), (bad_sha, bad)):
            assert await read_all(cache, sha256, len(data)) == data
        cache.close()

    asyncio.run(fill())
    assert origin.opened == 2
    with open(tmp_path / "cache" / "blobs" / bad_sha[:2] / bad_sha, "r+b") as file:
        file.write(b"rot")
    (tmp_path / "cache" / "filling" / "leftover").write_bytes(b"x")  # a fill a crash cut

    async def restarted():
        cache = await ReadCache.open(tmp_path / "cache", 1024 * KiB, origin)
        assert cache.files == 2 and cache.held == len(good) + len(bad)
        assert os.listdir(cache.filling) == []
        assert cache.acquire(good_sha) is None  # not trusted before its hash is checked again
        assert await read_all(cache, good_sha, len(good)) == good
        assert origin.opened == 2  # the check, not the store
        assert await read_all(cache, bad_sha, len(bad)) == bad
        assert origin.opened == 3 and cache.discards["corrupt"] == 1
        fd = cache.acquire(good_sha)
        assert fd is not None
        cache.release(good_sha, fd)
        cache.close()

    asyncio.run(restarted())


def test_a_file_the_disk_stored_wrongly_is_caught_by_its_first_read_and_fetched_again(origin, tmp_path, monkeypatch):
    """Issue 22 §10. The fill's hash is of the bytes as they came from the store (a blob within
    WINDOW: all from memory); a disk that stores one of them wrongly, a fault that no size,
    time or inode shows once the file is in place, was served by every hit until a restart.
    Now the file's first read hashes it from the disk: the bad file is dropped (counted as a
    `corrupt` discard) and fetched again behind that read, which gets the right bytes; the new
    file is checked by its own first read, and then hits."""
    data = os.urandom(2 * FILL_CHUNK + 5)
    sha256 = origin.put(data)
    real_write, faults = os.write, []

    def storing_one_byte_wrong(fd: int, payload) -> int:
        written = real_write(fd, payload)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if f"{os.sep}filling{os.sep}" in path and not faults:  # the fill's first write
            where = os.lseek(fd, 0, os.SEEK_CUR) - written + 7
            other = os.open(path, os.O_RDWR)  # not the fill's (direct) descriptor
            try:
                os.pwrite(other, bytes([os.pread(other, 1, where)[0] ^ 0xFF]), where)
            finally:
                os.close(other)
            faults.append(where)
        return written

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 64 * 1024 * KiB, origin)
        monkeypatch.setattr(os, "write", storing_one_byte_wrong)
        try:
            assert await read_all(cache, sha256, len(data)) == data  # sent from the fill's buffers
        finally:
            monkeypatch.undo()
        assert faults == [7] and cache.fills["ok"] == 1
        with open(cache.path_of(sha256), "rb") as file:
            assert file.read() != data  # what the disk holds
        assert cache.discards == {"changed": 0, "corrupt": 0}
        assert await read_all(cache, sha256, len(data)) == data  # the first read: checked, refetched
        assert cache.discards == {"changed": 0, "corrupt": 1} and cache.fills["ok"] == 2 and origin.opened == 2
        with open(cache.path_of(sha256), "rb") as file:
            assert file.read() == data  # replaced
        assert not hit(cache, sha256)  # the new file is not trusted before its own first read
        assert await read_all(cache, sha256, len(data)) == data and origin.opened == 2
        assert hit(cache, sha256) and cache.discards["corrupt"] == 1
        cache.close()

    asyncio.run(run())
