"""The payload gate sits at the write itself (issue 14 §3): a trust deadline that passes before a
chunk is written stops that chunk, cuts the transfer and counts it as an abort `lease_lost`,
and `arkvory_payload_chunks_after_trust_total` stays 0 (it counts only a faulty gate). The same
for a file's transfer and an object store's (issue 22 §7): wherever the deadline falls, the
connection is reset, the abort counted once, and no error leaves the transfer.

A real server: our HTTP server and protocol on a free port, real sockets, a real HTTP client;
the lease's clock is injected (tests/fakeclock.py), or its trust ends after an exact number of
readings, so the deadline falls exactly where the test puts it, every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import tempfile
import types

import pytest
from prometheus_client import CollectorRegistry

from arkvory.shared.cluster.transfers import Transfers
from arkvory.shared.download.object_transfer import stream_from_store
from arkvory.shared.download import payload
from arkvory.shared.download.payload import Payload
from arkvory.shared.download.throttle import BandwidthScheduler
from arkvory.shared.http.handle import HANDLE_KEY, PayloadRefused, encode_header_block
from arkvory.shared.http.protocol import protocol_for
from arkvory.shared.http.server import HttpServer
from arkvory.shared.metrics import Metrics
from arkvory.shared.storage import StorageHealth
from arkvory.shared.storage.directory import Storage
from .fakeclock import FakeTime

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

TRUST_S = 8.0


class ClockedLease:
    """The slot lease's trust as the protocol reads it, on an injected clock."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.trusted_until = time.clock() + TRUST_S

    def trust_remaining(self) -> float:
        return max(0.0, self.trusted_until - self.time.clock())


def _runtime(time: FakeTime, lease: ClockedLease, bandwidth=None):
    registry = CollectorRegistry()
    return types.SimpleNamespace(
        registry=registry,
        metrics=Metrics(registry),
        lease=lease,
        settings=types.SimpleNamespace(receive_timeout_s=5, send_timeout_s=5),
        payload_allowed=lambda: lease.trust_remaining() > 0,
        bandwidth=bandwidth or BandwidthScheduler(None, None),
        transfers=Transfers(),  # a Payload registers itself there while it sends
    )


async def _serve(runtime, app):
    """Our protocol class for `runtime` on a free port; returns (server, port, protocol class)."""
    protocol = protocol_for(runtime)
    server = HttpServer(app, protocol)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await server.start(sock=sock)
    return server, sock.getsockname()[1], protocol


async def _get(port: int) -> bytes:
    """Everything the server sends for one GET, until it closes or resets the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            received += chunk
    except ConnectionResetError:
        pass  # a cut transfer ends with a reset
    finally:
        writer.close()
    return received


def _aborts(runtime, reason: str) -> float:
    return runtime.registry.get_sample_value(
        "arkvory_transfer_aborts_total", {"direction": "download", "reason": reason}
    ) or 0.0


async def test_a_deadline_between_two_writes_stops_the_second_at_the_write():
    time = FakeTime()
    lease = ClockedLease(time)
    runtime = _runtime(time, lease)
    outcome = {}

    async def app(scope, receive, send):
        handle = scope["extensions"][HANDLE_KEY]
        handle.start(200, encode_header_block([(b"content-length", b"8")]), 8, body=b"1234")
        time.advance(TRUST_S)  # the deadline passes after the first chunk, before the second
        try:
            handle.write(b"5678")
        except PayloadRefused:
            outcome["refused"] = True
            handle.abort()

    server, port, protocol = await _serve(runtime, app)
    try:
        received = await _get(port)
    finally:
        await server.shutdown()
    assert outcome == {"refused": True}
    assert received.endswith(b"\r\n\r\n1234"), received
    assert protocol.stats.late_payload_chunks == 0


async def test_a_transfer_whose_trust_ends_while_it_waits_for_tokens_is_cut_as_lease_lost():
    """Payload takes its tokens, then writes: the deadline passes during the grant's await,
    the write is refused, the transfer cut and counted once as `lease_lost`, nothing after the
    first chunk leaves, and the late-payload counter stays 0."""
    time = FakeTime()
    lease = ClockedLease(time)

    class SlowTokens(BandwidthScheduler):
        grants = 0

        def grant_now(self, principal_id: str, want: int) -> int:
            return 0  # never at once: every chunk waits in `grant`

        async def grant(self, principal_id: str, want: int) -> int:
            SlowTokens.grants += 1
            if SlowTokens.grants == 2:
                time.advance(TRUST_S)  # trust ends while the second chunk waits for tokens
            await asyncio.sleep(0)
            return min(want, 4)

    runtime = _runtime(time, lease, SlowTokens(None, None))
    finished = {}

    async def app(scope, receive, send):
        handle = scope["extensions"][HANDLE_KEY]
        response = types.SimpleNamespace(principal=types.SimpleNamespace(id="p"), status_code=200)
        handle.start(200, encode_header_block([(b"content-length", b"12")]), 12)
        blob = _blob(b"aaaabbbbcccc")
        try:
            finished["done"] = await Payload(runtime, response, handle, blob).send(0, 12)
        finally:
            os.close(blob)

    server, port, protocol = await _serve(runtime, app)
    try:
        received = await _get(port)
    finally:
        await server.shutdown()
    assert finished == {"done": False}
    assert received.endswith(b"\r\n\r\naaaa"), received
    assert _aborts(runtime, "lease_lost") == 1
    assert protocol.stats.late_payload_chunks == 0


def _blob(data: bytes) -> int:
    """A descriptor of a file holding `data` (Payload preads its blob)."""
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.flush()
        return os.dup(file.fileno())


class TrustForReadings:
    """A lease whose trust ends after its first `readings` readings: the deadline falls at an
    exact point among the reads of the gate (a loop's own check, the write's gate, its audit)."""

    def __init__(self, readings: int) -> None:
        self.left = readings

    def trust_remaining(self) -> float:
        if self.left <= 0:
            return 0.0
        self.left -= 1
        return TRUST_S


BLOB = bytes(range(256)) * (16 * 1024)  # 4 MiB: four unthrottled chunks


async def _get_until_cut(port: int) -> tuple[bytes, str]:
    """Everything the server sends for one GET, and how it ended: 'reset' or 'closed'."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
    received, ending = b"", "closed"
    try:
        while chunk := await asyncio.wait_for(reader.read(1024 * 1024), 10):
            received += chunk
    except ConnectionResetError:
        ending = "reset"
    finally:
        writer.close()
    return received, ending


