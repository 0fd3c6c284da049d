"""The listening side of every process's HTTP edge: listen (plain TCP or TLS), make one
HttpProtocol per connection, keep the `date` header current, and stop in order.

Stopping (`shutdown`), in uvicorn's order: stop listening, ask every connection to end after the
response under way (idle ones close at once), wait up to the grace period for the connections
and the requests' tasks to finish, then cancel what still runs and drop what is still connected.
There is no ASGI lifespan: the process's Runtime is started before the server listens and closed
after it stopped (shared/process/server.py). Signals are the process's to handle. The access
log's thread, when there is one, starts with the server and ends after its last connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from email.utils import formatdate

from .access_log import AccessLog
from .protocol import HttpProtocol

log = logging.getLogger("arkvory.http")

_POLL_S = 0.1  # how often a stopping server looks whether its connections have ended
_CANCELLED_WAIT_S = 1.0  # how long cancelled requests get to end before their connections drop


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context with the standard library's defaults (TLS 1.2 or newer, its cipher
    list), no client certificates."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


class HttpServer:
    """Serves `app` (ASGI 3) with `protocol` (HttpProtocol or a class from `protocol_for`)."""

    def __init__(
        self,
        app: Callable,
        protocol: type[HttpProtocol] = HttpProtocol,
        *,
        tls: ssl.SSLContext | None = None,
        grace_s: float = 5.0,
        access_log: AccessLog | None = None,
    ) -> None:
        self.app = app
        self.protocol = protocol
        self.tls = tls
        self.grace_s = grace_s
        # Read by each connection at each request's end: None when the access log is off.
        self.access_log = access_log if access_log is not None and access_log.enabled else None
        self.connections: set[HttpProtocol] = set()
        self.tasks: set[asyncio.Task] = set()
        self.date_line = b""
        self.listening = False
        self.stopping = False
        self._servers: list[asyncio.AbstractServer] = []
        self._date_timer: asyncio.TimerHandle | None = None
        self._forced = False

    @property
    def sockets(self) -> list[socket.socket]:
        return [sock for server in self._servers for sock in (server.sockets or ())]

    async def start(self, host: str | None = None, port: int | None = None, *, sock: socket.socket | None = None) -> None:
        """Listen on `host`:`port`, or on the bound socket `sock`; raises OSError (a port in use)."""
        self._tick_date()
        loop = asyncio.get_running_loop()

        def make_protocol() -> HttpProtocol:
            return self.protocol(self.app, self)

        try:
            if sock is not None:
                server = await loop.create_server(make_protocol, sock=sock, ssl=self.tls, backlog=2048)
            else:
                server = await loop.create_server(make_protocol, host=host, port=port, ssl=self.tls, backlog=2048)
        except BaseException:
            self._stop_date()
            raise
        self._servers.append(server)
        self.listening = True
        if self.access_log is not None:
            self.access_log.start()

    def force(self) -> None:
        """Stop waiting for requests in flight (a second stop signal): `shutdown` cancels them now."""
        self._forced = True

    async def shutdown(self, *, force: bool = False) -> None:
        """Stop listening, let the requests in flight finish within the grace period (not with
        `force`), then cancel them and drop their connections."""
        if self.stopping:
            return
        self.stopping = True
        self._forced = self._forced or force
        for server in self._servers:
            server.close()
        self.listening = False
        for connection in list(self.connections):
            connection.shutdown()
        if not self._forced:
            await asyncio.sleep(_POLL_S)  # as uvicorn: idle connections close meanwhile
            deadline = time.monotonic() + self.grace_s
            while (self.connections or self.tasks) and not self._forced and time.monotonic() < deadline:
                await asyncio.sleep(_POLL_S)
        if self.tasks:
            if not self._forced:  # (forced: the caller said why it stops, once)
                log.error(
                    "cancelling %d request(s) still running: the graceful stop's %g s are over",
                    len(self.tasks), self.grace_s,
                )
            for task in list(self.tasks):
                task.cancel()
            await asyncio.wait(list(self.tasks), timeout=_CANCELLED_WAIT_S)
        for connection in list(self.connections):
            connection.transport.abort()
        for server in self._servers:
            await server.wait_closed()
        self._stop_date()
        if self.access_log is not None:
            await self.access_log.close()  # the last lines (lost only with a hung handler)

    def _tick_date(self) -> None:
        """The `date` line of every response, made once a second (RFC 9110 asks for it)."""
        now = time.time()
        self.date_line = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        self._date_timer = asyncio.get_running_loop().call_later(1.0 - now % 1.0, self._tick_date)

    def _stop_date(self) -> None:
        if self._date_timer is not None:
            self._date_timer.cancel()
            self._date_timer = None

