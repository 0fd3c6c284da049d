"""Issue 6 §1: hostile requests to a writer and a gateway (shared mode, 2 slots) cost neither
process its lease, its readiness, nor a concurrent throttled download."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import httpx
import pytest

from .harness import ADMIN_TOKEN, READER_TOKEN, eventually

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

PIECE = 64 * 1024
TOTAL_RATE = 2 * 1024 * 1024  # 1 MiB/s per process: the downloads below last about 6 s
ARTIFACT_SIZE = 6 * 1024 * 1024


def push(port: int, head: bytes, piece: bytes, total: int, *, seconds: float) -> int | None:
    """Send `head`, then `piece` until `total` bytes or `seconds` passed or the server answered
    or closed; returns the answer's status, or None when the connection closed without one."""
    deadline = time.monotonic() + seconds
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(head)
            sent = 0
            sock.setblocking(False)
            while sent < total and time.monotonic() < deadline:
                try:
                    sent += sock.send(piece)
                except BlockingIOError:
                    pass  # the server is not reading: maybe it answered
                try:
                    early = sock.recv(65536, socket.MSG_PEEK)
                except BlockingIOError:
                    continue
                if early or early == b"":
                    break  # an answer, or the server closed
            sock.setblocking(True)
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            answer = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            return None
    if not answer.startswith(b"HTTP/1.1 "):
        return None
    return int(answer[9:12])


def json_head(path: str, length: int, token: str | None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode() + auth
        + f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
    )


@pytest.fixture
def site(cluster):
    shared = cluster.shared_env(slots=2, total=TOTAL_RATE)
    writer = cluster.writer(shared).wait_ready()
    blob = os.urandom(ARTIFACT_SIZE)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "pub", "public": True}).status_code == 201
        artifact = client.post("/api/v1/repositories/pub/artifacts", params={"name": "big"}, content=blob).json()
    gateway = cluster.gateway(1, shared).wait_ready()
    return writer, gateway, f"/api/v1/repositories/pub/artifacts/{artifact['id']}/content", blob


def leases_lost(process) -> float:
    with process.client(READER_TOKEN) as client:
        for line in client.get("/health/metrics").text.splitlines():
            if line.startswith("arkvory_leases_lost_total "):
                return float(line.split()[1])
    raise AssertionError("no arkvory_leases_lost_total metric")


def test_hostile_requests_cost_no_lease_no_readiness_and_no_download(site):
    writer, gateway, path, blob = site
    stop = threading.Event()
    problems: list[str] = []
    downloads: dict[str, bytes] = {}
    received = {writer.name: 0, gateway.name: 0}  # bytes so far, per download

    def watch(process) -> None:
        with process.client(READER_TOKEN, timeout=3) as client:
            while not stop.is_set():
                try:
                    ready = client.get("/health/ready")
                    body = ready.json()
                    if ready.status_code != 200 or not body["sharedDownloads"]["active"]:
                        problems.append(f"{process.name}: {ready.status_code} {body}")
                except httpx.HTTPError as exc:
                    problems.append(f"{process.name}: readiness did not answer: {exc!r}")
                stop.wait(0.25)

    def download(process) -> None:
        try:
            with httpx.Client(base_url=process.url, timeout=30) as client, client.stream("GET", path) as answer:
                body = bytearray()
                for chunk in answer.iter_bytes():
                    body += chunk
                    received[process.name] = len(body)
                downloads[process.name] = bytes(body)
        except httpx.HTTPError as exc:
            problems.append(f"{process.name}: the download failed: {exc!r}")

    def deep_json(port: int, token: str | None) -> int | None:
        return push(port, json_head("/api/v1/repositories", 200_000, token), b"[" * PIECE, 200_000, seconds=15)

    results: dict[str, int | None] = {}

    def attack(name: str, call) -> None:
        results[name] = call()

    hundred_mb = 100 * 1024 * 1024
    attacks = {
        "writer 100 MB anonymous": lambda: push(
            writer.port, json_head("/api/v1/repositories", hundred_mb, None), b"[" * PIECE, hundred_mb, seconds=20
        ),
        "gateway 100 MB anonymous": lambda: push(
            gateway.port, json_head("/api/v1/repositories", hundred_mb, None), b"[" * PIECE, hundred_mb, seconds=20
        ),
        "writer deep anonymous": lambda: deep_json(writer.port, None),
        "writer deep admin": lambda: deep_json(writer.port, ADMIN_TOKEN),
        "gateway deep admin": lambda: deep_json(gateway.port, ADMIN_TOKEN),
        "gateway 50 MB header": lambda: push(
            gateway.port,
            f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode(),
            b"a" * PIECE,
            50 * 1024 * 1024,
            seconds=20,
        ),
    }
    threads = [threading.Thread(target=watch, args=(p,)) for p in (writer, gateway)]
    threads += [threading.Thread(target=download, args=(p,)) for p in (writer, gateway)]
    for thread in threads:
        thread.start()
    # The downloads are under way before the attacks begin.
    eventually(lambda: problems or all(received.values()), "both downloads under way", timeout=20)
    attackers = [threading.Thread(target=attack, args=item) for item in attacks.items()]
    for thread in attackers:
        thread.start()
    for thread in attackers:
        thread.join(40)
    for thread in threads[2:]:
        thread.join(40)
    stop.set()
    for thread in threads[:2]:
        thread.join(10)

    assert problems == []
    # Refused before the body is read, and answered: the lingering close stops reading instead
    # of resetting while the client still pushes (shared/http/protocol.py), so it reads the 401.
    assert results["writer 100 MB anonymous"] == 401
    assert results["gateway 100 MB anonymous"] == 405
    assert results["writer deep anonymous"] == 401
    assert results["writer deep admin"] == 400
    assert results["gateway deep admin"] == 405
    assert results["gateway 50 MB header"] == 431
    for process in (writer, gateway):
        twice = f"Authorization: Bearer {READER_TOKEN}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n".encode()
        assert push(process.port, f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode() + twice + b"\r\n", b"", 0, seconds=5) == 400
        assert hashlib.sha256(downloads[process.name]).digest() == hashlib.sha256(blob).digest(), process.name
        assert leases_lost(process) == 0
        assert process.status() == (200, "ready")
