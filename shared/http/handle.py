"""The connection handle: one request's way to write its response's payload straight to the
connection (`scope["extensions"]["arkvory.connection"]`), past the ASGI `send`.

The content routes (shared/download/) write a download's head and body through it: the head
with its first bytes in one write, then the body from the page cache with `sendfile(2)` (or from
an object store's pipe with `splice(2)`), every piece through the payload gate in the same
synchronous step as the write, and each wait for the client bounded by the caller. When the
socket is full, the handle waits for the socket itself to take more (no bytes copied to learn
that). It keeps the exchange's bookkeeping (exchange.py), so the response ends as any other.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable
from .exchange import INVALID_HEADER_NAME, INVALID_HEADER_VALUE, STATUS_LINES, Connection, Exchange

HANDLE_KEY = "arkvory.connection"
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


class PayloadRefused(Exception):
    """The payload gate was closed at the write: nothing was written (the caller cuts the
    transfer and counts why)."""


def encode_header_block(headers: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]]) -> bytes:
    """`name: value\\r\\n` lines of a response head, checked as `send` checks every header of
    every response; callers keep the block (per artifact) and send it with
    `ConnectionHandle.start`, so the check runs once, not twice per header per request."""
    lines = []
    for name, value in headers:
        if INVALID_HEADER_NAME.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if INVALID_HEADER_VALUE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        lines.append(b"%s: %s\r\n" % (name.lower(), value))
    return b"".join(lines)


class ConnectionHandle:
    """One request's view of its connection: write payload, sendfile, splice, wait to be
    writable, abort. `cycle` is the request's exchange (its `response_started`, `disconnected`
    and `flow.write_paused` are read by the callers)."""

    __slots__ = ("transport", "cycle", "cut", "status", "_on_lost", "_protocol")

    def __init__(self, protocol: Connection, exchange: Exchange) -> None:
        self.transport: asyncio.Transport = protocol.transport
        self.cycle = exchange
        # The response ended early and that was accounted for (the server cut it, or the
        # client's leaving was counted): a transfer is counted as aborted once.
        self.cut = False
        self.status = 0  # of a head written with `start` (for the request metrics)
        self._on_lost: Callable[[], None] | None = None
        self._protocol = protocol  # its payload gate, socket and stats

    @property
    def lost(self) -> bool:
        return self.cycle.disconnected or self.transport.is_closing()

    @property
    def can_sendfile(self) -> bool:
        """Plain TCP only: TLS must encrypt in user space, so it takes the copying path."""
        return self._protocol.socket_fd >= 0

    def on_lost(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` once when the connection goes away (replaces a watcher task)."""
        self._on_lost = callback

    def connection_lost(self) -> None:
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()

    @property
    def buffered(self) -> int:
        return self.transport.get_write_buffer_size()

    async def writable(self, timeout: float) -> bool:
        """Wait until the connection takes more; False after `timeout` seconds without that.
        Returns True at once when the connection is gone (callers check `lost`)."""
        flow = self.cycle.flow
        if not flow.write_paused or self.lost:
            return True
        return await flow.wait(timeout)

    def start(self, status: int, header_block: bytes, content_length: int, extra: bytes = b"", body: bytes = b"") -> None:
        """Write the response head (and `body`, the first payload bytes, in the same write: one
        system call for a small download) straight to the transport, with what `send` adds to
        every head: the date, and `connection: close` when the connection ends after this
        response. `header_block` is from `encode_header_block` and holds the Content-Length;
        `extra` is more such lines.

        Why not `send`: it checks every header against two regular expressions on every
        response and costs two ASGI messages (issue 14 §3: 464 k instructions per authorized
        64 KiB download before this path, 123 k for a bare app; bench/instructions.py). Only
        the content routes take it."""
        exchange = self.cycle
        if exchange.response_started:
            raise RuntimeError("the response has started already")
        if exchange.disconnected:  # as `send`: nothing is written to a client gone
            exchange.response_started = True
            return
        if body:
            if len(body) > content_length:
                raise RuntimeError("Response content longer than Content-Length")
            if not self._protocol.admit_payload():
                raise PayloadRefused()
        exchange.response_started = True
        exchange.waiting_for_100_continue = False
        exchange.chunked_encoding = False
        exchange.expected_content_length = content_length - len(body)
        exchange.sent += len(body)
        self.status = exchange.status = status
        head = b"".join((
            STATUS_LINES[status],
            self._protocol.date_line,
            header_block,
            extra,
            b"" if exchange.keep_alive else b"connection: close\r\n",
            b"\r\n",
        ))
        if body:
            # One writev, no copy: joining the body into the head copied it, 65 k of the 373 k
            # instructions (callgrind) of an authorized 64 KiB GET (issue 14 §3).
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)

    def complete(self) -> None:
        """End a response begun with `start` whose bytes are all written, as the last
        `http.response.body` message does (close unless kept alive, then the next request)."""
        exchange = self.cycle
        if exchange.expected_content_length != 0:
            raise RuntimeError("Response content shorter than Content-Length")
        if exchange.disconnected or exchange.response_complete:
            return
        if self._protocol.corked:
            self._protocol.cork(False)  # the body's last segment goes now
        exchange.finish()

    def write(self, data: bytes) -> None:
        """Hand payload to the transport; PayloadRefused (nothing written) when the payload gate
        is closed at this instant."""
        self._admit(len(data))
        exchange = self.cycle
        exchange.expected_content_length -= len(data)
        exchange.sent += len(data)
        self.transport.write(data)

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """Send up to `count` bytes of `fd` at `offset` straight from the page cache; returns how
        many the socket took (0 when it is full; EOFError when the file ends first; a
        ConnectionError when the client is gone, after which the connection is dropped;
        PayloadRefused when the payload gate is closed, with nothing sent). When the socket
        took less than `count`, writing pauses (`cycle.flow.write_paused`) until the socket
        takes more. Only call with nothing buffered in the transport, or the bytes would
        overtake what is queued."""
        self._admit(count)
        protocol = self._protocol
        if not protocol.corked:
            protocol.cork(True)
        try:
            sent = os.sendfile(protocol.socket_fd, fd, offset, count)
        except BlockingIOError:
            protocol.wait_for_socket()
            return 0
        except ConnectionError:  # EPIPE or ECONNRESET: the client reset or closed its end
            self._drop()
            raise
        if not sent:
            raise EOFError(f"the file ends before offset {offset} + {count}")
        # A short count: the socket is full (or the file ended, which the next call says).
        self._moved(sent, count)
        stats = protocol.stats
        if stats is not None:
            stats.sendfile_bytes += sent
        return sent

    def splice(self, pipe_fd: int, count: int) -> int:
        """Move up to `count` bytes from the pipe `pipe_fd` to the socket without copying them
        (an object store's bytes: shared/storage/s3_direct.py); as `sendfile`, returns how many the
        socket took (0 when it is full), raises a ConnectionError when the client is gone and
        PayloadRefused, with nothing moved, when the payload gate is closed. Only with nothing
        buffered in the transport, and only with at least `count` bytes in the pipe."""
        self._admit(count)
        protocol = self._protocol
        if not protocol.corked:
            protocol.cork(True)
        try:
            sent = os.splice(pipe_fd, protocol.socket_fd, count, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            protocol.wait_for_socket()
            return 0
        except ConnectionError:
            self._drop()
            raise
        self._moved(sent, count)
        stats = protocol.stats
        if stats is not None:
            stats.splice_bytes += sent
        return sent

    def _admit(self, count: int) -> None:
        """What every payload write passes first: within the Content-Length, and the gate."""
        if count > self.cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if not self._protocol.admit_payload():
            raise PayloadRefused()

    def _moved(self, sent: int, count: int) -> None:
        """`sent` of `count` bytes went to the socket: fewer means it is full, and writing
        pauses until it takes more."""
        exchange = self.cycle
        exchange.expected_content_length -= sent
        exchange.sent += sent
        if sent < count:
            self._protocol.wait_for_socket()

    def _drop(self) -> None:
        """The client reset or closed its end under a zero-copy send: nothing more is written
        (and no unfinished response is reported), the connection goes."""
        self.cycle.disconnected = True
        self.transport.abort()

    def abort(self) -> None:
        """Drop the connection now: `close()` would wait to flush to a client that reads nothing."""
        # Marked at once (connection_lost comes a loop turn later), so that nothing else is
        # written and the unfinished response is not reported as an application error.
        self.cycle.disconnected = True
        self.cycle.end = "cut"
        self.cut = True
        # A reset, not an orderly close: what the kernel still holds for this client is dropped
        # too, so a cut transfer stops at once instead of draining megabytes at the client's pace.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            except (OSError, ValueError):
                pass  # already gone (uvloop's socket object says so with a ValueError once closed)
        self.transport.abort()
