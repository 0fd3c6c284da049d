"""The read cache (ARKVORY_CACHE_MAX_BYTES, SPEC §11) in real processes on a real SeaweedFS: 50
concurrent readers of a cold blob make exactly one fill from the store; a cache file changed on
disk is refetched and the right bytes served, whether it changed before its first read (caught
by that read's check of its bytes) or after; the limit holds by evicting the least recently
used; the cache survives a restart (re-checked, not refetched). The cache's logic on plain files:
tests/test_read_cache.py."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import signal
import socket
import time

import urllib.parse

import httpx
import pytest

from .harness import ADMIN_TOKEN
from .rawhttp import read_response, status_of
from .tcpproxy import TcpProxy


pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

MiB = 1024 * 1024
REPO = "builds"
CONCURRENT = {"ARKVORY_MAX_DOWNLOADS": "64", "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": "64"}


def metric(process, name: str) -> float:
    with process.client() as client:
        text = client.get("/health/metrics").text
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def fills(process, result: str, expected: float, timeout: float = 15.0) -> None:
    """Wait for `expected` fills with `result`: a download may end before its fill's hash is
    checked (the hash trails the fill), so the count can lag the last download a moment."""
    name = f'arkvory_read_cache_fills_total{{result="{result}"}}'
    deadline = time.monotonic() + timeout
    while (found := metric(process, name)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found == expected, f"{name}: {found}, expected {expected}"


def upload(process, data: bytes, name: str) -> dict:
    with process.client(timeout=60) as client:
        made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": name}, content=data)
    assert made.status_code == 201, made.text
    return made.json()


def download(process, artifact: dict) -> bytes:
    path = f"/api/v1/repositories/{REPO}/artifacts/{artifact['id']}/content"
    with httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60) as client:
        answer = client.get(path)
    assert answer.status_code == 200, answer.text
    return answer.content


def cache_file(process, sha256: str):
    return process.cache_dir / "blobs" / sha256[:2] / sha256


def start_writer(cluster, limit: int, **env: str):
    writer = cluster.writer(ARKVORY_CACHE_MAX_BYTES=str(limit), **CONCURRENT, **env).wait_ready()
    writer.cache_dir = cluster.data_dir / "cache"
    return writer


def test_fifty_readers_of_a_cold_blob_make_one_fill_and_a_changed_cache_file_is_refetched(s3_cluster):
    writer = start_writer(s3_cluster, 64 * MiB)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
    data = os.urandom(6 * MiB + 1)
    artifact = upload(writer, data, "cold.bin")
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        bodies = list(pool.map(lambda _: download(writer, artifact), range(50)))
    assert all(body == data for body in bodies)
    fills(writer, "ok", 1)
    assert metric(writer, 'arkvory_storage_read_requests_total{result="ok"}') == 1  # one GET of the store
    served = metric(writer, 'arkvory_read_cache_requests_total{result="hit"}')
    assert served + metric(writer, 'arkvory_read_cache_requests_total{result="miss"}') == 50
    assert metric(writer, "arkvory_read_cache_bytes") == len(data)
    path = cache_file(writer, artifact["sha256"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == artifact["sha256"]

    # Its first read after the fill (maybe one of the 50) checked the file's bytes on the disk;
    # from then on it is a hit, and the store is not asked.
    assert download(writer, artifact) == data
    assert download(writer, artifact) == data
    assert metric(writer, 'arkvory_read_cache_requests_total{result="hit"}') >= served + 1
    assert metric(writer, 'arkvory_storage_read_requests_total{result="ok"}') == 1

    with open(path, "r+b") as file:  # bit rot, or a person: same size, other bytes
        file.seek(3 * MiB)
        file.write(b"\xff" * 4096)
    assert download(writer, artifact) == data
    assert metric(writer, 'arkvory_read_cache_discards_total{reason="changed"}') == 1
    fills(writer, "ok", 2)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == artifact["sha256"]
    os.truncate(path, MiB)  # truncated
    assert download(writer, artifact) == data
    fills(writer, "ok", 3)
    assert path.stat().st_size == len(data)


def test_a_cache_file_corrupted_before_its_first_read_is_caught_by_that_read_and_replaced(s3_cluster):
    """Issue 22 §10: a filled file is trusted for hits only once its first read has hashed it
    from the disk. One byte flipped between the fill and that read: the read finds it, drops the
    file (arkvory_read_cache_discards_total{reason="corrupt"}, exported at 0 from the start),
    and sends the store's bytes, filled again; the next read checks the new file, then hits."""
    writer = start_writer(s3_cluster, 64 * MiB)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        exported = client.get("/health/metrics").text.splitlines()
    assert 'arkvory_read_cache_discards_total{reason="corrupt"} 0.0' in exported
    data = os.urandom(3 * MiB + 3)
    artifact = upload(writer, data, "flipped.bin")
    assert download(writer, artifact) == data
    fills(writer, "ok", 1)
    path = cache_file(writer, artifact["sha256"])
    with open(path, "r+b") as file:  # one byte, as a failing disk would
        file.seek(MiB + 1)
        byte = file.read(1)
        file.seek(MiB + 1)
        file.write(bytes([byte[0] ^ 0x01]))
    assert download(writer, artifact) == data
    assert metric(writer, 'arkvory_read_cache_discards_total{reason="corrupt"}') == 1
    fills(writer, "ok", 2)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == artifact["sha256"]
    hits = metric(writer, 'arkvory_read_cache_requests_total{result="hit"}')
    assert download(writer, artifact) == data  # the new file's first read: checked
    assert download(writer, artifact) == data
    assert metric(writer, 'arkvory_read_cache_requests_total{result="hit"}') == hits + 1
    assert metric(writer, 'arkvory_storage_read_requests_total{result="ok"}') == 2


