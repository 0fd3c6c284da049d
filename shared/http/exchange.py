"""One request and its response on a connection, as the ASGI 3 app sees them: `receive` hands
over the request body as it arrives, `send` writes the response head and body (Content-Length,
chunked, or nothing for HEAD/204/304), and `run` answers for an app that fails or forgets.

Written for our protocol (protocol.py) and no other server; it keeps the behaviour uvicorn's
httptools protocol had: `100 Continue` on the first `receive`, `connection: close` when the
connection ends after the response, a request body buffered up to BODY_BUFFER_BYTES before
reading pauses, and the checks of every response header. The content routes write their
payload past `send`, through the connection handle (handle.py), which keeps this bookkeeping.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

from arkvory.shared.errors import TransferAborted

from .refusals import REQUEST_ID_KEY, internal_error_response

log = logging.getLogger("arkvory.http")

# A request body buffered beyond this pauses reading until the app asks for it.
BODY_BUFFER_BYTES = 64 * 1024

# RFC 9110's token characters for header names; a value may not hold control characters (a
# CR or LF would split the response). Checked on every header the app sends.
INVALID_HEADER_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
INVALID_HEADER_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT = {"type": "http.disconnect"}


class FlowControl:
    """Whether the connection may take more bytes now, and reading paused or not.

    Writing pauses for two reasons: the transport's buffer is above its high-water mark (its
    `pause_writing`), or a zero-copy send found the socket full (handle.py waits for the socket
    itself). `write_paused` is an attribute, read per payload chunk. Waiting is a bare future
    per waiter (and a timer for a bounded wait): a download may wait for its client hundreds of
    times per GiB, where an Event and `asyncio.timeout` cost several times more."""

    __slots__ = ("transport", "loop", "read_paused", "write_paused", "_buffer_full", "_socket_full", "_waiters")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.read_paused = False
        self.write_paused = False
        self._buffer_full = False
        self._socket_full = False
        self._waiters: list[asyncio.Future] = []

    async def drain(self) -> None:
        """Until writing resumes (at once when it is not paused)."""
        if self.write_paused:
            await self.wait(None)

    async def wait(self, timeout: float | None) -> bool:
        """Until writing resumes: True; False when `timeout` seconds passed first."""
        if not self.write_paused:
            return True
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        timer = None if timeout is None else self.loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:  # timed out, or cancelled while waiting
                self._waiters.remove(waiter)

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def buffer_full(self, full: bool) -> None:
        self._buffer_full = full
        self._update()

    def socket_full(self, full: bool) -> None:
        self._socket_full = full
        self._update()

    def release(self) -> None:
        """The connection is gone: nobody waits to write any more."""
        self._buffer_full = self._socket_full = False
        self._update()

    def _update(self) -> None:
        paused = self._buffer_full or self._socket_full
        if paused != self.write_paused:
            self.write_paused = paused
            if not paused and self._waiters:
                waiters, self._waiters = self._waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(True)


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Connection(Protocol):
    """What an exchange and its handle need of their connection (protocol.HttpProtocol)."""

    transport: asyncio.Transport
    flow: FlowControl
    loop: asyncio.AbstractEventLoop
    socket_fd: int  # -1 unless plain TCP
    stats: Any  # protocol.HeadStats, or None

    @property
    def date_line(self) -> bytes: ...

    def close(self) -> None: ...

    def response_finished(self, exchange: Exchange) -> None: ...

    def exchange_ended(self, exchange: Exchange) -> None: ...

    def admit_payload(self) -> bool: ...

    def wait_for_socket(self) -> None: ...

    corked: bool

    def cork(self, on: bool) -> None: ...


class Exchange:
    """One request's state between the parser, the app and the connection; and what the access
    log says of it (access_log.py): its status, payload bytes both ways, when it began and how
    it ended when not in full (`end`: "cut" by the server, "refused" by the edge)."""

    __slots__ = (
        "connection", "transport", "flow", "scope", "keep_alive", "waiting_for_100_continue",
        "disconnected", "response_started", "response_complete", "chunked_encoding",
        "expected_content_length", "more_body", "_body", "_body_size", "_news", "_waiter",
        "status", "sent", "received", "began", "end",
    )

    def __init__(
        self,
        connection: Connection,
        scope: dict[str, Any],
        keep_alive: bool,
        expect_continue: bool,
        began: float,
    ) -> None:
        self.connection = connection
        self.transport = connection.transport
        self.flow = connection.flow
        self.scope = scope
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_continue
        # The client left, or the server cut the response: nothing more is written.
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.more_body = True
        self._body: list[bytes] = []
        self._body_size = 0
        # Something happened that `receive` reports (body, its end, a disconnect, the response's
        # end) since it last returned; and the future it waits on, made only when it must wait.
        self._news = False
        self._waiter: asyncio.Future | None = None
        self.status = 0  # of the response head, once written
        self.sent = self.received = 0  # payload bytes: the response's body, the request's
        self.began = began  # time.monotonic() at its head's first byte
        self.end: str | None = None

    # -- from the parser and the connection --------------------------------------------------

    def body_received(self, piece: bytes) -> None:
        self.received += len(piece)
        if self.response_complete:
            return  # the answer went out before the body was read: it is discarded
        self._body.append(piece)
        self._body_size += len(piece)
        if self._body_size > BODY_BUFFER_BYTES:
            self.flow.pause_reading()
        self.notify()

    def body_complete(self) -> None:
        if self.response_complete:
            return
        self.more_body = False
        self.notify()

    def notify(self) -> None:
        self._news = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the ASGI side -----------------------------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            if not self._news:
                self._waiter = self.connection.loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            self._news = False
        if self.disconnected or self.response_complete:
            return _DISCONNECT
        pieces = self._body
        if not pieces:
            body = b""
        elif len(pieces) == 1:
            body = pieces[0]  # as httptools made it: no copy
        else:
            body = b"".join(pieces)
        self._body = []
        self._body_size = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self._send_head(message["status"], message.get("headers", ()))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
            self._send_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")

    def _send_head(self, status: int, headers: Any) -> None:
        self.response_started = True
        self.status = status
        self.waiting_for_100_continue = False
        head = [STATUS_LINES[status], self.connection.date_line]
        closing = False
        for name, value in headers:
            if INVALID_HEADER_NAME.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if INVALID_HEADER_VALUE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [t.strip().lower() for t in value.split(b",")]:
                self.keep_alive = False
                closing = True
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closing:
            head.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        self.transport.write(b"".join(head))

    def _send_body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            body = b""
        elif self.chunked_encoding:
            if body:
                self.transport.writelines((b"%x\r\n" % len(body), body, b"\r\n0\r\n\r\n" if not more_body else b"\r\n"))
            elif not more_body:
                self.transport.write(b"0\r\n\r\n")
        else:
            size = len(body)
            if size > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= size
            if size:
                self.transport.write(body)
        self.sent += len(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.finish()

    def finish(self) -> None:
        """The response is all written: close unless kept alive, then the next request."""
        self.response_complete = True
        self.notify()
        if not self.keep_alive:
            self.connection.close()
        self.connection.response_finished(self)

    # -- the app's run -----------------------------------------------------------------------

    async def run(self, app: Callable) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            # Only the server cancels a request (its graceful shutdown ran out): it said so.
            self._end_unfinished()
        except BaseException as exc:
            if not isinstance(exc, TransferAborted):  # a cut of ours, counted where it was made
                log.error("Exception in ASGI application", exc_info=exc)
            self._end_unfinished()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self.connection.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                self._end_unfinished()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.connection.close()
        finally:
            self.connection.exchange_ended(self)

    def _end_unfinished(self) -> None:
        """A 500 when nothing was sent yet; otherwise the connection ends (the client sees a
        response shorter than announced, never a wrong one)."""
        if self.response_started or self.disconnected:
            self.connection.close()
            return
        self.response_started = True
        self.keep_alive = False
        refusal = internal_error_response(self.connection.date_line, self.scope.get(REQUEST_ID_KEY))
        self.status = 500
        self.sent += refusal.body_bytes
        self.transport.write(refusal.response)
        self.finish()
