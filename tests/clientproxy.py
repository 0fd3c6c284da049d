"""An HTTP/1.1 proxy for the client tests that misbehaves on purpose, between the client and a
real `arkvory serve`: it cuts a response after N body bytes, strips request headers (a backend
that ignores Range answers 200), flips a byte of a request body in flight, and logs every
exchange so tests can count requests and the body bytes that really crossed.

One request per connection: the proxy asks the server for `Connection: close` and relays until
it closes, which is all a test needs (httpx opens a new connection for the next request). Runs
its own event loop in a thread, like tests/tcpproxy.py, so synchronous tests drive it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable

CHUNK = 256 * 1024
CONTROL_TIMEOUT = 10.0


@dataclasses.dataclass
class Exchange:
    method: str
    target: str
    headers: dict[str, str]
    status: int = 0
    request_body_bytes: int = 0
    response_body_bytes: int = 0
    cut: bool = False


@dataclasses.dataclass
class Cut:
    """Cut the next response whose target contains `match` after `after_bytes` body bytes;
    `then` runs (in a thread) after the cut, before the proxy accepts the next request."""

    after_bytes: int
    match: str = ""
    then: Callable[[], None] | None = None


@dataclasses.dataclass
class Flip:
    """Flip one byte (at `offset` of the body) of the next request whose target contains `match`."""

    match: str
    offset: int = 0


@dataclasses.dataclass
class OnRequestBody:
    """Once `after_bytes` of the body of the next request whose target contains `match` have
    been forwarded, run `then` (in a thread; e.g. kill the server mid-part) and end the link."""

    match: str
    after_bytes: int
    then: Callable[[], None]


class HttpFaultProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port: int | None = None
        self.strip_request_headers: set[str] = set()  # lower-case names
        self.cuts: list[Cut] = []
        self.flips: list[Flip] = []
        self.body_hooks: list[OnRequestBody] = []
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._serialized = None  # an asyncio.Lock while a `then` hook runs
        self._clients: set[asyncio.StreamWriter] = set()  # accepted connections not yet closed
        self._relays: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpFaultProxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-fault-proxy", daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(CONTROL_TIMEOUT)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(CONTROL_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> HttpFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def requests_to(self, fragment: str, method: str | None = None) -> list[Exchange]:
        with self._lock:
            return [
                e for e in self.exchanges if fragment in e.target and (method is None or e.method == method)
            ]

    # -- inside the loop -----------------------------------------------------------------------

    async def _listen(self) -> int:
        self._serialized = asyncio.Lock()
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        # Let each relay run its `finally` (which closes both ends) before the loop stops: a
        # task destroyed while pending leaves its transports to the garbage collector, whose
        # ResourceWarnings then fail whichever later test happens to collect them. Again until
        # none is left: a connection accepted while the first ones ended starts a relay too.
        while relays := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
        # A relay cancelled before its first step never ran its `finally`: close its client here.
        for writer in self._clients:
            writer.transport.abort()
        self._clients.clear()
        # abort() closes a socket in a callback of the next loop turn: let those run.
        for _ in range(3):
            await asyncio.sleep(0)

    def _take(self, faults: list, target: str):
        with self._lock:
            for fault in faults:
                if fault.match in target:
                    faults.remove(fault)
                    return fault
        return None

    def _accepted(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # A plain callback rather than the relay itself: the connection is known from the moment
        # it is accepted, even if its relay's task is cancelled before it first runs.
        self._clients.add(client_writer)
        relay = asyncio.get_running_loop().create_task(self._relay(client_reader, client_writer))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream_writer = None
        try:
            async with self._serialized:  # a hook (re-pointing an asset, a kill) runs first
                pass
            head = await client_reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers: list[tuple[str, str]] = []
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers.append((name.strip(), value.strip()))
            seen = {name.lower(): value for name, value in headers}
            exchange = Exchange(method, target, seen)
            with self._lock:
                self.exchanges.append(exchange)
            kept = [
                (n, v) for n, v in headers
                if n.lower() not in self.strip_request_headers and n.lower() != "connection"
            ]
            kept.append(("Connection", "close"))
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            upstream_writer.write(
                (f"{method} {target} {version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in kept) + "\r\n").encode("latin-1")
            )
            remaining = int(seen.get("content-length", "0") or 0)
            flip = self._take(self.flips, target) if remaining else None
            hook = self._take(self.body_hooks, target) if remaining else None
            position = 0
            while remaining:
                data = await client_reader.read(min(CHUNK, remaining))
                if not data:
                    return
                if flip is not None and position <= flip.offset < position + len(data):
                    data = bytearray(data)
                    data[flip.offset - position] ^= 0xFF
                    data = bytes(data)
                position += len(data)
                remaining -= len(data)
                exchange.request_body_bytes += len(data)
                upstream_writer.write(data)
                await upstream_writer.drain()
                if hook is not None and exchange.request_body_bytes >= hook.after_bytes:
                    exchange.cut = True
                    async with self._serialized:
                        await asyncio.to_thread(hook.then)
                    return
            response_head = await upstream_reader.readuntil(b"\r\n\r\n")
            exchange.status = int(response_head.split(b" ", 2)[1])
            client_writer.write(response_head)
            cut = self._take(self.cuts, target) if method == "GET" and exchange.status in (200, 206) else None
            while data := await upstream_reader.read(CHUNK):
                if cut is not None and exchange.response_body_bytes + len(data) >= cut.after_bytes:
                    data = data[: cut.after_bytes - exchange.response_body_bytes]
                    exchange.response_body_bytes += len(data)
                    client_writer.write(data)
                    await client_writer.drain()
                    exchange.cut = True
                    await _flushed(client_writer)
                    client_writer.transport.abort()
                    if cut.then is not None:
                        async with self._serialized:
                            await asyncio.to_thread(cut.then)
                    return
                exchange.response_body_bytes += len(data)
                client_writer.write(data)
                await client_writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a peer went away: the link just ends
        finally:
            client_writer.transport.abort()
            self._clients.discard(client_writer)
            if upstream_writer is not None:
                upstream_writer.transport.abort()


async def _flushed(writer: asyncio.StreamWriter, timeout: float = 2.0) -> None:
    """Until the bytes handed to the transport have left (abort() would drop them)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while writer.transport.get_write_buffer_size() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.005)
