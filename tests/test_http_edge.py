"""Our HTTP edge (shared/http/: server, protocol, exchange, handle) on uvloop, as every process
runs it: a real server on a free port, real sockets, the bytes on the wire. What uvicorn's
protocol did before it (keep-alive, pipelining, HTTP/1.0, 100-continue, chunked bodies, HEAD,
a 400 for what the parser refuses, a 500 for a failed app) and the graceful stop's order; the
processes' own tests (test_streaming.py, test_hostile_input.py...) hold the head bounds, the
timeouts, TLS and the payload paths."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile

import pytest

from arkvory.shared.http.handle import HANDLE_KEY, encode_header_block
from arkvory.shared.http.protocol import HeadStats, HttpProtocol
from arkvory.shared.http.server import HttpServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend():
    return ("asyncio", {"use_uvloop": True})


async def read_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def echo(scope, receive, send):
    """Answers `METHOD PATH BODY-LENGTH HTTP-VERSION`; /fail raises, /silent answers nothing."""
    body = await read_body(receive)
    if scope["path"] == "/fail":
        raise ValueError("the app failed")
    if scope["path"] == "/silent":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(float(scope["query_string"] or b"0.5"))
    text = b"%s %s %d %s" % (scope["method"].encode(), scope["path"].encode(), len(body), scope["http_version"].encode())
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(text))]})
    await send({"type": "http.response.body", "body": text})


class Served:
    def __init__(self, server: HttpServer, port: int) -> None:
        self.server = server
        self.port = port

    async def exchange(self, data: bytes, quiet_s: float = 0.5, *, send_more: bytes | None = None) -> bytes:
        """What the server sends for `data` until it closes (marked `<closed>`) or is quiet
        for `quiet_s`; `send_more` goes after the first bytes of an answer arrived."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(data)
        received = b""
        try:
            while True:
                try:
                    piece = await asyncio.wait_for(reader.read(65536), quiet_s)
                except TimeoutError:
                    return received
                if not piece:
                    return received + b"<closed>"
                received += piece
                if send_more is not None:
                    writer.write(send_more)
                    send_more = None
        finally:
            writer.close()


async def serve(app=echo, protocol: type[HttpProtocol] = HttpProtocol, grace_s: float = 5.0) -> Served:
    server = HttpServer(app, protocol, grace_s=grace_s)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await server.start(sock=sock)
    return Served(server, sock.getsockname()[1])


def heads(answer: bytes) -> list[str]:
    """The status lines of the answers in `answer` (a body here never holds `HTTP/1.1 `)."""
    return ["HTTP/1.1 " + piece.split(b"\r\n", 1)[0].decode() for piece in answer.split(b"HTTP/1.1 ")[1:]]


async def test_keep_alive_and_pipelined_requests_are_answered_in_order():
    served = await serve()
    try:
        answer = await served.exchange(
            b"GET /one HTTP/1.1\r\nHost: x\r\n\r\nPOST /two HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /three HTTP/1.1\r\nHost: x\r\n\r\n"
        )
    finally:
        await served.server.shutdown()
    assert heads(answer) == ["HTTP/1.1 200 OK"] * 3
    assert answer.index(b"GET /one 0 1.1") < answer.index(b"POST /two 3 1.1") < answer.index(b"GET /three 0 1.1")
    assert b"<closed>" not in answer  # kept alive
    assert answer.count(b"\r\ndate: ") == 3 and b"server:" not in answer


async def test_http_1_0_and_connection_close_end_the_connection_after_the_answer():
    served = await serve()
    try:
        old = await served.exchange(b"GET /old HTTP/1.0\r\n\r\n")
        closing = await served.exchange(b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\nGET /ignored HTTP/1.1\r\n\r\n")
    finally:
        await served.server.shutdown()
    assert old.endswith(b"\r\nconnection: close\r\n\r\nGET /old 0 1.0<closed>"), old
    assert closing.endswith(b"\r\nconnection: close\r\n\r\nGET /c 0 1.1<closed>"), closing


async def test_100_continue_is_sent_when_the_app_reads_the_body():
    served = await serve()
    try:
        answer = await served.exchange(
            b"POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", send_more=b"hello"
        )
    finally:
        await served.server.shutdown()
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), answer
    assert answer.endswith(b"POST /up 5 1.1")


