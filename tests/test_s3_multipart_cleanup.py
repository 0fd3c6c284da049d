"""Cleanup's `multipart_uploads` step (writer/maintenance/multipart_uploads.py) on a real SeaweedFS,
run by a real `arkvory worker` beside a real writer: a writer killed (SIGKILL) while a session's
parts were being published leaves an incomplete multipart upload, which cleanup leaves alone
while the session is open and aborts once nothing owns it; an upload still taking parts (a
staging under way) is left alone until it has been idle for the grace; an aborted upload takes
no further part and cannot be completed, so nothing partial ever shows, and a session whose
publication was aborted still completes byte-exact from its file.

SeaweedFS 4.48 answers ListMultipartUploads (paged by NextUploadIdMarker alone), ListParts and
AbortMultipartUpload for the non-admin identity Arkvory runs with. The store is looked at, and
the test's own uploads are made, by curl (--aws-sigv4), not by the code under test.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from xml.etree import ElementTree

import pytest

from arkvory.shared.storage.s3 import blob_key

from .test_seaweedfs import curl
from .harness import db_execute
from .tools import require_tool
from .worker_harness import dispatch, start_worker, wait_for, wait_task

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

KiB, MiB = 1024, 1024 * 1024
REPO = "builds"
BASE = f"/api/v1/repositories/{REPO}/uploads"
PART = 16 * MiB  # the store's part size (s3_client.PART_SIZE): each session part is one of its parts


@pytest.fixture(autouse=True)
def _curl():
    require_tool("curl", apt="curl")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the store, seen with curl ------------------------------------------------------------------


def s3(cluster, method: str, key: str | None = None, query: str = "", *args: str) -> tuple[int, bytes]:
    """One signed request of the installation's identity; `key` is under the prefix."""
    path = f"/{cluster.bucket.name}" + (f"/{cluster.prefix}/{key}" if key else "")
    url = cluster.bucket.store.endpoint_url + path + (f"?{query}" if query else "")
    # `-X HEAD` would wait for the body its Content-Length announces: --head does not.
    verb = ["--head"] if method == "HEAD" else ["-X", method]
    return curl(cluster.bucket.store, *verb, *args, url)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def incomplete_uploads(cluster) -> dict[str, str]:
    """upload id -> key (under the prefix) of every incomplete multipart upload of the installation."""
    status, body = s3(cluster, "GET", None, f"prefix={cluster.prefix}%2F&uploads=")
    assert status == 200, body
    found = {}
    for upload in (e for e in ElementTree.fromstring(body) if _local(e.tag) == "Upload"):
        fields = {_local(e.tag): e.text for e in upload}
        found[fields["UploadId"]] = fields["Key"][len(cluster.prefix) + 1:]
    return found


def part_count(cluster, key: str, upload_id: str) -> int:
    status, body = s3(cluster, "GET", key, f"uploadId={upload_id}")
    assert status == 200, body
    return sum(_local(e.tag) == "Part" for e in ElementTree.fromstring(body))


def start_upload(cluster, key: str) -> str:
    """CreateMultipartUpload, as a writer's staging begins one."""
    status, body = s3(cluster, "POST", key, "uploads=")
    assert status == 200, body
    return next(e.text for e in ElementTree.fromstring(body) if _local(e.tag) == "UploadId")


def send_part(cluster, key: str, upload_id: str, number: int, data: bytes) -> int:
    status, _ = s3(cluster, "PUT", key, f"partNumber={number}&uploadId={upload_id}", "--data-binary", data.decode("latin-1"))
    return status


def complete_upload(cluster, key: str, upload_id: str) -> int:
    parts = '<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"x"</ETag></Part></CompleteMultipartUpload>'
    status, _ = s3(cluster, "POST", key, f"uploadId={upload_id}", "--data-binary", parts)
    return status


# -- the installation ----------------------------------------------------------------------------


