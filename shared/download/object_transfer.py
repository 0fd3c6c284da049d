"""Streaming a blob that is not a local file (an object store, SPEC §11) through admission and the
token buckets: transfer.py's `BlobResponse` hands over here when the storage gives it no
descriptor (`BlobStorage.acquire_file` is None).

How the bytes come from the store:
- **Unthrottled** (no rate at all, or a fair share of at least STREAM_SHARE while fewer than
  STREAMS_AT_ONCE such streams are open): one streaming range GET of the whole range, read 1 MiB
  at a time (obstore hands Python ~one buffer per MiB; docs/s3-client-choice.md), each buffer
  written to the connection as it is, with the connection's flow control as the only pace.
  Segments would cost a request's latency every few MiB and a copy of every byte (measured:
  0.6× curl in segments, 0.8× streamed, for a 1 GiB cold read on 2 cores).
  From a plain-http store to a plain-TCP client that stream is **spliced** instead: the store's
  answer arrives in a pipe on a connection of its own (shared/storage/s3_direct.py `DirectRange`)
  and goes to the client with splice(2) (`ConnectionHandle.splice`), never entering user space:
  ~0.25 CPU s/GiB instead of ~0.6 (docs/performance.md, issue 16). When the client's socket is
  full, one small copied piece goes through the transport to learn when it drains, as the
  sendfile path does (transfer.py `Payload`). Bodies under SPLICE_MIN_BYTES keep obstore's
  pooled connections (a connection of their own would cost more than the copies it saves).
- **Throttled**: bounded segments, each one range GET read whole before its first byte is sent
  (its connection goes straight back to the pool), the next one fetched once half of the current
  one is sent (a transfer never waits on the store between segments). A transfer's first segment
  is small (FIRST_SEGMENT); each next one holds about SEGMENT_S of the rate the current one is
  actually sent at, at most twice it and never more than SEGMENT_S of its fair share (the
  process rate over the transfers sending, within the principal's rate), between MIN_SEGMENT and
  MAX_SEGMENT. At most FETCHES_AT_ONCE segment GETs run at once per process. One open GET per
  slow download would keep a connection and its buffers per download (366 MiB for 1,000 of
  them); segments keep at most about 1.5 × SEGMENT_S of the process's rate in memory, whatever
  the number of downloads. Later segments carry `If-Match` with the first one's ETag, so a body
  never joins two versions of an object.

With a read cache (ARKVORY_CACHE_MAX_BYTES), a miss reads behind the digest's one fill instead
(shared/storage/read_cache.py `CacheReader`, the same `fill`/`take` as `StoreSource`), through
the same loop and buckets; a hit never comes here (transfer.py sends the cached file).

Tokens are asked only for bytes already read (a slow store never holds tokens others could use),
and buffers go to the socket as zero-copy memoryviews. Before every write, as in payload.py's
Payload: tokens from both buckets, the socket writable within the send timeout; at the write,
the payload gate (the lease and pins trusted). The loop runs in the same frame as a file's
(payload.py `send_payload`): a lost lease ends both alike, with a reset counted `lease_lost`.

Failures: a store that the probe already knows is down answers 503 `unavailable` at once; one
that fails before the first byte is sent answers 503 `unavailable` (Retry-After) and asks the
probe to look (shared/storage/health.py); one that fails later cuts the connection (a reset,
counted in `arkvory_transfer_aborts_total{reason="storage_unavailable"}`), never a padded or
silently short body. An object that is not there is decided by the database, as for a missing
file: the artifact is gone (404) or its content is (503 `content_unavailable`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Send

from arkvory.shared.errors import ContentUnavailable, LeaseLost, TransferAborted, Unavailable
from arkvory.shared.http.protocol import ConnectionHandle
from arkvory.shared.storage import BlobNotFound, BlobStorage, StorageError, StorageUnavailable

from .catalog import Artifact, require_artifact
from .payload import COPY_PIECE_BYTES, UNTHROTTLED_CHUNK, SentResponse, _client_gone, send_payload, transfer_aborter
from .serving import ServingProcess

log = logging.getLogger("arkvory.content")


class StoreResponse(SentResponse):
    """What this module needs of the response whose body it reads from the store (transfer.py's
    BlobResponse, which hands over here: the import runs from transfer.py to this module only)."""

    runtime: ServingProcess
    artifact: Artifact
    status_code: int
    raw_headers: list[tuple[bytes, bytes]]


KiB, MiB = 1024, 1024 * 1024
UNTHROTTLED_BUFFER = 1 * MiB
STREAM_SHARE = 256 * MiB  # a transfer whose fair share is at least this reads one streaming GET
STREAMS_AT_ONCE = 32  # streaming GETs open per process: bounds their buffers and connections
SEGMENT_S = 0.5
FIRST_SEGMENT = 128 * KiB
MIN_SEGMENT = 64 * KiB
MAX_SEGMENT = 8 * MiB
FETCHES_AT_ONCE = 32  # segment GETs in flight per process: bounds their buffers and connections
RETRY_AFTER_S = 2
SPLICE_MIN_BYTES = 4 * MiB  # smaller streamed bodies keep obstore's pooled connections


class StoreSource:
    """The bytes [start, start + length) of one blob from the store, as buffers to send."""

    def __init__(
        self,
        storage: BlobStorage,
        sha256: str,
        start: int,
        length: int,
        *,
        segment_cap: Callable[[], int] | None,
        counted: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._storage = storage
        self._sha256 = sha256
        self._offset = start  # of the next byte asked of the store
        self._end = start + length
        self._segment_cap = segment_cap  # None: one streaming GET (unthrottled)
        self._current = 0  # bytes of the segment being sent, and since when
        self._current_since = 0.0
        self._counted = counted
        self._buffers: collections.deque[memoryview] = collections.deque()
        self.buffered = 0  # bytes read from the store and not yet taken
        self._stream: Any = None
        # The next buffer (unthrottled) or segment (throttled) on its way.
        self._ahead: asyncio.Future | None = None
        self.etag: str | None = None
        if segment_cap is None:
            _open_streams().add(self)

    async def fill(self) -> None:
        """Have at least one byte buffered (reads the next segment or buffer from the store);
        StorageError when the store fails, BlobNotFound when the object is not there."""
        while not self.buffered:
            if self._segment_cap is None:
                await self._next_buffer()
                continue
            ahead, self._ahead = self._ahead, None
            segment = await (ahead if ahead is not None else self._segment(min(FIRST_SEGMENT, self._segment_cap())))
            self._keep(segment)
            self._current, self._current_since = len(segment), time.monotonic()

    def take(self, most: int) -> memoryview:
        """Up to `most` buffered bytes (at least one; `fill` first), without copying."""
        head = self._buffers[0]
        if len(head) <= most:
            self._buffers.popleft()
        else:
            self._buffers[0] = head[most:]
            head = head[:most]
        self.buffered -= len(head)
        if (
            self._segment_cap is not None and self._ahead is None and self._offset < self._end
            and self.buffered <= self._current // 2
        ):
            # Half of this segment is sent: fetch the next one meanwhile, so that a transfer
            # never waits for the store between two segments.
            self._ahead = asyncio.ensure_future(self._segment(self._next_segment_size()))
        return head

    def _segment(self, wanted: int) -> Awaitable[bytearray]:
        """Reserve the next `wanted` bytes (fewer at the end) and return their fetch."""
        size = min(wanted, self._end - self._offset)
        start, self._offset = self._offset, self._offset + size
        return self._fetch(start, size)

    async def _fetch(self, start: int, size: int) -> bytearray:
        try:
            async with _fetch_gate():
                async with self._storage.open_range(
                    self._sha256, start, size, chunk_size=size, if_match=self.etag
                ) as reader:
                    if self.etag is None and getattr(reader, "stat", None) is not None:
                        self.etag = reader.stat.etag
                    # Copied into a buffer of exactly the segment's size: the client library's
                    # buffers may share (and keep alive) a larger read buffer of its connection.
                    segment = bytearray(size)
                    filled = await reader.readinto(segment)
                    if filled != size:
                        raise StorageUnavailable(f"the read of {self._sha256} ended after {filled} of {size} bytes")
        except StorageError:
            self._counted("failed")
            raise
        self._counted("ok")
        return segment

    def _next_segment_size(self) -> int:
        """SEGMENT_S of the rate this transfer's current segment is being sent at, at most twice
        that segment and never above the fair share's cap."""
        assert self._segment_cap is not None
        sent = self._current - self.buffered
        rate = sent / max(time.monotonic() - self._current_since, 1e-3)
        size = min(rate * SEGMENT_S, 2 * self._current, self._segment_cap())
        return int(min(max(size, MIN_SEGMENT), MAX_SEGMENT))

    async def _next_buffer(self) -> None:
        if self._stream is None:
            self._stream = self._storage.open_range(
                self._sha256, self._offset, self._end - self._offset, chunk_size=UNTHROTTLED_BUFFER
            )
            try:
                await self._stream.__aenter__()
            except StorageError:
                self._counted("failed")
                raise
            self._counted("ok")
        ahead, self._ahead = self._ahead, None
        # Never ends short: StorageUnavailable instead.
        buffer = await (ahead if ahead is not None else self._stream.__anext__())
        self._offset += self._keep(buffer)
        if self._offset < self._end:
            # One buffer read ahead while this one goes to the socket: the store and the
            # client's connection then work at the same time, not in turns.
            self._ahead = asyncio.ensure_future(self._stream.__anext__())

    def _keep(self, buffer: Any) -> int:
        view = memoryview(buffer)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if len(view):
            self._buffers.append(view)
            self.buffered += len(view)
        return len(view)

    async def aclose(self) -> None:
        """Drop what is buffered and cut an open GET (its connection is closed, not reused)."""
        self._buffers.clear()
        self.buffered = 0
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()  # not awaited: this may run in a task that is being cancelled
            ahead.add_done_callback(_retrieved)
        _open_streams().discard(self)
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # a read-ahead nobody waits for any more: its error is not news


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _fetch_gate() -> asyncio.Semaphore:
    """The process's bound on segment GETs in flight (one event loop serves a process)."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(FETCHES_AT_ONCE)
    return gate


_streams: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet] = weakref.WeakKeyDictionary()


def _open_streams() -> weakref.WeakSet:
    """The process's sources reading one streaming GET (a source dropped unclosed leaves it)."""
    loop = asyncio.get_running_loop()
    streams = _streams.get(loop)
    if streams is None:
        streams = _streams[loop] = weakref.WeakSet()
    return streams


