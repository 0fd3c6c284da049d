"""HTTP/1.1 answers read off a raw socket, for tests that must send what httpx would not.

A test that reads an answer reads the whole of it: the head and the body may arrive in separate
reads (they do under load), so looking for a body's text in the first `recv` is a race.
"""

from __future__ import annotations

import socket


def read_response(sock: socket.socket) -> bytes:
    """The whole answer: until its Content-Length (or last chunk) is in, or the server closes.

    The socket's own timeout bounds each read (TimeoutError if the server goes quiet)."""
    answer = b""
    while not complete(answer):
        data = sock.recv(65536)
        if not data:
            break
        answer += data
    return answer


def complete(answer: bytes) -> bool:
    """Whether `answer` holds a whole response (head and body)."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    status = int(head[9:12]) if head[9:12].isdigit() else 0
    if 100 <= status < 200 or status in (204, 304):
        return True
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            return len(body) >= int(value)
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return body.endswith(b"0\r\n\r\n")
    return False  # delimited by the close


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])
