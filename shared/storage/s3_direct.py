"""A range of an object read from a plain-http store on a connection of our own, the body either
moved into a pipe for the download path to `splice` to its client (shared/download/
object_transfer.py: it never enters user space), or received straight into the read cache's
buffers (shared/storage/read_cache.py: one copy, one system call per buffer).

obstore's stream hands Python a buffer per MiB that the gateway then writes to its client: two
copies of every byte and ~0.6 CPU s/GiB on the event loop's host; moving socket → pipe → socket
with splice(2) costs ~0.25, and a cache fill received with `recv(MSG_WAITALL)` into reused,
page-aligned buffers that O_DIRECT writes as they are ~0.3 instead of ~0.65 (docs/performance.md,
issue 16). So for an endpoint without TLS (`ARKVORY_S3_ENDPOINT_URL=http://...`, a store beside
the gateways), `DirectRange` asks obstore for a SigV4 presigned GET URL (no signing of ours),
sends that GET on a connection of its own, reads and checks the answer's head with httptools
(bounded in size and time), then hands out the body as its reader asks (`fill` into the pipe on
the event loop, or `receive_into` in a worker thread), each step bounded by the store's read
timeout. TLS endpoints keep obstore's stream (the bytes must be decrypted in user space anyway).

It speaks only the little HTTP it needs: one request per connection (`Connection: close`, so
nothing is reused half-read), an answer with a Content-Length (206, or 200 for a whole object),
and the store's error answers translated as s3_client.py translates obstore's. The presigned URL
is a credential while it lives: it is never logged, never put in an error, never kept beyond
the request.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools

from .interface import StorageUnavailable

if TYPE_CHECKING:
    from .s3_client import ObjectStore

KiB, MiB = 1024, 1024 * 1024
MAX_HEAD_BYTES = 32 * KiB  # an S3 answer's head is ~0.5 KiB; more is not a store we know
HEAD_READ = 16 * KiB  # bytes per receive of an answer's head (into a pipe: at most the pipe's size)
PIPE_BYTES = 1 * MiB  # /proc/sys/fs/pipe-max-size's default: ~1,000 splices per GiB
RETRY_BACKOFF_S = (0.1, 0.2, 0.4)  # before the body starts, as obstore's retries (s3_client.py)
SUPPORTED = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")  # Linux
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


class _RetryableAnswer(Exception):
    """The store answered 5xx before any byte of the body: another attempt may do."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Head:
    """httptools' callbacks for one answer's head; the body bytes that came along with it."""

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.complete = False
        self.early_body = bytearray()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.lower(), value)

    def on_headers_complete(self) -> None:
        self.complete = True

    def on_body(self, body: bytes) -> None:
        self.early_body += body


