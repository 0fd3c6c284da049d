"""The read cache (ARKVORY_CACHE_MAX_BYTES, SPEC §11) in real processes on a real SeaweedFS: 50
concurrent readers of a cold blob make exactly one fill from the store; a cache file changed on
disk is refetched and the right bytes served; the limit holds by evicting the least recently
used; the cache survives a restart (re-checked, not refetched). The cache's logic on plain files:
tests/test_read_cache.py."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import signal
import time

import httpx
import pytest

from .harness import ADMIN_TOKEN


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


def start_writer(cluster, limit: int):
    writer = cluster.writer(ARKVORY_CACHE_MAX_BYTES=str(limit), **CONCURRENT).wait_ready()
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

    assert download(writer, artifact) == data  # a hit: the store is not asked
    assert metric(writer, 'arkvory_read_cache_requests_total{result="hit"}') == served + 1
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
