"""Our HTTP/1.1 connection: an `asyncio.Protocol` over httptools' request parser (its public
callback API), speaking ASGI 3 to the app through one Exchange per request (exchange.py).

It keeps what a public server needs and what uvicorn's httptools protocol did before it:
keep-alive (closed after KEEP_ALIVE_S idle), pipelining (one request runs at a time, in order),
HTTP/1.0 (never kept alive), `Expect: 100-continue`, chunked request bodies, a malformed
request answered 400 and closed, an `Upgrade` answered as a plain request and the connection
then closed (we speak no other protocol).

Head bounds (issue 6 §1): httptools joins a header value by bytes concatenation, which is
quadratic in the number of pieces it arrives in, and llhttp sets no size limit of its own. So the
bytes of a request line + headers are counted *before* they reach the parser: above
`MAX_HEAD_BYTES` the request is answered `431` and the connection closed, and a head that does not
arrive completely within the receive timeout closes the connection. Bytes of a pipelined head
that arrive in the same read as the previous request's body are not counted; that leaves at most
one read (256 KiB) unmetered per request, a linear cost.

Lingering close (nginx's `lingering_close`), after a 431 or a response that ends the connection
while the client still sends its body: what the client still sends is read and discarded for
LINGER_S, so that the kernel does not reset the connection (losing the answer) while the client
is still sending. At most LINGER_MAX_BYTES are discarded; past that reading stops, so that the
client's sends stall (and it reads the answer) instead of meeting a reset, until the connection
is dropped at LINGER_S.

Each request gets a ConnectionHandle (handle.py, `scope["extensions"]["arkvory.connection"]`),
through which the content routes write payload past `send`, gated by `admit_payload`.

Every request's end passes here, the answers of our own included: `exchange_ended` when its app
returned, `_refuse_head` and `_answer_malformed` for the 431 and 400 that no app saw. Each tells
the server's access log (access_log.py), when it is on.

The module is long because all of it reads and changes one connection's state (the head being
counted, the requests in turn, lingering, the wait for a full socket); a request's own side is
exchange.py, the payload's handle.py, the answers of our own refusals.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import select
import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol

import httptools
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from .access_log import CUT, REFUSED, AccessLog
from .exchange import Exchange, FlowControl
from .handle import HANDLE_KEY, ConnectionHandle, PayloadRefused, encode_header_block
from .refusals import MAX_HEAD_BYTES, bad_request_response, head_too_large_response

# The download modules import these from here (they are the protocol's per-request face).
__all__ = [
    "HANDLE_KEY", "MAX_HEAD_BYTES", "ConnectionHandle", "HeadStats", "HttpProtocol", "PayloadRefused",
    "encode_header_block", "protocol_for",
]

log = logging.getLogger("arkvory.protocol")

KEEP_ALIVE_S = 5.0  # an idle kept-alive connection is closed after this long
LINGER_S = 2.0
LINGER_MAX_BYTES = 1024 * 1024


class Listener(Protocol):
    """What a connection shares with the others of its server (server.HttpServer)."""

    connections: set[HttpProtocol]
    tasks: set[asyncio.Task]
    date_line: bytes  # `date: ...\r\n`, made once a second
    access_log: AccessLog | None  # told of every request's end, when ARKVORY_ACCESS_LOG is on


class HttpProtocol(asyncio.Protocol):
    """One connection. Made by HttpServer; `protocol_for` sets the class attributes (the bounds,
    the metrics, the payload gate) for one process."""

    head_timeout_s: float = 60.0
    stats: HeadStats | None = None
    # The gate every payload write passes (the process's `payload_allowed`: lease trusted, read
    # pins written, no failed loop), and the lease's own deadline, its independent audit.
    payload_gate: Callable[[], bool] = staticmethod(lambda: True)
    # (True while trusted: a bool, or the lease's seconds of trust left, 0.0 once over.)
    may_send_payload: Callable[[], object] = staticmethod(lambda: True)

    def __init__(self, app: Callable, server: Listener) -> None:
        self.app = app
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        # A request with `Connection: close` is answered even when more bytes follow it.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.flow: FlowControl = None  # type: ignore[assignment]
        self.socket_fd = -1  # for sendfile: plain TCP only, TLS must encrypt in user space
        self._socket: Any = None  # the transport's socket object (setsockopt), plain TCP only
        self.corked = False
        self._addresses: tuple[Any, Any, str] = (None, None, "http")
        # The request being parsed: its URL pieces, headers, Expect, and its exchange once the
        # head is in; the exchanges parsed while an earlier one runs (pipelining).
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_continue = False
        self._began: float | None = None  # when its first byte reached the parser
        self.exchange: Exchange | None = None
        self._answering: Exchange | None = None  # the one whose turn it is to be answered
        self._pipeline: collections.deque[Exchange] = collections.deque()
        self._handles: list[ConnectionHandle] = []  # of exchanges whose app runs
        # The head's bound and timer; lingering (refused: what arrives is discarded); idle timer.
        self._reading_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._ignoring = False  # after an Upgrade or a malformed request: what follows is not parsed
        self._refusal_pending = False  # a malformed request, answered once those before it are
        self._malformed: Exchange | None = None  # the request whose body was malformed, if it was
        self._keep_alive_timer: asyncio.TimerHandle | None = None
        # Told when the socket takes more after a zero-copy send found it full: an epoll set of
        # our own holding the socket edge-triggered, itself watched by the event loop (made at
        # the first full socket, kept for the connection: no registration per wait).
        self._writability: select.epoll | None = None
        self._watching = False

    @property
    def date_line(self) -> bytes:
        return self.server.date_line

    # -- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.server.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport, self.loop)
        tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None and not tls:
            self.socket_fd = sock.fileno()
            self._socket = sock
        self._addresses = (_address(transport, "peername"), _address(transport, "sockname"), "https" if tls else "http")
        self._arm_head_timer()  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self._cancel_head_timer()
        self._cancel_keep_alive()
        if self._writability is not None:
            self.loop.remove_reader(self._writability.fileno())
            self._writability.close()
            self._writability = None
            self._watching = False
        for exchange in (self.exchange, *self._pipeline, *(handle.cycle for handle in self._handles)):
            if exchange is not None and not exchange.response_complete:
                exchange.disconnected = True
                exchange.notify()
        self.flow.release()
        if exc is None:
            self.transport.close()
        self.parser = None  # type: ignore[assignment]
        # Each exchange points back here: let them go now, not at a garbage collection.
        self.exchange = self._answering = None
        self._pipeline.clear()
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.cycle.scope["extensions"].pop(HANDLE_KEY, None)
            handle.connection_lost()

    def eof_received(self) -> None:
        pass  # the client's half-close ends the connection (the transport then closes)

    def pause_writing(self) -> None:
        self.flow.buffer_full(True)

    def resume_writing(self) -> None:
        self.flow.buffer_full(False)

    def close(self) -> None:
        """End the connection once what is written has left; a lingering close when the
        client is still sending this request's body."""
        transport = self.transport
        if self._refused:
            return  # lingering: dropped on its timer
        if self.receiving_body and not transport.is_closing() and transport.can_write_eof():
            self.linger()
        else:
            transport.close()

    def shutdown(self) -> None:
        """The server stops: close when idle, else after the response under way."""
        if self.exchange is None or self.exchange.response_complete:
            self.transport.close()
        else:
            self.exchange.keep_alive = False

    # -- bytes in: the head counted before the parser, and timed -----------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering after a 431 or a refused body: discard
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES + LINGER_MAX_BYTES:
                # Not an abort: a client still pushing its body would meet the reset on its
                # next send, milliseconds after the answer, and lose it (the kernel's buffers
                # alone hold more than LINGER_MAX_BYTES). The LINGER_S timer drops it.
                self.transport.pause_reading()
            return
        if self._ignoring:  # not parsed: reading waits (a request's `receive` reads one more piece)
            self.flow.pause_reading()
            return
        if self._keep_alive_timer is not None:
            self._cancel_keep_alive()
        if not self._reading_head:
            self._parse(data)
            return
        room = MAX_HEAD_BYTES - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            self._parse(data)
            # Timed only when a head does not arrive in one piece (the usual case costs no timer).
            if self._reading_head and self._head_bytes and self._head_timer is None and self.parser is not None:
                self._arm_head_timer()
            return
        # Feed what fits: the head may end inside it, and then the rest is body or a next head.
        if room:
            self._head_bytes += room
            self._parse(data[:room])
            if self.parser is None or self.transport.is_closing() or self._ignoring:
                return
        if self._reading_head:
            self._refuse_head()
            return
        self.data_received(data[room:])

    def _parse(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request is answered as a plain one; what follows its head is another
            # protocol, which we do not speak: ignored, and the connection ends after the answer.
            self._ignoring = True
            if self.exchange is not None:
                self.exchange.keep_alive = False
        except httptools.HttpParserError:
            self._refuse_malformed()

    def _refuse_malformed(self) -> None:
        """Answer 400 in its turn: after the answers of the requests before it (a client that
        sent more than its Content-Length gets its request's answer first), then close."""
        self._cancel_head_timer()
        self._ignoring = True
        exchange = self.exchange
        if not self._reading_head and exchange is not None:
            # It is this request's body that is malformed: the request gets no app's answer.
            exchange.disconnected = True
            exchange.notify()
            if exchange.response_started:
                exchange.end = CUT
                self.transport.close()  # an answer now would corrupt the one being sent
                return
            exchange.end = REFUSED  # its access line is the 400's
            self._malformed = exchange
            if self._pipeline:
                self._pipeline.pop()  # it is the last one queued: it never runs
        if self._response_under_way():
            self._refusal_pending = True
            self.flow.pause_reading()
        else:
            self._answer_malformed()

    def _answer_malformed(self) -> None:
        self._refusal_pending = False
        refusal = bad_request_response(self.date_line)
        self.transport.write(refusal.response)
        access = self.server.access_log
        if access is not None:
            exchange = self._malformed
            began = exchange.began if exchange is not None else self._began
            access.refused(400, refusal.request_id, refusal.body_bytes, self._addresses[0], began, exchange)
        self.close()

    def _response_under_way(self) -> bool:
        """A request before the one being parsed is not answered yet."""
        if self._pipeline:
            return True
        exchange = self._answering
        return exchange is not None and not exchange.response_complete and not exchange.disconnected

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect_continue = False
        self._began = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._reading_head = False
        if self._head_timer is not None:
            self._cancel_head_timer()
        parser = self.parser
        http_version = parser.get_http_version()
        url = httptools.parse_url(self._url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        client, server, scheme = self._addresses
        handle_slot: dict[str, Any] = {}
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": http_version,
            "server": server,
            "client": client,
            "scheme": scheme,
            "root_path": "",
            "headers": self._headers,
            "state": {},
            "method": parser.get_method().decode("ascii"),
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "extensions": handle_slot,
        }
        exchange = Exchange(
            self, scope, http_version != "1.0" and parser.should_keep_alive(), self._expect_continue,
            self._began or time.monotonic(),
        )
        handle_slot[HANDLE_KEY] = ConnectionHandle(self, exchange)
        previous, self.exchange = self.exchange, exchange
        if previous is None or previous.response_complete:
            self._start(exchange)
        else:
            self.flow.pause_reading()  # one request at a time: the next waits its turn
            self._pipeline.append(exchange)

    def on_body(self, body: bytes) -> None:
        self.exchange.body_received(body)  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        self.exchange.body_complete()  # type: ignore[union-attr]
        self._reading_head = True
        self._head_bytes = 0
        self._began = None

    # -- requests in turn ---------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self._answering = exchange
        self._handles.append(exchange.scope["extensions"][HANDLE_KEY])
        task = self.loop.create_task(exchange.run(self.app))
        tasks = self.server.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def response_finished(self, exchange: Exchange) -> None:
        """`exchange`'s response is all written: the next pipelined request, or the idle timer."""
        if self.transport.is_closing():
            return
        if self._pipeline:
            self.flow.resume_reading()
            self._start(self._pipeline.popleft())
        elif self._refusal_pending:
            self._answer_malformed()
        else:
            self.flow.resume_reading()
            self._cancel_keep_alive()
            self._keep_alive_timer = self.loop.call_later(KEEP_ALIVE_S, self._idle_too_long)

    def exchange_ended(self, exchange: Exchange) -> None:
        """Its app returned: its access line, and the handle leaves the scope (scope -> handle ->
        exchange -> scope would leave every request to the garbage collector: 6 % of small
        downloads' CPU)."""
        access = self.server.access_log
        if access is not None:
            access.request_ended(exchange)
        if self.corked:
            self.cork(False)
        handle = exchange.scope["extensions"].pop(HANDLE_KEY, None)
        if handle is not None:
            try:
                self._handles.remove(handle)
            except ValueError:
                pass  # the connection was lost first

    def _idle_too_long(self) -> None:
        self._keep_alive_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel_keep_alive(self) -> None:
        if self._keep_alive_timer is not None:
            self._keep_alive_timer.cancel()
            self._keep_alive_timer = None

    # -- lingering close and the head's bounds --------------------------------------------------

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
        if self._response_under_way():
            # A response is streaming here: an answer would corrupt it, so the connection ends.
            for handle in self._handles:
                handle.cut = True  # counted as a refused head, not as a download abort
                handle.cycle.end = CUT
            transport.close()
        else:
            refusal = head_too_large_response()
            transport.write(refusal.response)
            access = self.server.access_log
            if access is not None:
                access.refused(431, refusal.request_id, refusal.body_bytes, self._addresses[0], self._began)
            if transport.can_write_eof():
                # Lingering close (as nginx does): stop sending, keep reading and discarding for
                # a moment, so the kernel does not reset the connection before the client reads
                # the 431. The client sees the end of the stream at once.
                transport.write_eof()
            else:
                transport.close()  # TLS: the 431, then close_notify
        self._refused = True
        self.loop.call_later(LINGER_S, transport.abort)

    # -- payload: the gate and its audit, and a full socket ------------------------------------

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

    def cork(self, on: bool) -> None:
        """TCP_CORK around a zero-copy body, as nginx's `tcp_nopush`: the kernel sends only full
        segments until it is taken off, which then sends the last one. Loopback measured (a
        minimal sendfile server, 15 alternating rounds): ~0.15 CPU s per GiB corked, as nginx,
        ~0.28 without, sending faster but in smaller pieces (docs/performance.md, issue 26)."""
        if on == self.corked or self._socket is None:
            return
        self.corked = on
        if self.transport.is_closing():
            return  # (its descriptor may be closed already): nothing to send either way
        try:
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
        except (OSError, ValueError):
            pass  # gone meanwhile

    def wait_for_socket(self) -> None:
        """A zero-copy send found the socket full: writing pauses until the socket takes more.

        As nginx waits: edge-triggered, so the kernel reports the socket once each time it
        drains after it was full, and nothing is registered or removed per wait (the transport
        owns the socket's own registration with the loop and may not share it)."""
        if self._watching or self.transport.is_closing():
            return
        if self._writability is None:
            self._writability = select.epoll()
            self._writability.register(self.socket_fd, select.EPOLLOUT | select.EPOLLET)
            self.loop.add_reader(self._writability.fileno(), self._socket_writable)
        self._watching = True
        self.flow.socket_full(True)

    def _socket_writable(self) -> None:
        self._writability.poll(0)  # take the edge: the loop watches our epoll level-triggered
        if self._watching:
            self._watching = False
            self.flow.socket_full(False)


def _address(transport: asyncio.BaseTransport, which: str) -> tuple[str, int] | None:
    """(host, port) of the peer or of our end, as ASGI's `client` and `server`."""
    info = transport.get_extra_info(which)
    if isinstance(info, (list, tuple)) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


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


def protocol_for(runtime) -> type[HttpProtocol]:
    """The protocol class for one process: its head timeout, its metrics, its payload gate."""
    stats = HeadStats()
    runtime.registry.register(stats)
    lease = runtime.lease

    return type(
        "HttpProtocol",
        (HttpProtocol,),
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