class DirectRange:
    """Bytes [start, start + length) of one object on a connection of our own, used one of two
    ways. In a pipe: `fill` puts at least one byte in it (opening the GET the first time), the
    reader moves them out of `pipe_fd` with splice and says how many (`consumed`), or copies a
    few (`read`). Into buffers: `open`, then `receive_into` in a worker thread, one call at a
    time. Like s3_client.py's `RangeReader`, it never ends short (StorageUnavailable instead);
    `aclose` cuts the connection.

    `counted(result)` is told of the GET ("ok" once the store answered with the bytes, "failed"
    when it did not).
    """

    def __init__(self, store: ObjectStore, key: str, start: int, length: int, *,
                 counted: Callable[[str], None] = lambda result: None) -> None:
        if start < 0 or length <= 0:
            raise ValueError(f"range: expected start >= 0 and length > 0, got {start}, {length}")
        self._store = store
        self.key = key
        self.start = start
        self.length = length
        self._counted = counted
        self._sock: socket.socket | None = None
        self._pipe: tuple[int, int] | None = None  # (read end, write end)
        self._capacity = 0
        self._arrived = 0  # bytes of the body put in the pipe, or received into buffers
        self.buffered = 0  # bytes in the pipe, not yet consumed
        self._early = b""  # body bytes that came with the head, for `receive_into`
        self._blocking = False
        self._closed = False

    def __repr__(self) -> str:  # never the URL: it carries a signature
        return f"DirectRange({self.key!r}, {self.start}, {self.length})"

    @property
    def pipe_fd(self) -> int:
        assert self._pipe is not None, "fill first"
        return self._pipe[0]

    # -- the reader's side -------------------------------------------------------------------------

    async def open(self) -> None:
        """Send the GET and check the answer's head (StorageError before any byte)."""
        if self._sock is None:
            await self._open(into_pipe=False)

    def receive_into(self, view: memoryview) -> int:
        """Fill `view` with the next bytes of the range (fewer only at its end; 0 after it), in
        one blocking receive: for a worker thread, after `open`. StorageUnavailable when the
        store stops sending for its read timeout or closes before the end."""
        if self._closed or self._sock is None:
            raise StorageUnavailable(f"object store: the read of {self.key} was closed")
        want = min(len(view), self.length - self._arrived)
        got = 0
        if self._early:
            got = min(want, len(self._early))
            view[:got] = self._early[:got]
            self._early = self._early[got:]
        sock = self._sock
        if not self._blocking:
            # The kernel's own receive timeout bounds each wait: a blocking MSG_WAITALL receive
            # fills the whole buffer in one system call.
            seconds = self._store.read_timeout
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                            struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000)))
            sock.settimeout(None)
            self._blocking = True
        while got < want:
            try:
                count = sock.recv_into(view[got:want], 0, socket.MSG_WAITALL)
            except BlockingIOError:  # SO_RCVTIMEO: nothing for the read timeout
                raise self._error(TimeoutError(), "finish reading") from None
            except OSError as exc:
                raise self._error(exc, "finish reading") from None
            if not count:
                raise StorageUnavailable(
                    f"object store: the read of {self._full} ended after {self._arrived + got} of"
                    f" {self.length} bytes", setting="ARKVORY_S3_ENDPOINT_URL",
                )
            got += count
        self._arrived += got
        return got

    async def fill(self) -> None:
        """Have at least one byte in the pipe; StorageError when the store fails (BlobNotFound
        when the object is not there), before or after the first byte."""
        if self._closed:
            raise StorageUnavailable(f"object store: the read of {self.key} was closed")
        if self._sock is None:
            await self._open(into_pipe=True)
        while not self.buffered:
            await self._splice_in()

    def consumed(self, count: int) -> None:
        """`count` bytes were spliced out of `pipe_fd`."""
        self.buffered -= count

    def read(self, most: int) -> bytes:
        """Copy up to `most` bytes out of the pipe (at least one: `fill` first)."""
        data = os.read(self.pipe_fd, min(most, self.buffered))
        self.buffered -= len(data)
        return data

    async def aclose(self) -> None:
        """Cut the transfer: the connection is closed (never reused half-read), the pipe too.
        Not while a `receive_into` runs: `interrupt` it, then `close` in its thread."""
        sock = self._sock
        if sock is not None and not self._blocking:
            asyncio.get_running_loop().remove_reader(sock.fileno())
        self.close()

    def interrupt(self) -> None:
        """Cut the connection under a `receive_into` in progress (any thread): it returns."""
        self._closed = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected any more

    def close(self) -> None:
        """Close the connection and the pipe; in the receiving thread after `interrupt`, so that
        a receive never meets a descriptor number used again for something else."""
        self._closed = True
        self.buffered = 0
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            for fd in pipe:
                os.close(fd)

    # -- the body ------------------------------------------------------------------------------

    async def _splice_in(self) -> None:
        """Move what the socket holds (at most what the pipe takes) into the pipe; wait for the
        store (up to its read timeout) when nothing has arrived."""
        assert self._sock is not None and self._pipe is not None
        want = min(self.length - self._arrived, self._capacity - self.buffered)
        if want <= 0:
            return
        try:
            moved = os.splice(self._sock.fileno(), self._pipe[1], want, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            if not self.buffered:
                await self._readable("finish reading")
            return
        except OSError as exc:
            raise self._error(exc, "finish reading") from None
        if not moved:
            raise StorageUnavailable(
                f"object store: the read of {self._full} ended after {self._arrived} of {self.length}"
                " bytes", setting="ARKVORY_S3_ENDPOINT_URL",
            )
        self._arrived += moved
        self.buffered += moved

    async def _readable(self, action: str) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self._sock.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        try:
            async with asyncio.timeout(self._store.read_timeout):
                await ready
        except TimeoutError:
            raise self._error(TimeoutError(), action) from None
        finally:
            if self._sock is not None:
                loop.remove_reader(fd)

    # -- the request and the answer's head ----------------------------------------------------

    @property
    def _full(self) -> str:
        return self._store._full(self.key)

    def _error(self, exc: BaseException, action: str):
        from .s3_client import classify

        if isinstance(exc, TimeoutError) and not str(exc):
            exc = TimeoutError("timed out")  # asyncio.timeout's says nothing
        return classify(exc, action=action, what=self._full, settings=self._store.settings)

    async def _open(self, *, into_pipe: bool) -> None:
        """Send the GET and check the answer's head; retried (RETRY_BACKOFF_S, at most the
        store's `max_retries` more attempts) when the store cannot be reached or answers 5xx,
        as obstore retries its own requests: nothing of the body has come yet. Like obstore's,
        no retry starts once the store's `retry_timeout` has passed since the first attempt: a
        store that takes connections and then sends nothing costs one read timeout (30 s), not
        one per attempt (90 s, while the download waits for its first byte)."""
        attempts = 1 + min(self._store.max_retries, len(RETRY_BACKOFF_S))
        started = time.monotonic()
        for attempt in range(attempts):
            try:
                await self._attempt(into_pipe)
                self._counted("ok")
                return
            except (_RetryableAnswer, OSError) as exc:  # OSError: TimeoutError too
                self._drop_connection()
                error = exc.error if isinstance(exc, _RetryableAnswer) else self._error(exc, "read")
                if (attempt + 1 == attempts
                        or time.monotonic() - started + RETRY_BACKOFF_S[attempt] > self._store.retry_timeout):
                    self._counted("failed")
                    raise error from None
                await asyncio.sleep(RETRY_BACKOFF_S[attempt])
            except BaseException:
                self._drop_connection()
                self._counted("failed")
                raise

    def _drop_connection(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    async def _attempt(self, into_pipe: bool) -> None:
        url = urllib.parse.urlsplit(await self._store.presign_get(self.key))
        sock = await self._connect(url.hostname or "", url.port or 80)
        self._sock = sock
        end = self.start + self.length - 1
        request = (
            f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Range: bytes={self.start}-{end}\r\nConnection: close\r\n\r\n"
        ).encode("ascii")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._store.read_timeout):
            await loop.sock_sendall(sock, request)
        pipe = (self._pipe or self._open_pipe()) if into_pipe else None
        # Into a pipe, the head is read in pieces no larger than the pipe, so the body bytes that
        # come with its last piece fit the empty pipe, however small the kernel made it.
        piece = HEAD_READ if pipe is None else min(HEAD_READ, self._capacity)
        head, status = await self._read_head(sock, piece)
        self._check_answer(head, status)
        if pipe is None:
            self._early = bytes(head.early_body[:self.length])
            return
        if head.early_body:  # what arrived with the head: less than a piece, copied once into the pipe
            early = bytes(head.early_body[:self.length])
            written = os.write(pipe[1], early)
            assert written == len(early)  # the pipe is empty (no byte of the body yet) and takes a piece
            self._arrived = self.buffered = written

    def _open_pipe(self) -> tuple[int, int]:
        """The pipe the body goes through, PIPE_BYTES where the kernel allows it. A user past
        /proc/sys/fs/pipe-user-pages-soft (64 pipes of 1 MiB: two processes' STREAMS_AT_ONCE)
        gets one or two pages instead, and cannot grow them."""
        self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(self._pipe[1], fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # over the user's pipe allowance: the size the kernel gave it
        self._capacity = fcntl.fcntl(self._pipe[1], fcntl.F_GETPIPE_SZ)
        return self._pipe

    async def _connect(self, host: str, port: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._store.connect_timeout):
            addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            failure: OSError = ConnectionRefusedError("cannot connect")
            for family, kind, proto, _, address in addresses:
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                try:
                    await loop.sock_connect(sock, address)
                    return sock
                except OSError as exc:
                    sock.close()
                    failure = exc
                except BaseException:
                    sock.close()
                    raise
            raise failure

    async def _read_head(self, sock: socket.socket, piece: int) -> tuple[_Head, int]:
        """The answer's head, at most MAX_HEAD_BYTES within the store's read timeout, received
        `piece` bytes at most at a time (what comes after the head in the last one is the start
        of the body: `_Head.early_body`)."""
        head = _Head()
        parser = httptools.HttpResponseParser(head)
        seen = 0
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._store.read_timeout):
            while not head.complete:
                data = await loop.sock_recv(sock, piece)
                if not data:
                    raise ConnectionResetError("unexpected eof")
                seen += len(data)
                try:
                    parser.feed_data(data)
                except httptools.HttpParserError:
                    raise StorageUnavailable(
                        f"object store: {self._full}: the answer is not HTTP", setting="ARKVORY_S3_ENDPOINT_URL"
                    ) from None
                if not head.complete and seen > MAX_HEAD_BYTES:
                    raise StorageUnavailable(
                        f"object store: {self._full}: the answer's head exceeds {MAX_HEAD_BYTES} bytes",
                        setting="ARKVORY_S3_ENDPOINT_URL",
                    )
        return head, parser.get_status_code()

    def _check_answer(self, head: _Head, status: int) -> None:
        """The answer holds exactly the bytes asked for, else the store's error as ours."""
        from .s3_client import classify_answer

        if status >= 300:
            error = classify_answer(
                status, bytes(head.early_body), action="read", what=self._full, settings=self._store.settings
            )
            if status == 416:  # the object is shorter than the database says
                error = StorageUnavailable(
                    f"object store: {self._full} has no bytes {self.start}-{self.start + self.length - 1}"
                    " (the object is shorter than recorded?)", setting="ARKVORY_STORAGE_URL",
                )
            raise _RetryableAnswer(error) if status >= 500 else error
        headers = head.headers
        length = headers.get(b"content-length", b"")
        first, last = self.start, self.start + self.length - 1
        if status == 206:
            found = _CONTENT_RANGE.fullmatch(headers.get(b"content-range", b"").decode("latin-1").strip())
            whole_range = found is not None and (int(found.group(1)), int(found.group(2))) == (first, last)
        else:  # 200: a store that ignores Range sends the whole object, fine only if that was asked
            whole_range = status == 200 and first == 0
        if (
            not whole_range
            or not length.isdigit()
            or int(length) != self.length
            or b"transfer-encoding" in headers
        ):
            raise StorageUnavailable(
                f"object store: {self._full} answered HTTP {status} without exactly bytes {first}-{last}"
                " (the object is shorter than recorded?)", setting="ARKVORY_STORAGE_URL",
            )