@pytest.mark.parametrize("trusted_readings", range(8))
@pytest.mark.parametrize("source", ["file", "object store"])
async def test_wherever_trust_ends_a_transfer_is_reset_and_counted_once_and_nothing_escapes(
    source, trusted_readings, tmp_path, monkeypatch
):
    """Issue 22 §7: the object store's loop checked the gate, then wrote; trust ending between
    the two (here: after reading 1 or 2 of each chunk's three) raised PayloadRefused out of the
    transfer, an "unexpected error" with a traceback at the edge, uncounted, and the connection
    closed in order (queued bytes still left). Both paths now run in one frame
    (payload.send_payload): wherever trust ends, the connection is reset, the abort is counted
    once as `lease_lost`, and the transfer ends quietly."""
    # One sendfile per chunk, as the readings count them (with tokens to spare, a file's
    # transfer would gather all four into one sendfile: payload.ZERO_COPY_BYTES).
    monkeypatch.setattr(payload, "ZERO_COPY_BYTES", 1024 * 1024)
    lease = TrustForReadings(trusted_readings)
    runtime = _runtime(FakeTime(), lease)
    storage = Storage(tmp_path)
    sha256 = hashlib.sha256(BLOB).hexdigest()
    storage.blob_path(sha256).parent.mkdir(parents=True)
    storage.blob_path(sha256).write_bytes(BLOB)
    runtime.storage, runtime.storage_health = storage, StorageHealth(storage)
    headers = [(b"content-length", str(len(BLOB)).encode())]
    response = types.SimpleNamespace(
        runtime=runtime,
        principal=types.SimpleNamespace(id="p"),
        artifact=types.SimpleNamespace(id="a", sha256=sha256, size=len(BLOB)),
        status_code=200,
        raw_headers=headers,
    )
    outcome = {}

    async def app(scope, receive, send):
        handle = scope["extensions"][HANDLE_KEY]
        try:
            if source == "file":
                fd = storage.acquire_file(sha256)
                try:
                    head = (200, encode_header_block(headers), len(BLOB), b"")
                    outcome["done"] = await Payload(runtime, response, handle, fd).send(0, len(BLOB), head=head)
                finally:
                    storage.release_file(sha256, fd)
            else:
                await stream_from_store(response, send, handle, 0, len(BLOB))
                outcome["done"] = handle.cycle.response_complete
        except BaseException as exc:  # what would reach the edge
            outcome["escaped"] = exc

    server, port, protocol = await _serve(runtime, app)
    try:
        received, ending = await _get_until_cut(port)
    finally:
        await server.shutdown()
    assert outcome == {"done": False}
    assert ending == "reset"
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(body) < len(BLOB) and BLOB.startswith(body)
    assert _aborts(runtime, "lease_lost") == 1 and len(runtime.transfers) == 0
    assert protocol.stats.late_payload_chunks == 0


@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})])  # as the servers run
async def test_aborting_a_connection_its_client_already_closed_raises_nothing():
    """A request that a stopping process cancels after its client left (an upload whose commit
    waited for a standby that was gone, in tests/test_failover.py) is reset like any other:
    uvloop's transport has closed its socket by then, and setting SO_LINGER raises ValueError."""
    time = FakeTime()
    runtime = _runtime(time, ClockedLease(time))
    outcome = {}

    async def app(scope, receive, send):
        handle = scope["extensions"][HANDLE_KEY]
        while not handle.lost:  # until the client has gone (bounded by the test's timeout)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # and the transport has closed its socket
        try:
            handle.abort()
            outcome["aborted"] = True
        except Exception as exc:  # noqa: BLE001  (what the test is about)
            outcome["error"] = exc

    server, port, _ = await _serve(runtime, app)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        writer.close()
        for _ in range(500):
            if outcome:
                break
            await asyncio.sleep(0.01)
    finally:
        await server.shutdown()
    assert outcome == {"aborted": True}
