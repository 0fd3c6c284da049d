"""Reading a plain-http object store on connections of our own (shared/storage/s3_direct.py), on a
real SeaweedFS. Downloads spliced to the client (shared/download/object_transfer.py), with real
processes: byte-exact with Range and If-Range, every byte still granted by the token buckets, a
store that dies in the middle cuts the transfer (counted), never a short or padded body; the path
is told apart by `arkvory_download_splice_bytes_total`; an https store keeps obstore's stream; an
answer's head is bounded; the body bytes that come with it reach a pipe of one page whole. The
read cache's fill received into reused buffers (read_cache.py): byte-exact, and a connection cut
mid-fill fails its readers and keeps nothing; a slow first reader holds up neither the fill nor
the readers behind it; the fill's hash runs at nice 10."""

from __future__ import annotations

import asyncio
import dataclasses
import ctypes
import hashlib
import os
import threading
import time
import urllib.parse

import httpx
import pytest

from arkvory.shared.storage import StorageUnavailable, s3_direct
from arkvory.shared.storage.cache_files import HASH_NICE, BufferPool, shared_buffer
from arkvory.shared.storage.read_cache import ReadCache, _Flight, _hash_behind
from arkvory.shared.storage.s3 import ObjectStorage, blob_key
from arkvory.shared.storage.s3_client import ObjectStore
from arkvory.shared.storage.s3_direct import MAX_HEAD_BYTES, DirectRange

from .harness import ADMIN_TOKEN, eventually_async
from .s3cluster import s3_bucket, s3_cluster, seaweedfs  # noqa: F401  (pytest fixtures)
from .tcpproxy import TcpProxy

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

KiB, MiB = 1024, 1024 * 1024
REPO = "builds"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STREAMING = 256 * MiB  # a share of object_transfer.STREAM_SHARE: one streamed (spliced) GET


