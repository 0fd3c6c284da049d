"""uvicorn's httptools protocol with the bounds a public server needs on the request head, and a
per-request handle that lets the content routes write payload straight to the connection.

Head bounds (issue 6 §1): httptools joins a header value by bytes concatenation, which is
quadratic in the number of pieces it arrives in, and llhttp sets no size limit of its own. So the
bytes of a request line + headers are counted *before* they reach the parser: above
`MAX_HEAD_BYTES` the request is answered `431` and the connection closed, and a head that does not
arrive completely within the receive timeout closes the connection. Bytes of a pipelined head
that arrive in the same read as the previous request's body are not counted; that leaves at most
one read (256 KiB) unmetered per request, a linear cost.

The handle (`scope["extensions"]["arkvory.connection"]`) is bound to the request's own
`RequestResponseCycle` in `on_headers_complete`, so with pipelining each request sees its own.

None of what this module builds on is a public API (uvicorn's cycle, flow control and parser
callbacks, httptools' parser, uvloop's transports), so the three are pinned in pyproject.toml
and `check_http_stack` refuses to serve (exit 78) on any other version.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from arkvory.shared.errors import StartupRefused

log = logging.getLogger("arkvory.protocol")

# What this module was written and tested against; pyproject.toml pins the same (a test holds
# the two equal).
HTTP_STACK = {"uvicorn": "0.54.0", "httptools": "0.9.0", "uvloop": "0.23.0"}

MAX_HEAD_BYTES = 64 * 1024
# Lingering close (nginx's `lingering_close`), after a 431 or a refused body: what the client
# still sends is read and discarded for LINGER_S, so that the kernel does not reset the
# connection (losing the answer) while the client is still sending. At most LINGER_MAX_BYTES
# are discarded; past that reading stops, so that the client's sends stall (and it reads the
# answer) instead of meeting a reset, until the connection is dropped at LINGER_S.
LINGER_S = 2.0
LINGER_MAX_BYTES = 1024 * 1024
HANDLE_KEY = "arkvory.connection"
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


class PayloadRefused(Exception):
    """The payload gate was closed at the write: nothing was written (the caller cuts the
    transfer and counts why)."""


def encode_header_block(headers: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]]) -> bytes:
    """`name: value\\r\\n` lines of a response head, checked as uvicorn's `send` checks every
    header of every response; callers keep the block (per artifact) and send it with
    `ConnectionHandle.start`, so the check runs once, not twice per header per request."""
    lines = []
    for name, value in headers:
        if HEADER_RE.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        lines.append(b"%s: %s\r\n" % (name.lower(), value))
    return b"".join(lines)


# uvicorn's default response headers (date, server) as last seen, and their encoding.
_encoded_defaults: list = [None, b""]


class ConnectionHandle:
    """One request's view of its connection: write payload, sendfile, wait to be writable, abort.

    Writes go around uvicorn's `send` (which waits for the client without a bound) but keep the
    cycle's bookkeeping (`expected_content_length`), so the final empty `http.response.body`
    message completes the response through uvicorn as usual.
    """

    __slots__ = ("transport", "cycle", "cut", "status", "_on_lost", "_protocol")

    def __init__(self, protocol: ArkvoryHttpProtocol, cycle: RequestResponseCycle) -> None:
        self.transport = protocol.transport
        self.cycle = cycle
        # The response ended early and that was accounted for (the server cut it, or the
        # client's leaving was counted): a transfer is counted as aborted once.
        self.cut = False
        self.status = 0  # of a head written with `start` (uvicorn's send does not record it)
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

    def _connection_lost(self) -> None:
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()

    @property
    def buffered(self) -> int:
        return self.transport.get_write_buffer_size()

    async def writable(self, timeout: float) -> bool:
        """Wait until the transport takes more (uvicorn's flow control); False after `timeout`
        seconds without that. Returns True at once when the connection is gone (callers check
        `lost`)."""
        flow = self.cycle.flow
        if not flow.write_paused or self.lost:
            return True
        try:
            async with asyncio.timeout(timeout):
                await flow.drain()
        except TimeoutError:
            return flow.write_paused is False
        return True

    def start(self, status: int, header_block: bytes, content_length: int, extra: bytes = b"", body: bytes = b"") -> None:
        """Write the response head (and `body`, the first payload bytes, in the same write: one
        system call for a small download) straight to the transport, with the bookkeeping that
        uvicorn's `send` keeps for `http.response.start`: its default headers (date), and
        `connection: close` when the connection ends after this response. `header_block` is
        from `encode_header_block` and holds the Content-Length; `extra` is more such lines.

        Why not uvicorn's `send`: it checks every header against two regular expressions on
        every response (20 searches for a content answer) and costs two ASGI messages; issue 14
        §3 counted 464 k instructions per authorized 64 KiB download before this path, the bare
        uvicorn app 123 k (bench/instructions.py). Only the content routes take it."""
        cycle = self.cycle
        if cycle.response_started:
            raise RuntimeError("the response has started already")
        if cycle.disconnected:  # as uvicorn's send: nothing is written to a client gone
            cycle.response_started = True
            return
        if body:
            if len(body) > content_length:
                raise RuntimeError("Response content longer than Content-Length")
            if not self._protocol.admit_payload():
                raise PayloadRefused()
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = False
        cycle.expected_content_length = content_length - len(body)
        self.status = status
        defaults = cycle.default_headers
        if _encoded_defaults[0] is not defaults:
            # uvicorn replaces the list once a second (its date): encoded once per list.
            _encoded_defaults[:] = defaults, b"".join(b"%s: %s\r\n" % pair for pair in defaults)
        head = b"".join((
            STATUS_LINE[status],
            _encoded_defaults[1],
            header_block,
            extra,
            b"" if cycle.keep_alive else b"connection: close\r\n",
            b"\r\n",
        ))
        if body:
            # One writev, no copy: joining the body into the head copied it, 65 k of the 373 k
            # instructions (callgrind) of an authorized 64 KiB GET (issue 14 §3).
            self.transport.writelines((head, body))
        else:
            self.transport.write(head)

    def complete(self) -> None:
        """End a response begun with `start` whose bytes are all written: what uvicorn's last
        `http.response.body` message does (close unless kept alive, start a pipelined request
        or the keep-alive timer)."""
        cycle = self.cycle
        if cycle.expected_content_length != 0:
            raise RuntimeError("Response content shorter than Content-Length")
        if cycle.disconnected or cycle.response_complete:
            return
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()

    def write(self, data: bytes) -> None:
        """Hand payload to the transport; PayloadRefused (nothing written) when the payload gate
        is closed at this instant."""
        size = len(data)
        cycle = self.cycle
        if size > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if not self._protocol.admit_payload():
            raise PayloadRefused()
        cycle.expected_content_length -= size
        self.transport.write(data)

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """Send up to `count` bytes of `fd` at `offset` straight from the page cache; returns how
        many the socket took (0 when it is full; EOFError when the file ends first; a
        ConnectionError when the client is gone, after which the connection is dropped;
        PayloadRefused when the payload gate is closed, with nothing sent). Only call with
        nothing buffered in the transport, or the bytes would overtake what is queued."""
        cycle = self.cycle
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if not self._protocol.admit_payload():
            raise PayloadRefused()
        try:
            sent = os.sendfile(self._protocol.socket_fd, fd, offset, count)
        except (BlockingIOError, InterruptedError):
            return 0
        except ConnectionError:  # EPIPE or ECONNRESET: the client reset or closed its end
            self.cycle.disconnected = True  # nothing more is written; uvicorn reports no error
            self.transport.abort()
            raise
        if not sent:
            raise EOFError(f"the file ends before offset {offset} + {count}")
        cycle.expected_content_length -= sent
        stats = self._protocol.stats
        if stats is not None:
            stats.sendfile_bytes += sent
        return sent

    def splice(self, pipe_fd: int, count: int) -> int:
        """Move up to `count` bytes from the pipe `pipe_fd` to the socket without copying them
        (an object store's bytes: shared/storage/s3_direct.py); as `sendfile`, returns how many the
        socket took (0 when it is full), raises a ConnectionError when the client is gone and
        PayloadRefused, with nothing moved, when the payload gate is closed. Only with nothing
        buffered in the transport, and only with at least `count` bytes in the pipe."""
        cycle = self.cycle
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if not self._protocol.admit_payload():
            raise PayloadRefused()
        try:
            sent = os.splice(pipe_fd, self._protocol.socket_fd, count, flags=_SPLICE_FLAGS)
        except (BlockingIOError, InterruptedError):
            return 0
        except ConnectionError:
            self.cycle.disconnected = True
            self.transport.abort()
            raise
        cycle.expected_content_length -= sent
        stats = self._protocol.stats
        if stats is not None:
            stats.splice_bytes += sent
        return sent

    def abort(self) -> None:
        """Drop the connection now: `close()` would wait to flush to a client that reads nothing."""
        # Marked at once (connection_lost comes a loop turn later), so that nothing else is
        # written and uvicorn does not report the unfinished response as an application error.
        self.cycle.disconnected = True
        self.cut = True
        # A reset, not an orderly close: what the kernel still holds for this client is dropped
        # too, so a cut transfer stops at once instead of draining megabytes at the client's pace.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except (OSError, ValueError):  # uvloop: ValueError once the transport closed its fd
                pass  # already gone
        self.transport.abort()


class _LingeringTransport:
    """The connection's transport as uvicorn's cycles and our handles see it, with a lingering
    close (nginx's `lingering_close`). A response that ends the connection while the client is
    still sending its body (a refused upload or JSON body: 401, 405, 413...) half-closes instead,
    and what still arrives is discarded (up to LINGER_MAX_BYTES, then no longer read) until the
    connection is dropped after LINGER_S: closing with unread bytes makes the kernel reset the
    connection, and the client then loses the answer it was sent. Everything else goes straight
    to the real transport (the hot methods are bound once, not looked up per call)."""

    __slots__ = (
        "_real", "_protocol", "write", "writelines", "is_closing", "get_extra_info", "abort",
        "get_write_buffer_size", "pause_reading", "resume_reading", "can_write_eof", "write_eof",
    )

    def __init__(self, real: asyncio.Transport, protocol: ArkvoryHttpProtocol) -> None:
        self._real = real
        self._protocol = protocol
        for name in self.__slots__[2:]:
            setattr(self, name, getattr(real, name))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def close(self) -> None:
        if self._protocol.receiving_body and not self._real.is_closing() and self._real.can_write_eof():
            self._protocol.linger()
        elif not self._protocol.lingering:  # a lingering connection is dropped on its timer
            self._real.close()

    def close_now(self) -> None:
        """Flush and close without lingering (TLS ends with its own close_notify)."""
        self._real.close()


class JsonRefusalsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose own refusal (a request the parser cannot read) is
    JSON with a request id, like every other answer of ours, instead of plain text."""

    def send_400_response(self, msg: str) -> None:
        defaults = b"".join(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
        self.transport.write(_refusal_response(400, "Bad Request", "invalid_input", msg, defaults))
        self.transport.close()


class ArkvoryHttpProtocol(JsonRefusalsProtocol):
    """Installed with `uvicorn.Config(http=protocol_for(...))`; class attributes are the bounds."""

    head_timeout_s: float = 60.0
    stats: HeadStats | None = None
    # The gate every payload write passes (the process's `payload_allowed`: lease trusted, read
    # pins written, no failed loop), and the lease's own deadline, its independent audit.
    payload_gate: Callable[[], bool] = staticmethod(lambda: True)
    # (True while trusted: a bool, or the lease's seconds of trust left, 0.0 once over.)
    may_send_payload: Callable[[], object] = staticmethod(lambda: True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._handles: list[ConnectionHandle] = []
        self.socket_fd = -1  # for sendfile: plain TCP only, TLS must encrypt in user space

    # -- the head: counted before parsing, and timed ------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _LingeringTransport(transport, self)  # type: ignore[assignment]
        if transport.get_extra_info("sslcontext") is None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                self.socket_fd = sock.fileno()
        self._arm_head_timer()  # a connection that never sends a byte is closed too

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering after a 431 or a refused body: discard
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES + LINGER_MAX_BYTES:
                # Not an abort: a client still pushing its body would meet the reset on its
                # next send, milliseconds after the answer, and lose it (the kernel's buffers
                # alone hold more than LINGER_MAX_BYTES). The LINGER_S timer drops it.
                self.transport.pause_reading()
            return
        if not self._reading_head:
            super().data_received(data)
            return
        room = MAX_HEAD_BYTES - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            # Timed only when a head does not arrive in one piece (the usual case costs no timer).
            if self._reading_head and self._head_bytes and self._head_timer is None and self.parser is not None:
                self._arm_head_timer()
            return
        # Feed what fits: the head may end inside it, and then the rest is body or a next head.
        if room:
            self._head_bytes += room
            super().data_received(data[:room])
            if self.parser is None or self.transport.is_closing():
                return
        if self._reading_head:
            self._refuse_head()
            return
        self.data_received(data[room:])

    def on_headers_complete(self) -> None:
        self._reading_head = False
        if self._head_timer is not None:
            self._cancel_head_timer()
        previous = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not previous:
            handle = ConnectionHandle(self, cycle)
            self._handles.append(handle)
            cycle.scope.setdefault("extensions", {})[HANDLE_KEY] = handle  # type: ignore[typeddict-item]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        # Forget handles of finished responses (a keep-alive connection serves many), and take
        # each out of its scope: scope -> handle -> cycle -> scope is a reference cycle, which
        # would leave every request to the garbage collector (6 % of the CPU of small downloads).
        live = []
        for handle in self._handles:
            if handle.cycle.response_complete:
                handle.cycle.scope["extensions"].pop(HANDLE_KEY, None)  # type: ignore[typeddict-item]
            else:
                live.append(handle)
        self._handles = live
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.cycle.scope["extensions"].pop(HANDLE_KEY, None)  # type: ignore[typeddict-item]
            handle._connection_lost()

    @property
    def receiving_body(self) -> bool:
        """The current request's head is in and its body is not (all) read yet."""
        return not self._reading_head and not self._refused

    @property
    def lingering(self) -> bool:
        return self._refused

    def linger(self) -> None:
        """Stop sending, discard what the client still sends, drop the connection after LINGER_S."""
        self._refused = True
        self._head_bytes = MAX_HEAD_BYTES  # LINGER_MAX_BYTES more are discarded, then not read
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.abort)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._reading_head or self.transport.is_closing():
            return
        if self._head_bytes and self.stats is not None:
            self.stats.timed_out += 1
        # Nothing useful to answer a client that cannot send a head in time; and a response
        # may still be streaming on this connection (pipelining), which an answer would corrupt.
        self.transport.close()
        self.loop.call_later(LINGER_S, self.transport.abort)

    def _refuse_head(self) -> None:
        self._cancel_head_timer()
        if self.stats is not None:
            self.stats.too_large += 1
        transport = self.transport
        if self.cycle is not None and not self.cycle.response_complete:
            # A response is streaming here: an answer would corrupt it, so the connection ends.
            for handle in self._handles:
                handle.cut = True  # counted as a refused head, not as a download abort
            transport.close_now()
        else:
            transport.write(_head_too_large_response())
            if transport.can_write_eof():
                # Lingering close (as nginx does): stop sending, keep reading and discarding for
                # a moment, so the kernel does not reset the connection before the client reads
                # the 431. The client sees the end of the stream at once.
                transport.write_eof()
            else:
                transport.close_now()  # TLS: the 431, then close_notify
        # Only now: from here on `close()` is a no-op (the connection lingers until the timer),
        # which made the closes above do nothing when this was set first.
        self._refused = True
        self.loop.call_later(LINGER_S, transport.abort)

    # -- the payload gate and its audit ---------------------------------------------------------

    def admit_payload(self) -> bool:
        """May a payload chunk be written now? Asked by the handle in the same synchronous step
        as the write, so a trust deadline cannot fall between the decision and the bytes.

        The audit reads the lease's own deadline first: if the gate then still admits, the lease
        had already ended at a moment before the gate's reading, which a correct gate cannot
        allow (monotonic clock; an ended lease is never revived). So
        `arkvory_payload_chunks_after_trust_total` counts only a faulty gate, never the race of
        a deadline passing between a check and a write (issue 14 §3)."""
        trusted = self.may_send_payload()
        if not self.payload_gate():
            return False
        if not trusted:
            count_late_payload(self.stats)
        return True


def count_late_payload(stats: HeadStats | None) -> None:
    """A payload chunk went out after the lease's trust ended (the counter must stay 0)."""
    if stats is not None:
        stats.late_payload_chunks += 1
        if stats.late_payload_chunks == 1:
            # Said once, in the log: the process usually exits moments later (its lease is
            # lost), before a scrape could read the counter.
            log.critical(
                "a payload chunk was handed to a connection after the lease's local trust "
                "ended (arkvory_payload_chunks_after_trust_total must stay 0; runbook: "
                "ArkvoryPayloadAfterTrust)"
            )


def http_stack_mismatches(installed: Callable[[str], str] = importlib.metadata.version) -> list[str]:
    """'name found (needs wanted)' for each package of HTTP_STACK at another version."""
    problems = []
    for name, wanted in HTTP_STACK.items():
        try:
            found = installed(name)
        except importlib.metadata.PackageNotFoundError:
            found = "missing"
        if found != wanted:
            problems.append(f"{name} {found} (needs {wanted})")
    return problems


def check_http_stack() -> None:
    """Refuse to start (exit 78) on an HTTP stack this protocol was not built for: a silent
    change in uvicorn's internals would break head bounds, payload writes or lingering close."""
    problems = http_stack_mismatches()
    if problems:
        wanted = " ".join(f"'{name}=={version}'" for name, version in HTTP_STACK.items())
        raise StartupRefused(
            "the HTTP stack differs from the one shared/http/protocol.py is built on: "
            f"{', '.join(problems)}; install the pinned versions (pip install {wanted})"
        )


def _head_too_large_response() -> bytes:
    return _refusal_response(
        431, "Request Header Fields Too Large", "request_header_too_large",
        f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
    )


def _refusal_response(status: int, reason: str, code: str, message: str, headers: bytes = b"") -> bytes:
    """A whole response, written before any application sees the request: the JSON error
    shape with a request id of its own (no request id exists yet), then the connection closes."""
    rid = secrets.token_hex(8)
    body = json.dumps({"code": code, "message": message, "requestId": rid}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\n".encode()
        + headers
        + b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"x-request-id: " + rid.encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )


class HeadStats(Collector):
    """Counters of this module, exported through the process's registry."""

    def __init__(self) -> None:
        self.too_large = 0
        self.timed_out = 0
        self.late_payload_chunks = 0
        self.sendfile_bytes = 0
        self.splice_bytes = 0

    def collect(self):
        refused = CounterMetricFamily(
            "arkvory_http_heads_refused",
            "Requests whose line + headers were too large (431) or too slow (closed)",
            labels=["reason"],
        )
        refused.add_metric(["too_large"], self.too_large)
        refused.add_metric(["timeout"], self.timed_out)
        yield refused
        yield CounterMetricFamily(
            "arkvory_payload_chunks_after_trust",
            "Payload chunks handed to a connection while this process could not trust its "
            "lease (must stay 0)",
            value=self.late_payload_chunks,
        )
        yield CounterMetricFamily(
            "arkvory_download_sendfile_bytes",
            "Payload bytes sent with sendfile (zero-copy; plain TCP only, TLS copies)",
            value=self.sendfile_bytes,
        )
        yield CounterMetricFamily(
            "arkvory_download_splice_bytes",
            "Payload bytes an object store sent that went to the client with splice (zero-copy;"
            " plain-http stores and plain TCP clients only)",
            value=self.splice_bytes,
        )


def protocol_for(runtime) -> type[ArkvoryHttpProtocol]:
    """The protocol class for one process: its head timeout, its metrics, its payload gate."""
    stats = HeadStats()
    runtime.registry.register(stats)
    lease = runtime.lease

    return type(
        "ArkvoryHttpProtocol",
        (ArkvoryHttpProtocol,),
        {
            "head_timeout_s": float(runtime.settings.receive_timeout_s),
            "stats": stats,
            "payload_gate": staticmethod(runtime.payload_allowed),
            # The lease's own deadline, not the serving code's gate: the audit of that gate.
            # (Its seconds of trust left, 0.0 once over: true while trusted.)
            "may_send_payload": staticmethod(lease.trust_remaining if lease is not None else _always),
        },
    )


def _always() -> bool:
    return True
