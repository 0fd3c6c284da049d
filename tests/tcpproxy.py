"""A TCP proxy between a process under test and PostgreSQL that stalls or cuts the network.

Faults come from the network, never from mocks of the database (asyncpg's tests/test_adversity.py
does the same). The proxy runs its own event loop in a thread, so plain synchronous test
functions drive it, and so can coroutines: every method returns once the proxy has acted.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.parse

CONNECT_TIMEOUT = 10.0
CONTROL_TIMEOUT = 10.0  # stall(), cut() and friends; they take milliseconds
STOP_TIMEOUT = 5.0
CHUNK = 64 * 1024


class TcpProxy:
    """Listens on 127.0.0.1 and forwards each connection to upstream_host:upstream_port.

    `sent_upstream`: bytes forwarded from clients to the server so far (a test waits on it to
    act at a known point of a transfer instead of racing it); `sent_downstream`: from the server
    to clients.

    stall(): nothing is forwarded any more, in either direction, on current and new connections,
    and the sockets stay open, as in a network partition. A connection accepted during a stall
    reaches the server only after resume(). cut(): every current connection is closed.
    refuse(): every current connection is closed and every new one at once, as by a stopped
    server, until resume().
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._flowing: asyncio.Event | None = None
        self._refusing = False
        self._links: dict[asyncio.Task, list[socket.socket | asyncio.StreamWriter]] = {}
        self.sent_upstream = 0  # written by the proxy's thread only; an int read is atomic
        self.sent_downstream = 0

    @classmethod
    def for_url(cls, database_url: str) -> TcpProxy:
        parts = urllib.parse.urlsplit(database_url)
        if not parts.hostname:
            raise ValueError(
                f"database_url: expected postgresql://host:port/..., got {database_url!r}"
            )
        return cls(parts.hostname, parts.port or 5432)

    def url_for(self, database_url: str) -> str:
        """database_url with its host and port replaced by the proxy's."""
        if self.port is None:
            raise RuntimeError("TcpProxy.url_for: call start() first")
        parts = urllib.parse.urlsplit(database_url)
        userinfo, _, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def start(self) -> TcpProxy:
        if self._thread is not None:
            raise RuntimeError("TcpProxy.start: already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tcp-proxy", daemon=True
        )
        self._thread.start()
        try:
            self.port = self._call(self._listen())
        except BaseException:
            self.stop()
            raise
        return self

    def stall(self) -> None:
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        self._call(self._set_flowing(True))

    def refuse(self) -> None:
        self._call(self._refuse())

    def cut(self) -> None:
        self._call(self._cut())

    def stop(self) -> None:
        """Stop listening, close every connection, end the thread; safe to call twice."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        try:
            if loop.is_running():
                self._call(self._shutdown())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=STOP_TIMEOUT)
            if not thread.is_alive():
                loop.close()
            self._thread = self._loop = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CONTROL_TIMEOUT)

    # --- inside the proxy's loop -----------------------------------------------------------
    # Our own accepting, not asyncio.start_server: each accepted socket is registered before its
    # relay task first runs, so cut() and stop() close even a connection accepted a moment ago.
    # A plain callback, not a task awaiting sock_accept: cancelling that task could drop a socket
    # it had just accepted.

    async def _listen(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._listener = socket.socket()
        self._listener.setblocking(False)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._loop.add_reader(self._listener, self._accept_waiting)
        return self._listener.getsockname()[1]

    def _accept_waiting(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # none waiting (BlockingIOError); out of descriptors: a test's bug
                return
            if self._refusing:
                client.close()
                continue
            client.setblocking(False)
            self._links[self._loop.create_task(self._relay(client))] = [client]

    async def _set_flowing(self, flowing: bool) -> None:
        # Runs on the loop, so it takes effect between two chunks, never within one.
        if flowing:
            self._refusing = False
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _refuse(self) -> None:
        self._refusing = True
        await self._cut()

    async def _relay(self, client: socket.socket) -> None:
        link = self._links[asyncio.current_task()]
        try:
            await self._flowing.wait()  # a partitioned server must not see new connections either
            client_reader, client_writer = await asyncio.open_connection(sock=client)
            link[0] = client_writer
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(self.upstream_host, self.upstream_port), CONNECT_TIMEOUT
            )
            link.append(upstream_writer)
            async with asyncio.TaskGroup() as pumps:
                pumps.create_task(self._pump(client_reader, upstream_writer, upstream=True))
                pumps.create_task(self._pump(upstream_reader, client_writer))
        except* (OSError, TimeoutError):
            pass  # a peer went away or the server is down: the link just ends
        finally:
            self._links.pop(asyncio.current_task(), None)
            _close(link)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool = False) -> None:
        while data := await reader.read(CHUNK):
            await self._flowing.wait()  # after the read: a chunk read before a stall waits too
            # Counted before the write: the peer may read the bytes (and a test then read the
            # count) before this thread runs the next line.
            if upstream:
                self.sent_upstream += len(data)
            else:
                self.sent_downstream += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()  # pass the half-close on, as a real network would

    async def _cut(self) -> None:
        tasks = list(self._links)
        for task in tasks:
            _close(self._links.pop(task))  # a task cancelled before its first step cannot
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT)

    async def _shutdown(self) -> None:
        # Connections still in the listen backlog are reset by the kernel when the listener closes.
        self._loop.remove_reader(self._listener)
        self._listener.close()
        await self._cut()


def _close(link: list[socket.socket | asyncio.StreamWriter]) -> None:
    for end in link:
        if isinstance(end, socket.socket):
            end.close()
        else:
            end.transport.abort()