def _streams_open() -> int:
    return len(_open_streams())


def segment_cap_for(runtime: ServingProcess) -> Callable[[], int] | None:
    """The largest segment now: SEGMENT_S of one transfer's fair share; None for one streaming
    GET: when nothing is metered, or when this transfer's share is at least STREAM_SHARE and
    fewer than STREAMS_AT_ONCE streams are open (a fast transfer is not one of many slow ones,
    and its memory is a buffer or two, not its segments')."""
    bandwidth = runtime.bandwidth
    if bandwidth.unlimited:
        return None

    def share() -> float:
        rates = []
        if bandwidth.bytes_per_second is not None:
            rates.append(bandwidth.bytes_per_second / max(1, runtime.admission.active))
        if bandwidth.per_principal_bytes_per_second is not None:
            rates.append(bandwidth.per_principal_bytes_per_second)
        return min(rates) if rates else float(MAX_SEGMENT / SEGMENT_S)

    def size() -> int:
        return int(min(max(share() * SEGMENT_S, MIN_SEGMENT), MAX_SEGMENT))

    if share() >= STREAM_SHARE and _streams_open() < STREAMS_AT_ONCE:
        return None
    return size


async def stream_from_store(
    response: StoreResponse, send: Send, handle: ConnectionHandle | None, start: int, length: int
) -> None:
    """The body of `response` from the store; raises (before the response starts) what the
    caller answers as an error, and cuts the connection after that."""
    runtime = response.runtime
    storage = runtime.storage
    assert storage is not None
    health = runtime.storage_health
    reads = runtime.metrics.storage_reads
    sha256 = response.artifact.sha256
    cache = getattr(storage, "cache", None)
    # A file of the read cache awaiting its first read's check needs no store unless it fails.
    if not health.available and (cache is None or not cache.holds(sha256)):
        raise Unavailable(f"the storage {storage.location} does not answer now; retry shortly", retry_after=RETRY_AFTER_S)

    def counted(result: str) -> None:
        reads.labels(result=result).inc()

    def from_store(first: int, count: int) -> StoreSource:
        return StoreSource(storage, sha256, first, count, segment_cap=segment_cap_for(runtime), counted=counted)

    # A miss of the read cache reads behind the digest's one fill (shared/storage/read_cache.py);
    # a blob it will not hold comes from the store directly. The principal (the per-principal
    # budget's id) is the fill's owner: the cache's fair sharing.
    source: Any = None if cache is None else cache.reader(
        sha256, response.artifact.size, start, length, from_store, owner=response.principal.id
    )
    piped = False
    if source is None and _may_splice(runtime, handle, length):
        source = storage.open_direct_range(sha256, start, length, counted=counted)  # type: ignore[attr-defined]
        if source is not None:  # None: a store reached over TLS
            piped = True
            _open_streams().add(source)  # counts among the streaming GETs (STREAMS_AT_ONCE)
    if source is None:
        source = from_store(start, length)
    try:
        try:
            await source.fill()  # before any header: a failure is still an ordinary answer
        except BlobNotFound:
            await _missing_object(response)
        except StorageError as exc:
            health.suspect(exc.message)
            log.warning("download of %s: the storage failed before the first byte: %s", response.artifact.sha256, exc.message)
            raise Unavailable(
                f"the storage {storage.location} cannot be read now; retry shortly", retry_after=RETRY_AFTER_S
            ) from None
        if handle is None:
            await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
            await _send_through_asgi(response, source, length, send)
            return
        sending = _send_response(response, source, handle, send, length, piped=piped)
        if await send_payload(runtime, handle, transfer_aborter(runtime, handle), sending):
            handle.complete()  # the last body message's bookkeeping (transfer.py does the same)
    finally:
        _open_streams().discard(source)
        await source.aclose()


