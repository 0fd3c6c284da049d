"""How the client sends a large body (an upload's part), against a raw server on 127.0.0.1.

httpcore's blocking send loop copies the rest of a body after every partial `send`
(encode/httpcore#1029), so the client hands a large body over in slices under its
Content-Length (shared/client/transport.py `framed_body`). These tests read what arrives on the
wire: the same single framed body, every byte offered to the socket about once, and a retried
attempt sending the whole body again.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from arkvory.shared.client import RetryPolicy
from arkvory.shared.client.transport import BODY_SLICE, Transport

pytestmark = pytest.mark.timeout(60)

PART = 16 * 1024 * 1024
FAST = RetryPolicy(max_attempts=3, max_total_seconds=30, backoff_initial=0.05, backoff_max=0.1)


class RawServer:
    """Reads each request's head and Content-Length body in small pieces from a small receive
    buffer (so that the client's sends are partial), records it, and answers with the next
    status of `statuses` (the last one repeats)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.requests: list[tuple[bytes, str]] = []  # (head, SHA-256 of the body)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # inherited by accepted sockets
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.settimeout(30)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(30)
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    piece = connection.recv(4096)
                    if not piece:
                        return
                    pending += piece
                head, _, pending = pending.partition(b"\r\n\r\n")
                fields = dict(
                    line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line
                )
                length = int({k.strip().lower(): v for k, v in fields.items()}.get(b"content-length", b"0"))
                digest = hashlib.sha256(pending[:length])
                left = length - len(pending[:length])
                pending = pending[length:]
                while left:
                    piece = connection.recv(min(left, 16 * 1024))
                    if not piece:
                        return
                    digest.update(piece)
                    left -= len(piece)
                self.requests.append((head, digest.hexdigest()))
                status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
                connection.sendall(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}".encode()
                )

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


@pytest.fixture
def raw_server() -> Iterator[callable]:
    servers: list[RawServer] = []

    def start(*statuses: int) -> RawServer:
        servers.append(RawServer(list(statuses)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def offered(monkeypatch) -> list[tuple[int, int]]:
    """(bytes offered, bytes taken) of every `send` to a socket of this process."""
    sends: list[tuple[int, int]] = []
    send = socket.socket.send

    def counting_send(self, data, *args):
        taken = send(self, data, *args)
        sends.append((memoryview(data).nbytes, taken))
        return taken

    monkeypatch.setattr(socket.socket, "send", counting_send)
    return sends


def test_a_large_part_goes_as_one_framed_body_offered_to_the_socket_about_once(raw_server, offered):
    server = raw_server(200)
    body = os.urandom(PART)
    transport = Transport([server.url], "secret", retry=FAST, timeout=30)
    try:
        response = transport.send("PUT", "/upload/parts/0", "upload part 0", content=body,
                                  headers={"X-Content-SHA256": hashlib.sha256(body).hexdigest()})
    finally:
        transport.close()
    assert response.status_code == 200
    [(head, received_sha256)] = server.requests
    assert received_sha256 == hashlib.sha256(body).hexdigest()
    assert f"content-length: {PART}".encode() in head.lower()
    assert b"transfer-encoding" not in head.lower()  # framed as one body, not chunked
    # The body did not go in one `send` (the slow reader saw to that): the case to get right.
    assert len([length for length, _ in offered if length > 4096]) > 1
    # After each partial send the whole rest of the body was offered again (and copied):
    # 4-5 times a 16 MiB part here, ~20 times a 64 MiB one.
    total = sum(length for length, _ in offered)
    assert total < 2 * PART, f"{total} bytes offered to the socket for a {PART}-byte body"


def test_a_retried_part_sends_its_whole_body_again(raw_server):
    server = raw_server(503, 200)
    body = os.urandom(4 * BODY_SLICE + 123)
    transport = Transport([server.url], "secret", retry=FAST, timeout=30)
    try:
        response = transport.request("PUT", "/upload/parts/0", "upload part 0", content=body)
    finally:
        transport.close()
    assert response.status_code == 200
    assert [sha for _, sha in server.requests] == [hashlib.sha256(body).hexdigest()] * 2
