"""A lease lost while requests are in flight, with real processes (issue 22 §7, §13): downloads
that are sending are cut with a reset, and requests that still wait (on the object store before
their first byte, on a slow upload body) end when the process exits, also with a reset; the
process log says the loss and nothing more: no traceback, no "Exception in ASGI application",
no "unexpected error".

The lease is lost by fencing it in the database (its generation moved on, as a successor's
takeover would): the next renewal, at most 2 s later, is refused, the renewal thread closes the
payload gate while the serving loop sends, and the process exits 75 two seconds later. The
deterministic half of §7, trust ending exactly between a check and a write, is in
tests/test_payload_gate.py.
"""

from __future__ import annotations

import socket
import urllib.parse

import pytest

from .harness import ADMIN_TOKEN, db_execute, eventually
from .tcpproxy import TcpProxy
from .test_lease_processes import upload

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

KiB, MiB = 1024, 1024 * 1024
# Three slots sharing 768 KiB/s: 256 KiB/s for the gateway, so 4 MiB take 16 s.
SHARED = {"slots": 3, "total": 3 * 256 * KiB}
SIZE = 4 * MiB
NOISE = ("Traceback", "Exception in ASGI application", "unexpected error", "CancelledError")


def send_request(process, head: str, body: bytes = b"") -> socket.socket:
    """One request on a raw socket (a reset must be seen as such)."""
    host, port = process.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"{head}\r\nHost: t\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode() + body)
    return sock


def read_head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(64 * KiB)
        assert chunk, head
        head += chunk
    return head


def ending(sock: socket.socket) -> str:
    """Read until the server ends the connection: 'reset', or 'closed' (an orderly close)."""
    try:
        while sock.recv(256 * KiB):
            pass
    except ConnectionResetError:
        return "reset"
    finally:
        sock.close()
    return "closed"


def lose_lease(database_url: str, slot: int) -> None:
    """A successor's takeover, as the holder's next renewal sees it: refused."""
    fenced = db_execute(
        database_url, "UPDATE arkvory_gateway_leases SET generation = generation + 1 WHERE slot = $1", slot
    )
    assert fenced == "UPDATE 1"


def assert_one_quiet_loss(process) -> None:
    """The loss said once (by the lease, and by the runtime what it does about it), nothing else
    at ERROR, and no traceback."""
    log = process.stderr
    assert log.count("lease LOST") == 1, log
    errors = [line for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line]
    assert len(errors) == 2 and "lease LOST" in errors[0] and "then exiting 75" in errors[1], log
    for noise in NOISE:
        assert noise not in log, log


def active_downloads(process) -> int:
    with process.client() as client:
        return client.get("/health/ready").json()["transfers"]["downloads"]["admission"]["active"]


def test_a_lost_lease_ends_object_store_downloads_sending_or_waiting_with_a_reset_and_one_log_line(s3_cluster):
    """One download sending (throttled, in segments), then the store stalled for the gateway: a
    second download waits for its first byte from the store (its read timeout is 30 s) when the
    lease is lost. The first is cut by the loss (a reset, counted `lease_lost`); the second ends
    when the process exits, 2 s later. Before, the exit's cancellation of the waiting one reached
    uvicorn, which logged it as "Exception in ASGI application" with a CancelledError traceback."""
    shared = s3_cluster.shared_env(**SHARED)
    writer = s3_cluster.writer(shared).wait_ready()
    sending_id = upload(writer, "lost", bytes(SIZE))
    waiting_id = upload(writer, "lost", b"w" * 100_000)
    endpoint = urllib.parse.urlsplit(s3_cluster.settings().object_store.endpoint_url)
    with TcpProxy(endpoint.hostname, endpoint.port) as store_link:
        gateway = s3_cluster.gateway(1, shared, ARKVORY_S3_ENDPOINT_URL=f"http://127.0.0.1:{store_link.port}")
        gateway.wait_ready()
        sending = send_request(gateway, f"GET /api/v1/repositories/lost/artifacts/{sending_id}/content HTTP/1.1")
        assert read_head(sending).startswith(b"HTTP/1.1 200")
        store_link.stall()
        waiting = send_request(gateway, f"GET /api/v1/repositories/lost/artifacts/{waiting_id}/content HTTP/1.1")
        eventually(lambda: active_downloads(gateway) == 2, "both downloads under way")
        lose_lease(s3_cluster.database_url, 1)
        endings = [ending(sending)]
        # Counted while the process still answers (it exits 2 s after the loss).
        with gateway.client() as client:
            exported = client.get("/health/metrics").text.splitlines()
        endings.append(ending(waiting))
        assert gateway.wait_exit(20) == 75
    assert_one_quiet_loss(gateway)
    assert endings == ["reset", "reset"]
    assert 'arkvory_transfer_aborts_total{direction="download",reason="lease_lost"} 1.0' in exported


def test_a_lost_lease_ends_a_file_download_and_a_slow_upload_quietly(cluster):
    """On a storage directory: the writer sends a download (throttled) and receives an upload
    whose client sends 1 KB of its 1 MB and then nothing, when its lease is lost. The download
    is cut; the upload ends when the process exits (before: a CancelledError traceback)."""
    shared = cluster.shared_env(**SHARED)
    writer = cluster.writer(shared).wait_ready()
    artifact = upload(writer, "lost", bytes(SIZE))
    sending = send_request(writer, f"GET /api/v1/repositories/lost/artifacts/{artifact}/content HTTP/1.1")
    assert read_head(sending).startswith(b"HTTP/1.1 200")
    uploading = send_request(
        writer,
        "POST /api/v1/repositories/lost/artifacts?name=slow.bin HTTP/1.1\r\nContent-Length: 1000000",
        b"x" * 1000,
    )
    eventually(lambda: active_downloads(writer) == 1, "the download under way")
    eventually(lambda: list((cluster.data_dir / "tmp").glob("upload-*")), "the upload under way")
    lose_lease(cluster.database_url, 0)
    endings = [ending(sending), ending(uploading)]
    assert writer.wait_exit(20) == 75
    assert_one_quiet_loss(writer)
    assert endings == ["reset", "reset"]