def _may_splice(runtime: ServingProcess, handle: ConnectionHandle | None, length: int) -> bool:
    """A streamed (not segmented) body of SPLICE_MIN_BYTES or more, to a plain-TCP client, from
    a storage that can hand its bytes over in a pipe (an object store's `open_direct_range`)."""
    return (
        handle is not None and handle.can_sendfile and length >= SPLICE_MIN_BYTES
        and hasattr(runtime.storage, "open_direct_range") and segment_cap_for(runtime) is None
    )


async def _send_response(
    response: StoreResponse, source: Any, handle: ConnectionHandle, send: Send, remaining: int, *, piped: bool = False
) -> bool:
    """The head, then the body: True when every byte was handed over; False when the connection
    is gone or was cut. `source` hands out buffers (`take`), or, `piped`, holds its bytes in a
    pipe (a `storage.PipedReader`: spliced to the client). Runs in `payload.send_payload`, which
    ends it when the lease does (a write the payload gate refuses, or buckets closed)."""
    runtime = response.runtime
    bandwidth = runtime.bandwidth
    principal_id = response.principal.id
    timeout = runtime.settings.send_timeout_s
    payload = runtime.metrics.payload_bytes
    chunk = UNTHROTTLED_CHUNK if bandwidth.unlimited else bandwidth.quantum_bytes
    if not await handle.writable(timeout):
        response._send_timed_out(handle)
        return False
    await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
    if piped:
        # "Writable" then means "nothing queued": a splice must never overtake queued bytes.
        handle.transport.set_write_buffer_limits(high=0, low=0)
    while remaining:
        if not source.buffered:
            try:
                await source.fill()
            except StorageError as exc:
                _cut_for_storage(response, handle, exc)
                return False
        granted = await bandwidth.grant(principal_id, min(remaining, chunk, source.buffered))
        while granted:
            if not await handle.writable(timeout):
                response._send_timed_out(handle)
                return False
            if handle.lost:
                _client_gone(runtime, handle, "it closed the connection")
                return False
            # No check of the payload gate here: it may close right after one (a deadline, or
            # the lease's thread), so the write itself asks it (send_payload handles a refusal).
            if piped:
                size = 0
                if not handle.buffered:
                    try:
                        size = handle.splice(source.pipe_fd, granted)
                    except ConnectionError as exc:  # broken pipe, reset
                        _client_gone(runtime, handle, f"{exc.__class__.__name__}: {exc}")
                        return False
                    source.consumed(size)
                if not size:  # the socket is full: a copied piece tells when it has drained
                    piece = source.read(min(granted, COPY_PIECE_BYTES))
                    handle.write(piece)
                    size = len(piece)
            else:
                piece = source.take(granted)
                handle.write(piece)  # type: ignore[arg-type]  (a memoryview: uvloop keeps it, no copy)
                size = len(piece)
            granted -= size
            remaining -= size
            payload.inc(size)
    if not await handle.writable(timeout):
        response._send_timed_out(handle)
        return False
    if handle.lost:
        _client_gone(runtime, handle, "it closed the connection")
        return False
    return True


