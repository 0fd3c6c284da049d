"""Receiving upload bytes into files without stalling the event loop, and the errors of uploads.

Hashing and writing run in a worker thread in batches of `BATCH` bytes (`POOL_BATCH` into pool
buffers; smaller only where a part ends; hashlib and `os.pwrite` release the GIL), one batch in
flight while the loop receives the next: the loop only copies chunks into a buffer, so the
lease, pins and downloads keep their turns while a 1 GiB upload arrives at full speed. Every
writing path checks the free-space reserve and turns ENOSPC into 507 `insufficient_storage`;
the caller removes what it wrote.

With a descriptor for O_DIRECT, a batch is a page-aligned buffer of `UPLOAD_BUFFERS`, used again
once nothing refers to it (fresh memory costs ~0.4 CPU s/GiB of page faults and zeroing here).
Given a second descriptor opened with O_DIRECT (`open_direct`), the whole blocks of a batch at
an aligned offset go to the disk from that buffer as they are: a page-cache write cost this host
~2.4 CPU s/GiB, the direct one ~0.1 (docs/performance.md, issue 16). A region may also be fed, batch by batch, to the session's
whole-file hash and publication while it arrives (`Region.feed`, sessions.py `InlineFeed`).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from arkvory.shared.errors import Conflict, DigestMismatch, InvalidInput, PayloadTooLarge, UnsupportedMediaType
from arkvory.shared.http.bodies import MIN_RATE_GRACE_S, MinimumRate, ReceiveTimedOut, body_chunks
from arkvory.shared.http.media_types import essence
from arkvory.shared.metrics import Metrics
from arkvory.shared.settings import Settings
from arkvory.shared.storage import BlobStorage, is_out_of_space, out_of_space
from arkvory.shared.storage.cache_files import ALIGN, BufferPool, shared_buffer

log = logging.getLogger("arkvory.uploads")

# A thread hop costs ~50 µs; at 1 MiB or more per hop it is lost in the hashing (~1 ms/MiB).
BATCH = 2 * 1024 * 1024
# The batches of a pool buffer (O_DIRECT, a publication): 4 MiB measured as fast there, while
# buffered writes of 4 MiB batches took the directory backend's bench/upload.py from ~3.5 s to
# ~9 s per GiB (not understood; 2 MiB is what it was measured with).
POOL_BATCH = 4 * 1024 * 1024
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def refuse_form_upload(request: Request) -> None:
    """A browser form or `curl -F` wraps the file in a multipart envelope that we would store
    as the artifact: refuse it instead (415). curl's `--data-binary` default type,
    x-www-form-urlencoded, is the raw bytes and stays allowed."""
    if essence(request.headers.get("content-type") or "") == "multipart/form-data":
        raise UnsupportedMediaType(
            "send the raw bytes as the body (curl --data-binary @file), not a multipart form"
        )


def parse_sha256(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    if not _SHA256_HEX.fullmatch(value):
        raise InvalidInput(f"{what} must be a SHA-256 as 64 hex digits")
    return value


def minimum_rate(settings: Settings) -> MinimumRate | None:
    """The rate an upload body must keep (ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND, 0: none), judged
    after MIN_RATE_GRACE_S or the receive timeout, whichever is shorter."""
    if not settings.min_upload_bytes_per_second:
        return None
    grace_s = min(MIN_RATE_GRACE_S, float(settings.receive_timeout_s))
    return MinimumRate(settings.min_upload_bytes_per_second, grace_s)


def _write_at(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


# Enough for one upload being published while it arrives (obstore holds up to ~5 × 16 MiB:
# the part it fills and those in flight) plus the two batches being received: 96 MiB at most
# stays allocated once such an upload has run.
UPLOAD_BUFFERS = BufferPool(POOL_BATCH, keep=24, allocate=shared_buffer)


def open_direct(path: str) -> int | None:
    """A second descriptor of the upload file `path` for O_DIRECT writes, or None where the
    filesystem refuses them (tmpfs) or the platform has none."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC | direct)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


class Region:
    """One run of bytes the body fills: a part (or the whole one-shot body) at `offset`.

    `recorded` is the SHA-256 already stored for it: then its bytes are only hashed and
    compared, never written, so a re-send can neither change nor tear a received part."""

    def __init__(
        self, index: int, offset: int, size: int, recorded: str | None, declared: str | None = None
    ) -> None:
        self.index, self.offset, self.size, self.recorded = index, offset, size, recorded
        self.declared = declared  # the client's X-Content-SHA256: checked before it is recorded
        self.filled = 0
        self.digest = hashlib.sha256()
        # Where the bytes also go as they arrive (sessions.py `InlineFeed`): set by the
        # receiver's `inline` before the region's first batch, None when nothing is fed.
        self.feed: Any = None