def test_a_cached_file_waiting_for_its_first_read_is_served_while_the_store_is_down(s3_cluster):
    """Its first read checks it from the disk and asks the store nothing, so it is served while
    the store does not answer (as a checked file is); a blob that is not cached answers 503."""
    endpoint = urllib.parse.urlsplit(s3_cluster.settings().object_store.endpoint_url)
    with TcpProxy(endpoint.hostname, endpoint.port) as store_link:
        writer = start_writer(s3_cluster, 64 * MiB, ARKVORY_S3_ENDPOINT_URL=f"http://127.0.0.1:{store_link.port}")
        with writer.client() as client:
            assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        cached, cold = os.urandom(MiB + 1), os.urandom(MiB + 2)
        cached_artifact, cold_artifact = upload(writer, cached, "cached.bin"), upload(writer, cold, "cold.bin")
        assert download(writer, cached_artifact) == cached
        fills(writer, "ok", 1)
        store_link.refuse()
        with writer.client() as client:
            answer = client.get(f"/api/v1/repositories/{REPO}/artifacts/{cold_artifact['id']}/content")
            assert answer.status_code == 503 and answer.json()["code"] == "unavailable"
            deadline = time.monotonic() + 15
            while client.get("/health/status").json()["status"] != "degraded" and time.monotonic() < deadline:
                time.sleep(0.1)  # the probe's verdict: the store is down
            # Degraded, not unavailable: a balancer keeps the process, whose cache still serves.
            status = client.get("/health/status")
            assert status.status_code == 200 and status.json() == {"status": "degraded"}
            ready = client.get("/health/ready")
            assert ready.status_code == 200 and ready.json()["parts"]["storage"] == "unavailable"
            assert ready.json()["parts"]["readCache"] == "available" and ready.json()["readCache"]["files"] == 1
            assert metric(writer, "arkvory_storage_available") == 0
            # A one-shot upload is refused before its body is read (it could not be published):
            # a declared 64 MiB that never comes is answered at once, not after the receive timeout.
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", writer.port), timeout=10) as sock:
                sock.sendall(
                    f"POST /api/v1/repositories/{REPO}/artifacts?name=x HTTP/1.1\r\nHost: t\r\n"
                    f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: {64 * MiB}\r\n\r\n".encode()
                )
                refused = read_response(sock)
            assert status_of(refused) == 503 and b'"code":"unavailable"' in refused.replace(b" ", b""), refused
            assert b"\r\nretry-after: " in refused.lower() and time.monotonic() - started < 5
        assert download(writer, cached_artifact) == cached  # its first read: checked, not fetched
        assert download(writer, cached_artifact) == cached  # a hit
        assert metric(writer, 'arkvory_read_cache_discards_total{reason="corrupt"}') == 0
        store_link.resume()


def test_the_limit_holds_and_the_cache_survives_a_restart(s3_cluster):
    size = 2 * MiB
    limit = 5 * MiB  # two blobs, not three
    writer = start_writer(s3_cluster, limit)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
    blobs = [os.urandom(size) for _ in range(4)]
    artifacts = [upload(writer, data, f"b{i}") for i, data in enumerate(blobs)]
    for index, (artifact, data) in enumerate(zip(artifacts, blobs)):
        assert download(writer, artifact) == data
        fills(writer, "ok", index + 1)  # each fill ends (hash checked) before the next reservation
        assert metric(writer, "arkvory_read_cache_bytes") <= limit
    assert metric(writer, "arkvory_read_cache_evictions_total") == 2
    assert metric(writer, "arkvory_read_cache_files") == 2
    on_disk = sorted(p.name for p in (writer.cache_dir / "blobs").glob("*/*"))
    assert on_disk == sorted(a["sha256"] for a in artifacts[2:])  # the least recently used went

    writer.signal(signal.SIGTERM)
    assert writer.wait_exit() == 0
    writer = start_writer(s3_cluster, limit)
    assert metric(writer, "arkvory_read_cache_files") == 2 and metric(writer, "arkvory_read_cache_bytes") == 2 * size
    for artifact, data in zip(artifacts[2:], blobs[2:]):
        assert download(writer, artifact) == data
    # Re-checked from the disk on their first read, not fetched again.
    assert metric(writer, 'arkvory_read_cache_fills_total{result="ok"}') == 0
    assert metric(writer, 'arkvory_storage_read_requests_total{result="ok"}') == 0
    assert metric(writer, 'arkvory_read_cache_discards_total{reason="corrupt"}') == 0
    assert download(writer, artifacts[2]) == blobs[2]
    assert metric(writer, 'arkvory_read_cache_requests_total{result="hit"}') >= 1
