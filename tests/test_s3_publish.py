"""Publishing a resumable upload to a real SeaweedFS while its parts arrive (writer/uploads/sessions.py
`PrefixHash`, shared/storage/s3_client.py `Publication`): the parts reach the store as they are
recorded, but nothing is visible under the blob's key before `complete` has checked the whole
digest, and a digest that does not match never becomes visible at all."""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest


pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

MiB = 1024 * 1024
REPO = "builds"
PART = 8 * MiB
BASE = f"/api/v1/repositories/{REPO}/uploads"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _send_parts(client, data: bytes, declared: str) -> dict:
    descriptor = {"name": "big.bin", "size": len(data), "sha256": declared, "partSize": PART}
    session = client.post(BASE, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex}).json()
    for index in range(session["partCount"]):
        part = data[index * PART:(index + 1) * PART]
        sent = client.put(f"{BASE}/{session['id']}/parts/{index}", content=part,
                          headers={"X-Content-SHA256": sha(part)})
        assert sent.status_code == 200, sent.text
    return session


def _store_bytes(store) -> int:
    """What the store's files hold (its volumes grow as it receives parts)."""
    total = 0
    for folder, _, files in os.walk(store.data_dir):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


def test_parts_reach_the_store_while_arriving_and_the_blob_appears_only_at_complete(s3_cluster, seaweedfs):  # noqa: F811
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(6 * PART + 123)
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        before = _store_bytes(seaweedfs)
        session = _send_parts(client, data, sha(data))
        # Sent while the parts arrived (all but what obstore still buffers)...
        deadline = time.monotonic() + 30
        while _store_bytes(seaweedfs) - before < 3 * PART and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _store_bytes(seaweedfs) - before >= 3 * PART
        # ... but not visible before complete.
        assert not s3_cluster.has_blob(sha(data))
        done = client.post(f"{BASE}/{session['id']}/complete")
        assert done.status_code == 201, done.text
        assert s3_cluster.has_blob(sha(data))
        body = client.get(f"/api/v1/repositories/{REPO}/artifacts/{done.json()['id']}/content")
        assert body.status_code == 200 and body.content == data


def test_a_declared_digest_that_does_not_match_never_becomes_visible(s3_cluster):  # noqa: F811
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(4 * PART)
    declared = sha(b"other bytes")
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = _send_parts(client, data, declared)
        answer = client.post(f"{BASE}/{session['id']}/complete")
        assert answer.status_code == 422 and answer.json()["code"] == "digest_mismatch", answer.text
        answer = client.post(f"{BASE}/{session['id']}/complete")
        assert answer.status_code == 422, answer.text
    assert not s3_cluster.has_blob(declared)
    assert not s3_cluster.has_blob(sha(data))