async def test_a_chunked_body_reaches_the_app_whole_and_head_gets_no_body():
    served = await serve()
    try:
        chunked = await served.exchange(
            b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        head = await served.exchange(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        await served.server.shutdown()
    assert chunked.endswith(b"PUT /c 11 1.1"), chunked
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"content-length: 13\r\n\r\n"), head


async def test_what_the_parser_refuses_is_400_json_with_a_request_id():
    served = await serve()
    try:
        answer = await served.exchange(b"NOT HTTP AT ALL\r\n\r\n")
    finally:
        await served.server.shutdown()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"\r\nconnection: close" in head
    assert body.endswith(b"<closed>")
    refusal = json.loads(body.removesuffix(b"<closed>"))
    assert refusal["code"] == "invalid_input"
    assert f"\r\nx-request-id: {refusal['requestId']}\r\n".encode() in head


async def test_garbage_after_a_request_is_refused_after_that_request_is_answered():
    """More bytes than the Content-Length, or a malformed head pipelined behind a request
    still running: the request gets its answer first, then the 400, then the close (an early
    400 would be followed by the first request's answer on the same stream)."""
    served = await serve()
    try:
        overlong = await served.exchange(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc[[[[[[[[[[")
        behind_slow = await served.exchange(b"GET /slow?0.3 HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP\r\n\r\n", quiet_s=2)
    finally:
        await served.server.shutdown()
    for answer, first in ((overlong, b"POST /p 3 1.1"), (behind_slow, b"GET /slow 0 1.1")):
        assert heads(answer) == ["HTTP/1.1 200 OK", "HTTP/1.1 400 Bad Request"], answer
        assert answer.index(first) < answer.index(b"HTTP/1.1 400") and answer.endswith(b"<closed>"), answer


async def test_an_upgrade_is_answered_as_a_plain_request_and_then_the_connection_ends():
    served = await serve()
    try:
        answer = await served.exchange(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nnot http at all"
        )
    finally:
        await served.server.shutdown()
    assert heads(answer) == ["HTTP/1.1 200 OK"], answer
    assert answer.endswith(b"connection: close\r\n\r\nGET /ws 0 1.1<closed>"), answer


async def test_an_app_that_fails_or_says_nothing_gets_a_500_and_the_connection_ends(caplog):
    served = await serve()
    try:
        failed = await served.exchange(b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\n\r\n")
        silent = await served.exchange(b"GET /silent HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        await served.server.shutdown()
    for answer in (failed, silent):
        assert heads(answer) == ["HTTP/1.1 500 Internal Server Error"], answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2].removesuffix(b"<closed>"))["code"] == "internal"
        assert answer.endswith(b"<closed>")
    assert "Exception in ASGI application" in caplog.text


async def test_a_graceful_stop_finishes_requests_in_flight_and_refuses_new_connections():
    served = await serve(grace_s=5.0)
    in_flight = asyncio.ensure_future(served.exchange(b"GET /slow?0.5 HTTP/1.1\r\nHost: x\r\n\r\n", quiet_s=3))
    idle = asyncio.ensure_future(served.exchange(b"GET /idle HTTP/1.1\r\nHost: x\r\n\r\n", quiet_s=3))
    await asyncio.sleep(0.2)
    stopping = asyncio.ensure_future(served.server.shutdown())
    await asyncio.sleep(0.05)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", served.port)
    answer = await in_flight
    assert answer.endswith(b"connection: close\r\n\r\nGET /slow 0 1.1<closed>"), answer
    assert (await idle).endswith(b"GET /idle 0 1.1<closed>")  # closed when the stop began
    await asyncio.wait_for(stopping, 5)
    assert not served.server.connections and not served.server.tasks


async def test_requests_past_the_grace_period_are_cancelled_and_dropped():
    served = await serve(grace_s=0.3)
    in_flight = asyncio.ensure_future(served.exchange(b"GET /slow?30 HTTP/1.1\r\nHost: x\r\n\r\n", quiet_s=10))
    await asyncio.sleep(0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(served.server.shutdown(), 5)
    assert loop.time() - started < 2
    answer = await asyncio.wait_for(in_flight, 5)
    assert answer.endswith(b"<closed>") and b" 200 " not in answer, answer
    assert not served.server.connections and not served.server.tasks


async def test_a_full_socket_pauses_sendfile_until_it_drains_without_copying_a_byte():
    """The zero-copy path waits for the socket itself: nothing goes through the transport's
    buffer, the flow control pauses when the socket is full, and every byte arrives. The body
    goes corked (TCP_CORK, as nginx's tcp_nopush), and the cork comes off with the response's
    end, so its last segment leaves at once."""
    data = os.urandom(8 * 1024 * 1024 + 100)  # far more than loopback socket buffers hold
    pauses = []
    corked = []

    class Counted(HttpProtocol):
        stats = HeadStats()

    async def app(scope, receive, send):
        handle = scope["extensions"][HANDLE_KEY]
        sock = handle.transport.get_extra_info("socket")
        handle.start(200, encode_header_block([(b"content-length", b"%d" % len(data))]), len(data))
        with tempfile.TemporaryFile() as blob:
            blob.write(data)
            blob.flush()
            offset = 0
            while offset < len(data):
                if handle.cycle.flow.write_paused:
                    pauses.append(offset)
                    assert await handle.writable(10)
                assert handle.buffered == 0
                offset += handle.sendfile(blob.fileno(), offset, min(1024 * 1024, len(data) - offset))
                corked.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK))
        handle.complete()
        corked.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK))

    served = await serve(app, Counted)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        writer.write(b"GET /blob HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        body = b""
        while len(body) < len(data):
            await asyncio.sleep(0.002)  # a slow reader: the server's socket fills
            body += await asyncio.wait_for(reader.read(256 * 1024), 10)
        writer.close()
    finally:
        await served.server.shutdown()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == data
    assert pauses, "the socket never filled"
    assert Counted.stats.sendfile_bytes == len(data)
    assert set(corked[:-1]) == {1} and corked[-1] == 0, corked