class BatchedReceiver:
    """Writes a body into `fd` over consecutive regions, hashing each (and optionally the
    whole body), one batch in a worker thread while the loop gathers the next.

    `on_region` runs on the loop after each region's bytes are hashed and (when written)
    fdatasync'd: the caller records it there, so a cut body keeps every region it finished.

    `direct_fd` (optional, `open_direct`): the same file opened with O_DIRECT, used for the whole
    blocks of a batch at an aligned offset (the rest goes through `fd`). `inline` (optional)
    runs on the loop before a region's first batch and may give it a `feed`: each batch is then
    also hashed into the feed's digest (in the same thread) and sent by its `send` (on the loop,
    while the thread works); the caller finishes or abandons the feed."""

    def __init__(
        self,
        fd: int,
        regions: list[Region],
        *,
        storage: BlobStorage,
        reserve: int,
        check_room: bool,
        whole: hashlib._Hash | None = None,
        open_ended: bool = False,
        direct_fd: int | None = None,
        inline: Callable[[Region], Awaitable[Any]] | None = None,
    ) -> None:
        self.fd = fd
        self.direct_fd = direct_fd
        # Pool buffers where the batches go O_DIRECT (and to a publication); elsewhere a growing
        # bytearray per batch, as before.
        self._pooled = direct_fd is not None
        self._take = UPLOAD_BUFFERS.take if self._pooled else bytearray
        self._batch = POOL_BATCH if self._pooled else BATCH
        self.inline = inline
        self.regions = regions
        self.storage = storage
        self.reserve = reserve
        self.check_room = check_room
        self.whole = whole
        # One-shot uploads without Content-Length: the one region is the size cap, and the
        # body may end anywhere before it.
        self.open_ended = open_ended
        self._current = 0
        self._buffer: Any = None  # the batch being filled: a pool buffer's view, or a bytearray
        self._filled = 0
        # The batch being hashed and written in the thread, and the region it closes (if any).
        self._in_flight: asyncio.Future | None = None
        self._closing: Region | None = None

    @property
    def expected(self) -> int:
        return sum(r.size for r in self.regions)

    def _room_left_in_region(self) -> int:
        region = self.regions[self._current]
        return region.size - region.filled - self._filled

    async def receive(
        self, request: Request, settings: Settings, on_region: Callable, metrics: Metrics
    ) -> None:
        """Receive the whole body; 408 when it goes silent for the receive timeout or falls
        below the minimum rate (both counted in arkvory_transfer_aborts_total)."""
        try:
            async for chunk in body_chunks(request, settings.receive_timeout_s, minimum_rate(settings)):
                view = memoryview(chunk)
                while view:
                    if self._current >= len(self.regions):
                        raise PayloadTooLarge(f"the body has more than the expected {self.expected} bytes")
                    if self._buffer is None:
                        self._buffer = self._take()
                    if self._pooled:
                        take = min(len(view), POOL_BATCH - self._filled, self._room_left_in_region())
                        self._buffer[self._filled:self._filled + take] = view[:take]
                    else:  # a batch may pass BATCH by the rest of a chunk
                        take = min(len(view), self._room_left_in_region())
                        self._buffer += view[:take]
                    self._filled += take
                    view = view[take:]
                    if self._filled >= self._batch or self._room_left_in_region() == 0:
                        await self._flush(on_region)
            await self._flush(on_region)
            await self._settle(on_region)
        except Exception as exc:
            if isinstance(exc, ReceiveTimedOut):
                metrics.transfer_aborts.labels(direction="upload", reason=exc.reason).inc()
            await self._keep_finished_region(on_region)
            raise
        finally:
            # Never leave a thread writing into a file the caller is about to remove.
            future = self._in_flight
            if future is not None:
                await asyncio.wait([future])
                if not future.cancelled():
                    future.exception()  # retrieved: the body's own error wins
        if self._current < len(self.regions) and not self.open_ended:
            raise InvalidInput(f"the body ended before its {self.expected} bytes arrived")

    async def _flush(self, on_region: Callable) -> None:
        if not self._filled or self._current >= len(self.regions):
            return
        await self._settle(on_region)
        region = self.regions[self._current]
        # Handed over as is (no copy): the loop fills another pool buffer meanwhile.
        assert self._buffer is not None
        batch = self._buffer[:self._filled] if self._pooled else self._buffer
        self._buffer, self._filled = None, 0
        if region.filled == 0 and self.inline is not None:
            # After the settle: the region before is recorded, so its feed has moved on.
            region.feed = await self.inline(region)
        closes = region.filled + len(batch) == region.size
        region.filled += len(batch)
        if closes:
            self._current += 1
        at = region.filled - len(batch)
        self._in_flight = asyncio.ensure_future(
            asyncio.to_thread(self._absorb, region, batch, at, closes) if region.feed is None
            else self._absorb_batch(region, batch, at, closes)
        )
        self._closing = region if closes else None

    async def _absorb_batch(self, region: Region, batch: memoryview, at: int, closes: bool) -> None:
        """The batch hashed and written in a thread and, with a feed, sent meanwhile; both end
        before this does (the feed's `send` reports its failures itself and never raises)."""
        feed = region.feed
        sending = None if feed is None else asyncio.ensure_future(feed.send(batch))
        try:
            await asyncio.to_thread(self._absorb, region, batch, at, closes)
        finally:
            if sending is not None:
                await asyncio.wait([sending])

    async def _settle(self, on_region: Callable) -> None:
        """Wait for the batch in flight; report the region it closed, if any."""
        future, self._in_flight = self._in_flight, None
        closing, self._closing = self._closing, None
        if future is None:
            return
        await future
        if closing is not None:
            await on_region(closing)

    async def _keep_finished_region(self, on_region: Callable) -> None:
        """The body failed (cut, silent, too long) while the batch that finished a region was
        still in the thread: once that batch is safely written, record the region like any
        other, so a cut body keeps every part that fully arrived. A failure to record it is
        logged; the body's own error is what the client gets."""
        future, closing = self._in_flight, self._closing
        if future is None or closing is None:
            return
        self._in_flight = self._closing = None
        await asyncio.wait([future])
        if future.cancelled() or future.exception() is not None:
            return
        try:
            await on_region(closing)
        except Exception:
            log.warning("could not record part %d after its body failed", closing.index, exc_info=True)

    def _absorb(self, region: Region, batch: memoryview, at: int, closes: bool) -> None:
        """Worker thread: hash the batch and, unless the region is already recorded, write it."""
        region.digest.update(batch)
        if self.whole is not None:
            self.whole.update(batch)
        if region.feed is not None:
            region.feed.digest.update(batch)
        if closes and region.declared is not None and region.digest.hexdigest() != region.declared:
            raise DigestMismatch(
                f"part {region.index} has sha256 {region.digest.hexdigest()}, not the"
                " X-Content-SHA256 sent; nothing was kept: resend it"
            )
        if region.recorded is None:
            try:
                if self.check_room:
                    self.storage.require_room(len(batch), self.reserve)
                if self.direct_fd is None:
                    _write_at(self.fd, batch, region.offset + at)
                else:
                    self._write(batch, region.offset + at)
                if closes:
                    os.fdatasync(self.fd)  # the part's row is inserted next: bytes first
            except OSError as exc:
                if is_out_of_space(exc):
                    raise out_of_space(exc) from None
                raise
        elif closes and region.digest.hexdigest() != region.recorded:
            raise Conflict(
                f"part {region.index} was already received with other bytes"
                f" (sha256 {region.recorded}); parts cannot be replaced"
            )

    def _write(self, batch: memoryview, offset: int) -> None:
        """Worker thread: the batch's whole blocks O_DIRECT when it starts on a block (a pool
        buffer starts on a page), the rest (a part's unaligned end) through the page cache.
        Blocks a direct write covers are never also written buffered (nor the reverse): a part
        shares a block with its neighbour only where one of them is unaligned, and both then
        write it buffered."""
        aligned = len(batch) - len(batch) % ALIGN
        if self.direct_fd is not None and aligned and offset % ALIGN == 0:
            try:
                _write_at(self.direct_fd, batch[:aligned], offset)
                batch, offset = batch[aligned:], offset + aligned
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct_fd = None  # refused after all: buffered from now on (the caller closes it)
        if batch:
            _write_at(self.fd, batch, offset)
