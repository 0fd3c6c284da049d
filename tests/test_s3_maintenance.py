"""Cleanup and verify on a real SeaweedFS, run by a real `arkvory worker` beside the writer
(SPEC §7, §11): a deleted artifact's object survives while a download reads it (its read pin),
and is reclaimed once the pin is gone; objects without a row older than the grace period go;
verify re-hashes by streaming GETs, quarantines an object overwritten in the bucket, reports a
missing one, and a re-upload of the right bytes makes both good again."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import httpx
import pytest

from arkvory.shared.cluster.pins import LINGER_S
from arkvory.shared.storage.s3 import QUARANTINE, blob_key

from .harness import ADMIN_TOKEN, db_fetch, eventually
from .s3cluster import GATEWAY_HOSTS, loopback_aliases_or_skip
from .worker_harness import start_worker

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

KiB, MiB = 1024, 1024 * 1024
REPO = "r"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_task(writer, kind: str, params: dict, timeout: float = 60) -> dict:
    with writer.client() as client:
        made = client.post("/api/v1/tasks", json={"kind": kind, "params": params, "on_restart": "fail"})
        assert made.status_code == 202, made.text
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            task = client.get(f"/api/v1/tasks/{made.json()['id']}").json()
            if task["status"] in ("completed", "failed", "cancelled"):
                assert task["status"] == "completed", task
                return task["result"]
            time.sleep(0.2)
    raise AssertionError(f"{kind} did not finish in {timeout} s")


def pinned(database_url: str, sha256: str) -> bool:
    """A read pin that cleanup would respect now."""
    return bool(db_fetch(
        database_url, "SELECT 1 FROM arkvory_read_pins WHERE sha256 = $1 AND pinned_until > now()", sha256
    ))


def upload(client: httpx.Client, data: bytes, name: str) -> dict:
    made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": name}, content=data)
    assert made.status_code == 201, made.text
    return made.json()


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_cleanup_keeps_a_deleted_blob_while_a_download_reads_it_then_reclaims_it(s3_cluster):
    loopback_aliases_or_skip(GATEWAY_HOSTS[0])
    shared = s3_cluster.shared_env(slots=2, total=2 * 128 * KiB)
    writer = s3_cluster.writer(shared, ARKVORY_CLEANUP_GRACE="1s").wait_ready()
    start_worker(s3_cluster, real=True, ARKVORY_CLEANUP_GRACE="1s").wait_active()
    data, kept = os.urandom(1 * MiB), os.urandom(50_000)  # 8 s at the gateway's 128 KiB/s
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        doomed = upload(client, data, "doomed")
        other = upload(client, kept, "kept")
    # A stray: an object without a row, as a store that failed before a commit leaves one.
    stray = os.urandom(10_000)
    s3_cluster.put_object(blob_key(sha(stray)), stray)
    gateway = s3_cluster.gateway(1, shared, host=GATEWAY_HOSTS[0]).wait_ready()
    path = f"/api/v1/repositories/{REPO}/artifacts/{doomed['id']}/content"

    received: dict[str, object] = {}

    def download() -> None:
        with httpx.Client(headers=AUTH, timeout=60) as client:
            answer = client.get(gateway.url + path)
        received["status"], received["body"] = answer.status_code, answer.content

    thread = threading.Thread(target=download)
    thread.start()
    # The download holds its read pin before the artifact goes.
    eventually(lambda: pinned(s3_cluster.database_url, doomed["sha256"]), "the download's read pin", timeout=20)
    with writer.client() as client:
        assert client.delete(f"/api/v1/repositories/{REPO}/artifacts/{doomed['id']}").status_code == 204
    time.sleep(1.0)  # past the grace period of the blob row
    during = run_task(writer, "cleanup", {"grace_seconds": 0})
    assert s3_cluster.has_blob(doomed["sha256"]), "removed while a download was reading it"
    assert not s3_cluster.has_blob(sha(stray)), "the stray object is older than the grace period"
    assert during["steps"]["stray_files"]["deleted"] == 1
    thread.join(30)
    assert received["status"] == 200 and received["body"] == data  # byte-exact to the end

    # The pin outlives its transfer by LINGER_S, its row by 2 s more.
    gone = "the read pin expired"
    eventually(lambda: not pinned(s3_cluster.database_url, doomed["sha256"]), gone, timeout=LINGER_S + 20)
    after = run_task(writer, "cleanup", {"grace_seconds": 0})
    assert after["steps"]["blobs"]["deleted"] == 1 and after["reclaimed_bytes"] == len(data)
    assert not s3_cluster.has_blob(doomed["sha256"])
    assert s3_cluster.has_blob(other["sha256"])
    with writer.client() as client:
        assert client.get(f"/api/v1/repositories/{REPO}/artifacts/{other['id']}/content").content == kept
    assert [r["sha256"] for r in db_fetch(s3_cluster.database_url, "SELECT sha256 FROM arkvory_blobs")] == [other["sha256"]]


def test_verify_finds_an_overwritten_object_and_a_missing_one_and_an_upload_repairs_them(s3_cluster):
    writer = s3_cluster.writer().wait_ready()
    start_worker(s3_cluster, real=True).wait_active()
    good, bad, gone = os.urandom(3 * MiB), os.urandom(200_000), os.urandom(70_000)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        made = {name: upload(client, content, name) for name, content in (("good", good), ("bad", bad), ("gone", gone))}
    # Bit rot, or a person: same size, other bytes, written straight into the bucket.
    s3_cluster.put_object(blob_key(made["bad"]["sha256"]), os.urandom(len(bad)))
    import asyncio

    asyncio.run(s3_cluster.storage().delete([made["gone"]["sha256"]]))

    result = run_task(writer, "verify", {"bytes_per_second": 0})
    assert (result["checked"], result["missing"], result["corrupt"]) == (3, 1, 1)
    assert result["bytes"] == len(good) + len(bad)
    keys = s3_cluster.object_keys()
    assert not s3_cluster.has_blob(made["bad"]["sha256"])
    assert any(key.startswith(f"{QUARANTINE}/{made['bad']['sha256']}.") for key in keys)  # kept as evidence
    with writer.client() as client:
        listed = client.get("/api/v1/storage/diagnostics").json()["items"]
        problems = {item["sha256"]: item["problem"] for item in listed}
        assert problems == {made["bad"]["sha256"]: "corrupt", made["gone"]["sha256"]: "missing"}
        for name in ("bad", "gone"):
            answer = client.get(f"/api/v1/repositories/{REPO}/artifacts/{made[name]['id']}/content")
            assert answer.status_code == 503 and answer.json()["code"] == "content_unavailable"
        ready = client.get("/health/ready").json()
        assert ready["storageDiagnostics"] in ({"missing": 1, "corrupt": 1}, None)
        # The right bytes uploaded again: published afresh, the diagnostics cleared at once.
        upload(client, bad, "bad-again")
        upload(client, gone, "gone-again")
        assert client.get("/api/v1/storage/diagnostics").json()["items"] == []
        for name, content in (("bad", bad), ("gone", gone), ("good", good)):
            body = client.get(f"/api/v1/repositories/{REPO}/artifacts/{made[name]['id']}/content").content
            assert body == content
    again = run_task(writer, "verify", {"bytes_per_second": 0})
    assert (again["checked"], again["missing"], again["corrupt"]) == (3, 0, 0)