def metric(process, name: str) -> float:
    with process.client() as client:
        text = client.get("/health/metrics").text
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def pattern(size: int) -> bytes:
    """`size` bytes that differ from MiB to MiB (a misplaced MiB shows), cheap to make."""
    block = bytes(range(256)) * 4096
    return b"".join(i.to_bytes(8, "big") + block[8:] for i in range(-(-size // MiB)))[:size]


def upload(process, data: bytes, name: str = "big.bin") -> str:
    with process.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code in (201, 409)
        made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": name}, content=data)
    assert made.status_code == 201, made.text
    return f"/api/v1/repositories/{REPO}/artifacts/{made.json()['id']}/content"


@pytest.mark.soak  # 10 s or more of real time (the other splice tests of this module stay in the default tier): .ci/run runs it (pytest -m soak)
def test_spliced_downloads_are_byte_exact_with_ranges_and_every_byte_is_granted(s3_cluster):
    rate = STREAMING  # the writer's share of the total (no gateway runs: nobody else uses it)
    writer = s3_cluster.writer(s3_cluster.shared_env(slots=2, total=2 * rate)).wait_ready()
    size = 128 * MiB + 4321
    data = pattern(size)
    path = upload(writer, data)

    # The whole blob, timed: the buckets hold it to the share (unmetered it takes a third of it).
    digest = hashlib.sha256()
    started = time.monotonic()
    with httpx.stream("GET", writer.url + path, headers=AUTH, timeout=60) as answer:
        assert answer.status_code == 200
        etag = answer.headers["ETag"]
        for chunk in answer.iter_bytes():
            digest.update(chunk)
    elapsed = time.monotonic() - started
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    floor = (size - min(rate // 10, MiB)) / rate
    assert elapsed >= floor * 0.97, f"{size} B at {rate} B/s must take >= {floor:.2f} s, took {elapsed:.2f} s"

    resume_at = size - 9 * MiB - 5
    ranges = ((MiB + 3, 17 * MiB), (0, 4 * MiB), (size - 6 * MiB - 1, size - 1))
    with writer.client(timeout=60) as client:
        for first, last in ranges:
            part = client.get(path, headers={"Range": f"bytes={first}-{last}"})
            assert part.status_code == 206 and part.headers["Content-Range"] == f"bytes {first}-{last}/{size}"
            assert part.content == data[first:last + 1]
        resumed = client.get(path, headers={"Range": f"bytes={resume_at}-", "If-Range": etag})
        assert resumed.status_code == 206 and resumed.content == data[resume_at:]
        changed = client.get(path, headers={"Range": f"bytes={resume_at}-", "If-Range": '"sha256:other"'})
        assert changed.status_code == 200 and changed.headers["Content-Length"] == str(size)
        assert hashlib.sha256(changed.content).hexdigest() == digest.hexdigest()
    sent = 2 * size + sum(last + 1 - first for first, last in ranges) + size - resume_at
    assert metric(writer, "arkvory_download_payload_bytes_total") == sent
    # All by splice, but for the few pieces copied when the client's socket was full.
    assert 0.9 * sent <= metric(writer, "arkvory_download_splice_bytes_total") <= sent
    assert metric(writer, 'arkvory_storage_read_requests_total{result="ok"}') == 6


def test_the_store_killed_mid_splice_cuts_the_download_and_counts_it(s3_cluster, seaweedfs):
    writer = s3_cluster.writer().wait_ready()
    data = pattern(64 * MiB)
    path = upload(writer, data)
    received = bytearray()
    outcome: dict[str, object] = {}
    reading = threading.Event()

    def download() -> None:
        try:
            with httpx.stream("GET", writer.url + path, headers=AUTH, timeout=30) as answer:
                assert answer.status_code == 200
                for chunk in answer.iter_bytes():
                    received.extend(chunk)
                    if len(received) >= MiB:
                        reading.set()
                        time.sleep(0.002 if seaweedfs.running else 0)  # slow: the store holds the rest
            outcome["result"] = "complete"
        except httpx.HTTPError as exc:
            outcome["result"] = exc

    thread = threading.Thread(target=download)
    thread.start()
    assert reading.wait(30)
    seaweedfs.kill()
    thread.join(60)
    assert isinstance(outcome.get("result"), httpx.HTTPError), outcome  # cut, not completed short
    assert 0 < len(received) < len(data) and bytes(received) == data[:len(received)]
    assert metric(writer, 'arkvory_transfer_aborts_total{direction="download",reason="storage_unavailable"}') == 1
    assert metric(writer, "arkvory_download_splice_bytes_total") > 0
    with writer.client() as client:
        refused = client.get(path)
    assert refused.status_code == 503 and refused.json()["code"] == "unavailable"


def test_an_https_or_proxied_store_keeps_the_stream_and_a_store_s_answer_is_bounded(
    s3_cluster, tmp_path, monkeypatch
):
    settings = s3_cluster.settings().object_store
    assert settings is not None and settings.endpoint_url.startswith("http://")
    sha256 = "ab" * 32
    plain = ObjectStorage(tmp_path, settings)
    assert isinstance(plain.open_direct_range(sha256, 0, MiB), DirectRange)
    secure = ObjectStorage(tmp_path, dataclasses.replace(
        settings, endpoint_url=settings.endpoint_url.replace("http://", "https://")
    ))
    assert secure.open_direct_range(sha256, 0, MiB) is None
    # obstore's client goes through an HTTP proxy the environment names: so the store is left to it.
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert ObjectStorage(tmp_path, settings).open_direct_range(sha256, 0, MiB) is None
    monkeypatch.setenv("NO_PROXY", urllib.parse.urlsplit(settings.endpoint_url).hostname)
    assert ObjectStorage(tmp_path, settings).open_direct_range(sha256, 0, MiB) is not None
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.delenv("NO_PROXY")

    async def endless_head() -> str:
        """A 'store' whose answer's head never ends: refused after MAX_HEAD_BYTES."""
        async def answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 206 Partial Content\r\n")
            try:
                for _ in range(MAX_HEAD_BYTES // 16 + 10):
                    writer.write(b"x-filler: 12345\r\n")
                    await writer.drain()
            except ConnectionError:
                pass
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        hostile = ObjectStorage(tmp_path, dataclasses.replace(settings, endpoint_url=f"http://127.0.0.1:{port}"))
        piped = hostile.open_direct_range(sha256, 0, MiB)
        assert piped is not None
        try:
            await piped.fill()
        except StorageUnavailable as exc:
            return exc.message
        finally:
            await piped.aclose()
            server.close()
        return "no error"

    assert f"exceeds {MAX_HEAD_BYTES} bytes" in asyncio.run(asyncio.wait_for(endless_head(), 30))


def test_a_pipe_of_one_page_still_takes_the_body_bytes_that_came_with_the_head(
    s3_cluster, tmp_path, monkeypatch
):
    """A user past /proc/sys/fs/pipe-user-pages-soft (64 pipes of 1 MiB: two processes of 32
    streams) gets pipes of one or two pages, and F_SETPIPE_SZ cannot grow them: the body bytes
    that arrive with the answer's head must still all reach the pipe, never an AssertionError or
    bytes lost between the head and the splices."""
    size = 3 * MiB + 5
    data = pattern(size)
    sha256 = hashlib.sha256(data).hexdigest()
    s3_cluster.put_object(blob_key(sha256), data)
    page = os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(s3_direct, "PIPE_BYTES", page)  # the pipe such a user gets
    storage = storage_for(s3_cluster, tmp_path)

    async def run() -> bytes:
        source = storage.open_direct_range(sha256, 0, size)
        assert source is not None
        out = bytearray()
        try:
            while len(out) < size:
                await source.fill()
                assert source.buffered <= page
                out += source.read(source.buffered)
        finally:
            await source.aclose()
        return bytes(out)

    assert asyncio.run(asyncio.wait_for(run(), 60)) == data


# --- the read cache's fill received on a connection of its own ---------------------------------


class CountingStorage(ObjectStorage):
    """The object-store backend against the test's bucket, counting the direct ranges it opens."""

    def __init__(self, root, settings, store) -> None:
        super().__init__(root, settings, store)
        self.direct = 0

    def open_direct_range(self, sha256, start, length, **options):
        self.direct += 1
        return super().open_direct_range(sha256, start, length, **options)


def storage_for(s3_cluster, root, endpoint: str | None = None) -> CountingStorage:
    settings = s3_cluster.settings().object_store
    assert settings is not None
    if endpoint is not None:
        settings = dataclasses.replace(settings, endpoint_url=endpoint)
    return CountingStorage(root, settings, ObjectStore(settings, connect_timeout=2.0, read_timeout=5.0))


async def read_through(cache: ReadCache, sha256: str, size: int) -> bytes:
    reader = cache.reader(sha256, size, 0, size, lambda start, length: pytest.fail("fell back"))
    assert reader is not None
    out = bytearray()
    try:
        while len(out) < size:
            await reader.fill()
            out += reader.take(reader.buffered)
    finally:
        await reader.aclose()
    return bytes(out)


def test_a_chunk_is_reused_only_once_nothing_refers_to_it():
    pool = BufferPool(64 * KiB)
    first = pool.take()
    address = first[:1]
    second = pool.take()  # the first is in use: a new one
    assert len(pool) == 2
    del first
    assert len(pool.take()) == 64 * KiB and len(pool) == 3  # a slice of the first still lives
    del address, second
    pool.take()
    assert len(pool) == 3  # one of them again



def test_a_pool_with_keep_holds_at_most_that_many_and_reuses_them():
    """The writer's upload buffers: more in use at once are made fresh and dropped after use."""
    pool = BufferPool(64 * KiB, keep=1, allocate=shared_buffer)
    first, second = pool.take(), pool.take()  # the second is beyond `keep`: not held
    assert len(pool) == 1
    second_address = ctypes.addressof(ctypes.c_char.from_buffer(second))
    first_address = ctypes.addressof(ctypes.c_char.from_buffer(first))
    del first, second
    again = pool.take()
    assert ctypes.addressof(ctypes.c_char.from_buffer(again)) == first_address != second_address
    assert len(pool) == 1

def _huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        return sum(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))


def test_a_fill_s_buffers_are_in_huge_pages_where_the_host_allows_them():
    """O_DIRECT pins every page it writes from: in 4 KiB pages that cost the fill's writer
    ~0.07 CPU s/GiB more here. (Python's default anonymous map is shared memory, never huge.)"""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            mode = setting.read()
    except OSError:
        pytest.skip("no transparent huge pages on this kernel")
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off here (/sys/kernel/mm/transparent_hugepage/enabled)")
    before = _huge_kib()
    pool = BufferPool(8 * MiB)
    view = pool.take()
    view[:] = bytes(len(view))  # touched: the pages exist now
    assert _huge_kib() - before >= 2048
    del view


def test_a_cache_fill_from_a_plain_http_store_is_received_on_its_own_connection(s3_cluster, tmp_path):
    size = 21 * MiB + 77  # whole chunks, then a tail that is not a whole block
    data = pattern(size)
    sha256 = hashlib.sha256(data).hexdigest()
    s3_cluster.put_object(blob_key(sha256), data)
    empty = hashlib.sha256(b"").hexdigest()
    s3_cluster.put_object(blob_key(empty), b"")
    storage = storage_for(s3_cluster, tmp_path)

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 64 * MiB, storage)
        bodies = await asyncio.gather(*(read_through(cache, sha256, size) for _ in range(3)))
        await cache.drained()
        assert all(body == data for body in bodies)
        assert storage.direct == 1 and cache.fills == {"ok": 1, "failed": 0, "corrupt": 0, "abandoned": 0}
        assert await read_through(cache, sha256, size) == data  # its first read checks the file
        await cache.drained()
        fd = cache.acquire(sha256)
        assert fd is not None and os.pread(fd, 100, size - 100) == data[-100:]
        cache.release(sha256, fd)
        # An empty blob has nothing to receive: the store's stream, as before.
        for _ in range(2):  # filled, then checked
            await (cache.reader(empty, 0, 0, 0, lambda start, length: pytest.fail("fell back"))).aclose()
            await cache.drained()
        fd = cache.acquire(empty)
        assert cache.fills["ok"] == 2 and fd is not None and os.fstat(fd).st_size == 0
        cache.release(empty, fd)
        cache.close()

    asyncio.run(run())


def test_a_cache_fill_cut_mid_way_fails_its_readers_and_keeps_nothing(s3_cluster, tmp_path):
    size = 96 * MiB
    data = pattern(size)
    sha256 = hashlib.sha256(data).hexdigest()
    s3_cluster.put_object(blob_key(sha256), data)
    endpoint = urllib.parse.urlsplit(s3_cluster.settings().object_store.endpoint_url)
    with TcpProxy(endpoint.hostname, endpoint.port) as proxy:
        storage = storage_for(s3_cluster, tmp_path, f"http://127.0.0.1:{proxy.port}")

        async def run():
            cache = await ReadCache.open(tmp_path / "cache", 128 * MiB, storage)
            reader = cache.reader(sha256, size, 0, size, lambda start, length: pytest.fail("fell back"))
            got = bytearray()
            with pytest.raises(StorageUnavailable):
                while len(got) < size:
                    await reader.fill()
                    got += reader.take(reader.buffered)
                    if len(got) >= 8 * MiB and not proxy_cut:
                        proxy_cut.append(await asyncio.to_thread(proxy.cut))
            await reader.aclose()
            await cache.drained()
            assert 8 * MiB <= len(got) < size and bytes(got) == data[:len(got)]
            assert storage.direct == 1 and cache.fills["failed"] == 1
            assert cache.held == 0 and cache.acquire(sha256) is None
            await eventually_async(lambda: os.listdir(cache.filling) == [], "the fill's file unlinked")
            cache.close()

        proxy_cut: list = []
        asyncio.run(asyncio.wait_for(run(), 60))


# --- the fill's hash out of the way, and readers that do not wait for each other -----------------


def test_a_fill_s_hash_runs_at_nice_10_in_the_ordinary_class(tmp_path):
    """The hash of a fill trails it at nice >= HASH_NICE, so the downloads beside it get the CPU
    first; never at SCHED_IDLE (preempted while it holds the GIL, such a thread could stall the
    event loop and the lease for as long as the host stays busy); the digest is that of all
    the bytes."""
    first, rest = os.urandom(8 * MiB), bytes(96 * MiB)
    seen: set[tuple[str, int, int]] = set()
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            for thread in threading.enumerate():
                if thread.name.startswith("arkvory-cache-hash") and thread.native_id is not None:
                    try:
                        policy = os.sched_getscheduler(thread.native_id)
                        nice = os.getpriority(os.PRIO_PROCESS, thread.native_id)
                    except OSError:
                        continue  # it just ended
                    seen.add((thread.name.rsplit("_", 1)[0], policy, nice))
            time.sleep(0.0005)

    async def run() -> str:
        flight = _Flight("ab" * 32, len(first) + len(rest), str(tmp_path / "never-read"))
        hashing = asyncio.ensure_future(_hash_behind(flight, flight.path))
        flight.arrived(memoryview(first))
        for _ in range(300):  # its thread started and sampled (at most 3 s)
            if any(name.startswith("arkvory-cache-hash") for name, _, _ in seen):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the first 8 MiB hashed (in memory), the rest not there yet
        flight.arrived(memoryview(rest))
        return await asyncio.wait_for(hashing, 30)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        digest = asyncio.run(run())
    finally:
        sampling.set()
        sampler.join(10)
    assert digest == hashlib.sha256(first + rest).hexdigest()
    # (A sample may also catch the thread before its initializer ran: the process's own policy.)
    sampled = {(policy, nice) for name, policy, nice in seen if name == "arkvory-cache-hash"}
    assert (os.SCHED_OTHER, HASH_NICE) in sampled and all(policy != os.SCHED_IDLE for policy, _ in sampled)


def test_a_slow_first_reader_stalls_neither_the_fill_nor_the_readers_behind_it(s3_cluster, tmp_path):
    size = 40 * MiB + 123
    data = pattern(size)
    sha256 = hashlib.sha256(data).hexdigest()
    s3_cluster.put_object(blob_key(sha256), data)
    storage = storage_for(s3_cluster, tmp_path)

    async def run():
        cache = await ReadCache.open(tmp_path / "cache", 64 * MiB, storage)
        first = cache.reader(sha256, size, 0, size, lambda start, length: pytest.fail("fell back"))
        assert first is not None
        await first.fill()
        head = bytes(first.take(MiB))  # then it reads nothing while the others go
        second = await asyncio.wait_for(read_through(cache, sha256, size), 30)
        await asyncio.wait_for(cache.drained(), 30)  # the fill ended, hash checked, with `first` idle
        assert second == data and cache.fills == {"ok": 1, "failed": 0, "corrupt": 0, "abandoned": 0}
        rest = bytearray(head)
        try:
            while len(rest) < size:
                await first.fill()
                rest += first.take(first.buffered)
        finally:
            await first.aclose()
        assert bytes(rest) == data and storage.direct == 1
        cache.close()

    asyncio.run(run())


def test_a_store_that_takes_the_connection_and_sends_nothing_costs_one_read_timeout(s3_cluster, tmp_path):
    """A store that accepts connections and then says nothing (stalled behind a TCP proxy): the
    direct read gives up after one read timeout, as obstore does (no retry starts once the
    store's retry_timeout has passed), not after one per attempt while a download waits."""
    data = pattern(MiB)
    sha256 = hashlib.sha256(data).hexdigest()
    s3_cluster.put_object(blob_key(sha256), data)
    endpoint = urllib.parse.urlsplit(s3_cluster.settings().object_store.endpoint_url)
    with TcpProxy(endpoint.hostname, endpoint.port) as proxy:
        settings = dataclasses.replace(
            s3_cluster.settings().object_store, endpoint_url=f"http://127.0.0.1:{proxy.port}"
        )
        store = ObjectStore(settings, connect_timeout=0.5, read_timeout=5.5)  # retry_timeout: 5 s
        storage = ObjectStorage(tmp_path, settings, store)

        async def run():
            counted = []
            reader = storage.open_direct_range(sha256, 0, len(data), counted=counted.append)
            assert reader is not None
            proxy.stall()
            started = time.monotonic()
            with pytest.raises(StorageUnavailable, match="timed out"):
                await reader.open()
            took = time.monotonic() - started
            reader.close()
            assert 5.5 <= took < 8, took  # three attempts took 17 s
            assert counted == ["failed"]

        asyncio.run(asyncio.wait_for(run(), 60))