def create_session(client, data: bytes) -> dict:
    descriptor = {"name": "big.bin", "size": len(data), "sha256": sha(data), "partSize": PART}
    answer = client.post(BASE, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert answer.status_code == 201, answer.text
    return answer.json()


def put_part(client, session: dict, index: int, data: bytes) -> None:
    part = data[index * PART:(index + 1) * PART]
    sent = client.put(f"{BASE}/{session['id']}/parts/{index}", content=part, headers={"X-Content-SHA256": sha(part)})
    assert sent.status_code in (200, 201, 204), sent.text


def complete_and_download(client, session: dict, data: bytes) -> dict:
    done = client.post(f"{BASE}/{session['id']}/complete")
    assert done.status_code == 201, done.text
    body = client.get(f"/api/v1/repositories/{REPO}/artifacts/{done.json()['id']}/content")
    assert body.status_code == 200 and body.content == data
    return done.json()


def cleanup(cluster, grace: int) -> dict:
    """A cleanup run by the worker; its `multipart_uploads` step's result."""
    task_id = dispatch(cluster.database_url, "cleanup", {"grace_seconds": grace}, on_restart="fail")
    ended = wait_task(cluster.database_url, task_id, ("completed", "failed", "budget_exceeded"), timeout=90)
    assert ended["status"] == "completed", ended
    return ended["result"]["steps"]["multipart_uploads"]


def session_being_published(cluster, writer, data: bytes, parts: int) -> tuple[dict, str]:
    """A session that declares its digest, with its first `parts` parts sent: (the session, the
    upload id of its publication, once the store holds a part of it)."""
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        session = create_session(client, data)
        for index in range(parts):
            put_part(client, session, index, data)
    return session, publication_fed(cluster, sha(data))


def publication_fed(cluster, sha256: str) -> str:
    """The upload id of the session's publication, once the store holds a part of it."""
    def fed():
        ids = [i for i, key in incomplete_uploads(cluster).items() if key == blob_key(sha256)]
        return ids[0] if ids and part_count(cluster, blob_key(sha256), ids[0]) >= 1 else None

    return wait_for(fed, "a part of the publication in the store", timeout=60, every=0.2)


# -- the tests -----------------------------------------------------------------------------------


def test_a_writer_killed_while_publishing_leaves_an_upload_that_cleanup_aborts_once_no_session_owns_it(s3_cluster):
    writer = s3_cluster.writer().wait_ready()
    worker = start_worker(s3_cluster, real=True).wait_active()
    data = os.urandom(2 * PART + 3 * MiB)
    session, killed = session_being_published(s3_cluster, writer, data, 2)
    writer.kill()  # SIGKILL, in the middle of its publication

    # The session is open, so its upload may be fed still, however old: left alone.
    writer = s3_cluster.writer().wait_ready()
    kept = cleanup(s3_cluster, 0)
    assert (kept["aborted"], kept["kept_for_sessions"]) == (0, 1), kept
    assert killed in incomplete_uploads(s3_cluster)

    # The session resumes on the new writer and publishes from its file: a staging of its own.
    with writer.client(timeout=120) as client:
        put_part(client, session, 2, data)
        artifact = complete_and_download(client, session, data)
    assert incomplete_uploads(s3_cluster) == {killed: blob_key(sha(data))}

    # No session owns it now. Younger than the grace, it stays; past the grace, it goes.
    young = cleanup(s3_cluster, 3600)
    assert (young["listed"], young["aborted"], young["kept_recent"]) == (1, 0, 1), young
    aborted = cleanup(s3_cluster, 1)
    assert (aborted["listed"], aborted["aborted"], aborted["kept_for_sessions"]) == (1, 1, 0), aborted
    assert aborted["bytes"] >= PART  # at least the part that reached the store before the kill
    assert incomplete_uploads(s3_cluster) == {}
    # The published object was not touched.
    with writer.client(timeout=120) as client:
        again = client.get(f"/api/v1/repositories/{REPO}/artifacts/{artifact['id']}/content")
        assert again.status_code == 200 and again.content == data
    assert "arkvory_cleanup_aborted_multipart_uploads_total 1.0" in worker.get("/health/metrics").text
    assert "aborted the incomplete multipart upload of " + sha(data) in worker.stderr


def test_a_killed_writers_session_that_expires_takes_its_upload_with_it_in_the_same_cleanup(s3_cluster):
    """The client never comes back: the session expires, and one cleanup removes it (the
    `upload_sessions` step) and then aborts its upload, which nothing owns any more."""
    writer = s3_cluster.writer().wait_ready()
    start_worker(s3_cluster, real=True).wait_active()
    data = os.urandom(PART + 3 * MiB)
    _, killed = session_being_published(s3_cluster, writer, data, 1)
    writer.kill()
    # ARKVORY_UPLOAD_EXPIRY has passed (a day by default).
    db_execute(s3_cluster.database_url, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second'")
    task_id = dispatch(s3_cluster.database_url, "cleanup", {"grace_seconds": 0}, on_restart="fail")
    ended = wait_task(s3_cluster.database_url, task_id, ("completed", "failed"), timeout=90)
    assert ended["status"] == "completed", ended
    steps = ended["result"]["steps"]
    assert steps["upload_sessions"]["sessions"] == 1, steps
    assert (steps["multipart_uploads"]["aborted"], steps["multipart_uploads"]["bytes"]) == (1, PART), steps
    assert killed not in incomplete_uploads(s3_cluster) and incomplete_uploads(s3_cluster) == {}


GRACE_S = 4


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_an_upload_still_taking_parts_is_left_alone_until_idle_and_an_aborted_one_never_completes(s3_cluster):
    writer = s3_cluster.writer().wait_ready()
    start_worker(s3_cluster, real=True).wait_active()
    data = os.urandom(2 * PART + 3 * MiB)
    session, fed = session_being_published(s3_cluster, writer, data, 2)
    # A staging nobody's session names (as a writer's `complete` or a one-shot upload makes),
    # taking a part now and then.
    staged = blob_key(sha(b"a staging under way"))
    staging = start_upload(s3_cluster, staged)
    assert send_part(s3_cluster, staged, staging, 1, b"p" * KiB) == 200
    began = time.monotonic()

    young = cleanup(s3_cluster, 3600)
    assert (young["listed"], young["kept_recent"], young["aborted"]) == (2, 2, 0), young

    time.sleep(max(0.0, began + GRACE_S + 1 - time.monotonic()))
    assert send_part(s3_cluster, staged, staging, 2, b"p" * KiB) == 200
    sent = time.monotonic()
    busy = cleanup(s3_cluster, GRACE_S)  # begun past the grace, but a part arrived a moment ago
    assert (busy["kept_for_sessions"], busy["kept_recent"], busy["aborted"]) == (1, 1, 0), busy
    assert time.monotonic() - sent < GRACE_S, "the cleanup took too long to show anything (a loaded machine?)"

    time.sleep(max(0.0, sent + GRACE_S + 1 - time.monotonic()))
    idle = cleanup(s3_cluster, GRACE_S)
    assert (idle["kept_for_sessions"], idle["aborted"], idle["bytes"]) == (1, 1, 2 * KiB), idle
    assert set(incomplete_uploads(s3_cluster)) == {fed}
    # The staging's writer, if it were alive, could go no further: nothing of it ever shows.
    assert send_part(s3_cluster, staged, staging, 3, b"p" * KiB) == 404
    assert complete_upload(s3_cluster, staged, staging) == 404
    assert s3(s3_cluster, "HEAD", staged)[0] == 404

    with writer.client(timeout=120) as client:
        put_part(client, session, 2, data)
        complete_and_download(client, session, data)
    assert incomplete_uploads(s3_cluster) == {}


def test_a_session_whose_publication_was_aborted_still_completes_byte_exact(s3_cluster):
    """The race cleanup may lose to a writer (or a lifecycle rule may win): the publication fed
    while the parts arrived is aborted before `complete`. Its CompleteMultipartUpload fails,
    nothing partial shows, and `complete` publishes from the session's file."""
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(2 * PART + 3 * MiB)
    session, fed = session_being_published(s3_cluster, writer, data, 3)
    status, _ = s3(s3_cluster, "DELETE", blob_key(sha(data)), f"uploadId={fed}")
    assert status == 204
    assert s3(s3_cluster, "HEAD", blob_key(sha(data)))[0] == 404
    with writer.client(timeout=120) as client:
        complete_and_download(client, session, data)
    assert incomplete_uploads(s3_cluster) == {}
    assert "completing the publication sent while receiving failed" in writer.stderr


def test_the_budget_bounds_the_aborts_and_holds_their_usage(s3_cluster):
    """Two abandoned uploads and room in the budget for one: one is aborted and counted (an item,
    a cost unit and its part's bytes), then the task fails with budget_exceeded before the
    second, which stays for the next run."""
    s3_cluster.writer().wait_ready()
    start_worker(s3_cluster, real=True).wait_active()
    keys = [blob_key(sha(f"abandoned {n}".encode())) for n in range(2)]
    ids = {start_upload(s3_cluster, key): key for key in keys}
    for upload_id, key in ids.items():
        assert send_part(s3_cluster, key, upload_id, 1, b"p" * KiB) == 200
    task_id = dispatch(s3_cluster.database_url, "cleanup", {"grace_seconds": 0}, on_restart="fail",
                       budget={"max_items": 1})
    ended = wait_task(s3_cluster.database_url, task_id, ("completed", "failed"), timeout=90)
    assert (ended["status"], ended["error_code"]) == ("failed", "budget_exceeded"), (ended["result"], ended["usage"])
    assert (ended["usage"]["items"], ended["usage"]["bytes"], ended["usage"]["cost_units"]) == (1, KiB, 1), ended["usage"]
    assert len(incomplete_uploads(s3_cluster)) == 1