async def _send_through_asgi(response: StoreResponse, source: Any, remaining: int, send: Send) -> None:
    """Copying path through the ASGI `send` (no protocol handle: not our server)."""
    runtime = response.runtime
    bandwidth = runtime.bandwidth
    chunk = UNTHROTTLED_CHUNK if bandwidth.unlimited else bandwidth.quantum_bytes
    while remaining:
        try:
            if not source.buffered:
                await source.fill()
        except StorageError as exc:
            runtime.storage_health.suspect(exc.message)
            runtime.metrics.transfer_aborts.labels(direction="download", reason="storage_unavailable").inc()
            raise TransferAborted(f"the storage failed mid-transfer: {exc.message}") from None
        try:
            size = await bandwidth.grant(response.principal.id, min(remaining, chunk, source.buffered))
        except LeaseLost as exc:
            raise TransferAborted(f"lease lost: {exc}") from None
        if not runtime.payload_allowed():
            raise TransferAborted("lease no longer trusted")
        data = bytearray()
        while len(data) < size:
            data += source.take(size - len(data))
        remaining -= size
        await send({"type": "http.response.body", "body": bytes(data), "more_body": remaining > 0})
        runtime.metrics.payload_bytes.inc(size)


def _cut_for_storage(response: StoreResponse, handle: ConnectionHandle, exc: StorageError) -> None:
    runtime = response.runtime
    runtime.storage_health.suspect(exc.message)
    if handle.lost:
        return
    runtime.metrics.transfer_aborts.labels(direction="download", reason="storage_unavailable").inc()
    log.warning("download of %s cut: the storage failed mid-transfer: %s", response.artifact.sha256, exc.message)
    handle.abort()


async def _missing_object(response: StoreResponse) -> None:
    """The object is not in the store although our pin was visible: as for a missing file
    (transfer.py `_open_after_missing`), the database decides: the artifact is gone (404) or its
    content is missing or quarantined (503 content_unavailable); never a 500."""
    runtime, artifact = response.runtime, response.artifact
    await require_artifact(runtime.pool, artifact.id)
    runtime.metrics.short_reads.inc()
    log.error("blob %s of artifact %s is missing from the object store", artifact.sha256, artifact.id)
    raise ContentUnavailable("the artifact's stored content is missing or quarantined; re-uploading it restores it")
