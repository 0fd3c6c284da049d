"""Blobs on a real SeaweedFS (SPEC §11), with real processes and real HTTP: uploads (one-shot and
resumable) published to the bucket, downloads byte-exact through two gateways that share no
directory and listen on other loopback addresses, with Range, If-Range, ETag and 304 as on disk;
where each process runs, in the readiness document and `arkvory admin status`; and no
credential in any log, readiness document or metric."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid

import httpx
import pytest

from .harness import run_arkvory
from .s3cluster import GATEWAY_HOSTS, loopback_aliases_or_skip

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

MiB = 1024 * 1024
REPO = "builds"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_one_shot(client: httpx.Client, data: bytes, name: str = "small.bin") -> dict:
    made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": name}, content=data)
    assert made.status_code == 201, made.text
    return made.json()


def upload_resumable(client: httpx.Client, data: bytes, part_size: int = 8 * MiB) -> dict:
    """Parts sent out of order, then `complete` (a repeat replays the artifact)."""
    base = f"/api/v1/repositories/{REPO}/uploads"
    descriptor = {"name": "big.bin", "size": len(data), "sha256": sha(data), "partSize": part_size}
    session = client.post(base, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex}).json()
    count = session["partCount"]
    for index in reversed(range(count)):
        part = data[index * part_size:(index + 1) * part_size]
        sent = client.put(
            f"{base}/{session['id']}/parts/{index}", content=part,
            headers={"X-Content-SHA256": sha(part), "Content-Type": "application/octet-stream"},
        )
        assert sent.status_code in (200, 201, 204), sent.text
    done = client.post(f"{base}/{session['id']}/complete", timeout=120)
    assert done.status_code == 201, done.text
    again = client.post(f"{base}/{session['id']}/complete", timeout=120)
    assert again.status_code == 200 and again.json()["id"] == done.json()["id"]
    return done.json()


def content_path(artifact: dict) -> str:
    return f"/api/v1/repositories/{REPO}/artifacts/{artifact['id']}/content"


def check_http_semantics(client: httpx.Client, artifact: dict, data: bytes) -> None:
    """What a directory installation answers (tests/test_content.py), here from the bucket."""
    path, size = content_path(artifact), len(data)
    whole = client.get(path)
    assert whole.status_code == 200 and whole.content == data
    etag = whole.headers["ETag"]
    assert etag == f'"sha256:{artifact["sha256"]}"'
    assert whole.headers["Accept-Ranges"] == "bytes" and whole.headers["Content-Length"] == str(size)
    assert whole.headers["Repr-Digest"].startswith("sha-256=:")

    ranges = [("0-0", 0, 0), ("100-4195", 100, 4195), (f"{size - 10}-", size - 10, size - 1), ("-7", size - 7, size - 1)]
    if size > 9 * MiB:  # across segments and the resumable upload's parts
        ranges += [(f"{MiB - 3}-{MiB + 2}", MiB - 3, MiB + 2), (f"{8 * MiB - 5}-{9 * MiB}", 8 * MiB - 5, 9 * MiB)]
    for spec, start, end in ranges:
        part = client.get(path, headers={"Range": f"bytes={spec}"})
        assert part.status_code == 206, (spec, part.text)
        assert part.headers["Content-Range"] == f"bytes {start}-{end}/{size}"
        assert part.content == data[start:end + 1]
    resumed = client.get(path, headers={"Range": "bytes=5-", "If-Range": etag})
    assert resumed.status_code == 206 and resumed.content == data[5:]
    changed = client.get(path, headers={"Range": "bytes=5-", "If-Range": '"sha256:other"'})
    assert changed.status_code == 200 and changed.content == data
    unsatisfiable = client.get(path, headers={"Range": f"bytes={size}-"})
    assert unsatisfiable.status_code == 416 and unsatisfiable.headers["Content-Range"] == f"bytes */{size}"
    assert client.get(path, headers={"If-None-Match": etag}).status_code == 304
    head = client.head(path)
    assert head.status_code == 200 and head.headers["Content-Length"] == str(size) and not head.content


def test_uploads_go_to_the_bucket_and_two_gateways_on_other_hosts_serve_them_byte_exact(s3_cluster, tmp_path):
    loopback_aliases_or_skip(*GATEWAY_HOSTS)
    shared = s3_cluster.shared_env(slots=3, total=3 * 256 * MiB)
    writer = s3_cluster.writer(shared).wait_ready()
    with writer.client(timeout=60) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        small = os.urandom(300_000)
        big = os.urandom(20 * MiB + 12_345)  # above the 16 MiB part size: a multipart publish
        one_shot = upload_one_shot(client, small)
        resumable = upload_resumable(client, big)
        duplicate = upload_one_shot(client, small, "again.bin")  # the same bytes: the object is kept
    assert duplicate["sha256"] == one_shot["sha256"]
    assert s3_cluster.has_blob(one_shot["sha256"]) and s3_cluster.has_blob(resumable["sha256"])
    # Nothing of the blobs in the writer's local state: its upload files are gone, no blob layout.
    assert not (s3_cluster.data_dir / "blobs").exists()
    assert os.listdir(s3_cluster.data_dir / "uploads") == [] and os.listdir(s3_cluster.data_dir / "tmp") == []

    gateways = [
        s3_cluster.gateway(slot, shared, host=host).wait_ready()
        for slot, host in zip((1, 2), GATEWAY_HOSTS)
    ]
    for process in (writer, *gateways):
        with process.client(timeout=60) as client:
            check_http_semantics(client, one_shot, small)
            check_http_semantics(client, resumable, big)
    for gateway in gateways:  # each gateway's own directory holds no blob
        local = s3_cluster.workdir / f"gateway{gateway.env['ARKVORY_GATEWAY_SLOT']}-local"
        assert local.is_dir() and not (local / "blobs").exists()

    # Where each process runs: its readiness and the leases.
    documents = []
    for process, host in zip((writer, *gateways), ("127.0.0.1", *GATEWAY_HOSTS)):
        ready = process.ready()
        documents.append(ready)
        assert ready["status"] == "ready" and ready["storage"] == "available"
        assert ready["storageLocation"] == f"s3://{s3_cluster.bucket.name}/inst"
        assert ready["address"] == f"{host}:{process.port}" and ready["host"]
    report = json.loads(run_arkvory(s3_cluster.base_env(), "admin", "status", "--json").stdout)
    assert report["storage"]["location"] == f"s3://{s3_cluster.bucket.name}/inst"
    assert sorted(lease["address"] for lease in report["leases"]) == sorted(
        f"{p.env['ARKVORY_HOST']}:{p.port}" for p in (writer, *gateways)
    )
    table = run_arkvory(s3_cluster.base_env(), "admin", "status").stdout
    assert f"/{GATEWAY_HOSTS[0]}:{gateways[0].port}" in table
    metrics = []
    for process in (writer, *gateways):
        with process.client() as client:
            metrics.append(client.get("/health/metrics").text)
    assert all("arkvory_storage_available 1.0" in text for text in metrics)
    assert 'arkvory_storage_read_requests_total{result="ok"}' in metrics[1]
    s3_cluster.assert_secret_nowhere(*documents, *metrics, table, json.dumps(report))


def test_an_object_missing_from_the_bucket_is_503_content_unavailable_until_uploaded_again(s3_cluster):
    writer = s3_cluster.writer().wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        kept = upload_one_shot(client, os.urandom(70_000), "kept.bin")
        content = os.urandom(80_000)
        lost = upload_one_shot(client, content, "lost.bin")
        asyncio.run(s3_cluster.storage().delete([lost["sha256"]]))  # gone behind our back
        answer = client.get(content_path(lost))
        assert answer.status_code == 503 and answer.json()["code"] == "content_unavailable"
        assert client.get(content_path(kept)).status_code == 200
        deleted = client.delete(f"/api/v1/repositories/{REPO}/artifacts/{kept['id']}")
        assert deleted.status_code == 204
        assert client.get(content_path(kept)).status_code == 404
        # Uploading the same bytes again publishes the object again (its HEAD finds none).
        upload_one_shot(client, content, "again.bin")
        assert s3_cluster.has_blob(lost["sha256"])
        again = client.get(content_path(lost))
        assert again.status_code == 200 and again.content == content
