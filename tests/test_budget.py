"""The shared download budget and admission with real processes (SPEC §4)."""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import httpx
import pytest

from arkvory.shared.cluster.pins import LINGER_S

from .budget_measure import KiB, assert_principal_shares, make_repo, run_parallel, timed_download
from .harness import ADMIN_TOKEN, READER_TOKEN, db_fetch as query, eventually

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]







def admission_of(process) -> dict:
    with process.client() as client:
        return client.get("/health/ready").json()["transfers"]["downloads"]["admission"]


def wait_admission(process, what: str, **wanted: int) -> None:
    """Until the process's download admission shows `wanted` (e.g. active=1, waiting=1)."""
    eventually(lambda: all(admission_of(process)[k] == v for k, v in wanted.items()), what)




def test_budget_does_not_multiply_with_processes(cluster):
    total = 3 * 256 * KiB  # each of 3 processes: 256 KiB/s, burst 25.6 KiB
    shared = cluster.shared_env(slots=3, total=total)
    writer = cluster.writer(shared).wait_ready()
    data = bytes(range(256)) * 4096  # 1 MiB
    path = make_repo(writer, "budget", data)
    gateways = [cluster.gateway(slot, shared).wait_ready() for slot in (1, 2)]

    started = time.monotonic()
    results = run_parallel([(p.url + path, ADMIN_TOKEN) for p in (writer, *gateways)])
    elapsed = time.monotonic() - started

    assert [status for status, _, _ in results] == [200, 200, 200]
    assert all(body == data for _, body, _ in results)
    burst = min(256 * KiB // 10, 1024 * KiB)
    floor = (3 * len(data) - 3 * burst) / total
    assert elapsed >= floor * 0.97, f"3 MiB at {total} B/s must take >= {floor:.2f} s, took {elapsed:.2f} s"
    # Each process alone is held to its share, not the total.
    assert min(seconds for _, _, seconds in results) >= (len(data) - burst) / (total // 3) * 0.97


def test_per_principal_share(cluster):
    shared = cluster.shared_env(
        slots=2,
        total=2 * 1024 * KiB,
        ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL=str(2 * 128 * KiB),
    )
    writer = cluster.writer(shared).wait_ready()
    data = b"p" * (256 * KiB)
    path = make_repo(writer, "shares", data)
    gateway = cluster.gateway(1, shared).wait_ready()
    with gateway.client() as client:
        bandwidth = client.get("/health/ready").json()["transfers"]["downloads"]["bandwidth"]
    assert bandwidth["perPrincipalBytesPerSecond"] == 128 * KiB

    # The admin principal runs two downloads (sharing 128 KiB/s); the reader runs one.
    url = gateway.url + path
    assert_principal_shares(url, data, 128 * KiB)  # ~3.9 s for the admin, ~2 s for the reader
    with gateway.client() as client:
        metrics = client.get("/health/metrics").text
    waited = next(line for line in metrics.splitlines() if line.startswith("arkvory_download_token_wait_seconds_total"))
    assert float(waited.split()[1]) > 1.0
    assert f"arkvory_download_payload_bytes_total {float(3 * len(data))}" in metrics


def test_small_downloads_written_at_once_still_pass_the_process_bucket(cluster):
    """A body smaller than one grant goes out with its head in one write when its tokens are
    there at once, and waits for them in the general path otherwise: either way every byte is
    granted, and no interval gets more than rate × Δt + burst."""
    rate = 64 * KiB  # the gateway's share: a burst of 6,553 B, above the 4 KiB body
    shared = cluster.shared_env(slots=2, total=2 * rate)
    writer = cluster.writer(shared).wait_ready()
    data = bytes(range(256)) * 16  # 4 KiB
    path = make_repo(writer, "small", data)
    gateway = cluster.gateway(1, shared).wait_ready()
    count = 24  # 96 KiB: ~1.4 s at 64 KiB/s
    started = time.monotonic()
    with gateway.client(ADMIN_TOKEN) as client:  # one keep-alive connection
        for _ in range(count):
            answer = client.get(path)
            assert answer.status_code == 200 and answer.content == data
    seconds = time.monotonic() - started
    assert seconds >= (count * len(data) - rate // 10) / rate * 0.97, seconds
    with gateway.client() as client:
        metrics = client.get("/health/metrics").text
    assert f"arkvory_download_payload_bytes_total {float(count * len(data))}" in metrics
    assert f"arkvory_download_granted_bytes_total {float(count * len(data))}" in metrics


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_lease_loss_cuts_the_download_and_a_range_request_elsewhere_resumes(cluster, db_proxy):
    shared = cluster.shared_env(slots=2, total=2 * 128 * KiB)
    writer = cluster.writer(shared).wait_ready()
    data = bytes(range(256)) * 8192  # 2 MiB: 16 s at 128 KiB/s
    path = make_repo(writer, "cut", data)
    gateway = cluster.gateway(1, shared, ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url))
    gateway.wait_ready()

    received = bytearray()
    outcome: dict[str, object] = {}

    def download():
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        try:
            with httpx.stream("GET", gateway.url + path, headers=headers, timeout=30) as answer:
                outcome["etag"] = answer.headers["ETag"]
                for chunk in answer.iter_bytes():
                    received.extend(chunk)
            outcome["result"] = "complete"
        except httpx.HTTPError as exc:
            outcome["result"] = exc
        outcome["ended"] = time.monotonic()

    thread = threading.Thread(target=download)
    thread.start()
    eventually(lambda: len(received) >= 64 * KiB, "the download under way")
    db_proxy.stall()
    stalled_at = time.monotonic()
    thread.join(30)
    assert isinstance(outcome["result"], httpx.HTTPError), outcome
    assert outcome["ended"] - stalled_at <= 9.5
    assert 0 < len(received) < len(data)
    with gateway.client() as client:
        try:
            refused = client.get(path)
            assert refused.status_code == 503 and refused.json()["code"] == "unavailable"
        except httpx.TransportError:
            pass  # it already exited (75): also not serving
    db_proxy.resume()

    # Resume on another process with Range + If-Range.
    offset = len(received)
    with writer.client() as client:
        rest = client.get(path, headers={"Range": f"bytes={offset}-", "If-Range": outcome["etag"]})
    assert rest.status_code == 206
    assert bytes(received) + rest.content == data
    assert gateway.wait_exit(10) == 75


def test_admission_full_and_timeout_answer_busy(cluster):
    shared = cluster.shared_env(slots=2, total=2 * 64 * KiB)
    writer = cluster.writer(shared).wait_ready()
    data = b"a" * (256 * KiB)  # 4 s at 64 KiB/s
    path = make_repo(writer, "queue", data)
    gateway = cluster.gateway(
        1,
        shared,
        ARKVORY_MAX_DOWNLOADS="1",
        ARKVORY_DOWNLOAD_QUEUE_SIZE="1",
        ARKVORY_DOWNLOAD_QUEUE_TIMEOUT_MS="1000",
    ).wait_ready()
    url = gateway.url + path
    first: list = []
    holder = threading.Thread(target=timed_download, args=(url, ADMIN_TOKEN, first))
    holder.start()
    wait_admission(gateway, "the first download sending", active=1)
    waiting: list = []
    waiter = threading.Thread(target=timed_download, args=(url, READER_TOKEN, waiting))
    waiter.start()
    wait_admission(gateway, "the second download queued", active=1, waiting=1)
    with gateway.client() as client:
        full = client.get(path)
    waiter.join(10)
    status, body, seconds = waiting[0]
    assert status == 503 and 0.9 <= seconds <= 3
    assert full.status_code == 503 and full.json()["code"] == "busy"
    assert int(full.headers["Retry-After"]) >= 1
    with gateway.client() as client:
        admission = client.get("/health/ready").json()["transfers"]["downloads"]["admission"]
        metrics = client.get("/health/metrics").text
    assert admission["rejected"] >= 1 and admission["timedOut"] >= 1
    assert 'arkvory_download_admission_failures_total{reason="timed_out"} 1.0' in metrics
    assert 'arkvory_download_admission_failures_total{reason="full"} 1.0' in metrics
    holder.join(20)
    assert first[0][0] == 200 and first[0][1] == data


def test_client_that_leaves_the_queue_is_counted_as_cancelled(cluster):
    shared = cluster.shared_env(slots=2, total=2 * 64 * KiB)
    writer = cluster.writer(shared).wait_ready()
    path = make_repo(writer, "leave", b"l" * (256 * KiB))
    gateway = cluster.gateway(1, shared, ARKVORY_MAX_DOWNLOADS="1").wait_ready()
    first: list = []
    holder = threading.Thread(target=timed_download, args=(gateway.url + path, ADMIN_TOKEN, first))
    holder.start()
    wait_admission(gateway, "the first download sending", active=1)
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {READER_TOKEN}\r\n\r\n".encode()
        )
        wait_admission(gateway, "the second download queued", waiting=1)
    deadline = time.monotonic() + 5
    with gateway.client() as client:
        while time.monotonic() < deadline:
            admission = client.get("/health/ready").json()["transfers"]["downloads"]["admission"]
            if admission["cancelled"]:
                break
            time.sleep(0.1)
    assert admission["cancelled"] == 1 and admission["waiting"] == 0
    holder.join(20)
    assert first[0][0] == 200




@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_a_streaming_transfer_pins_its_blob_until_it_ends(cluster):
    shared = cluster.shared_env(slots=2, total=2 * 128 * KiB)
    writer = cluster.writer(shared).wait_ready()
    data = b"q" * (512 * KiB)  # 4 s at 128 KiB/s
    path = make_repo(writer, "pins", data)
    gateway = cluster.gateway(1, shared).wait_ready()
    results: list = []
    thread = threading.Thread(target=timed_download, args=(gateway.url + path, ADMIN_TOKEN, results))
    thread.start()
    # While the transfer runs (4 s), its blob is pinned by the gateway's slot.
    wait_admission(gateway, "the download sending", active=1)
    pinned = eventually(
        lambda: query(cluster.database_url, "SELECT slot, sha256, pinned_until > now() AS live FROM arkvory_read_pins"),
        "a read pin written",
    )
    thread.join(20)
    assert results[0][0] == 200
    sha = hashlib.sha256(data).hexdigest()
    assert [(r["slot"], r["sha256"], r["live"]) for r in pinned] == [(1, sha, True)]
    # The pin lingers LINGER_S after the transfer (warm downloads need no new write), then goes.
    deadline = time.monotonic() + LINGER_S + 5
    while time.monotonic() < deadline and query(cluster.database_url, "SELECT 1 FROM arkvory_read_pins"):
        time.sleep(0.2)
    assert query(cluster.database_url, "SELECT 1 FROM arkvory_read_pins") == []
