"""The object store failing under real processes (SPEC §11): SeaweedFS killed with SIGKILL in the
middle of a download and in the middle of a `complete`, then started again on the same ports and
data. A transfer in flight is cut (never padded or silently short), new reads answer 503
`unavailable` with Retry-After, readiness says `degraded` and why, and /health/status keeps the
process in the balancer (it still serves what needs no store; tests/test_s3_balancers.py runs the
balancers); once the store answers, serving resumes with no restart and nothing lost, and a
repeat of `complete` publishes exactly one artifact. Frozen (SIGSTOP) under a cleanup's DELETE,
the store holds up no upload of the same bytes: cleanup holds no transaction or lock across it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import threading
import time
import uuid

import asyncpg
import httpx
import pytest

from .harness import ADMIN_TOKEN, db_fetch
from .tcpproxy import TcpProxy
from .s3cluster import GATEWAY_HOSTS, loopback_aliases_or_skip
from .worker_harness import dispatch, start_worker, wait_task

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

KiB, MiB = 1024, 1024 * 1024
REPO = "builds"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def metric(process, name: str) -> float:
    with process.client() as client:
        text = client.get("/health/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {timeout} s")


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_store_killed_mid_download_cuts_it_and_serving_resumes_without_a_restart(s3_cluster, seaweedfs, request):
    """The kill lands while the download still needs the store: the gateway reaches it through a
    TCP proxy that counts what it forwards; once the client has 256 KiB the proxy stalls (the
    gateway cannot read another byte of the blob, and provably has not read all of it), the store
    is killed, and only then do the held connections drop. (Killing it once 256 KiB had arrived
    raced: the gateway could already hold the rest, and the download completed.)"""
    loopback_aliases_or_skip(GATEWAY_HOSTS[0])
    proxy = TcpProxy("127.0.0.1", seaweedfs.ports.s3).start()
    request.addfinalizer(proxy.stop)
    shared = s3_cluster.shared_env(slots=2, total=2 * 256 * KiB)
    writer = s3_cluster.writer(shared).wait_ready()
    data = os.urandom(3 * MiB)  # 12 s at the gateway's 256 KiB/s
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        made = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": "f"}, content=data).json()
    path = f"/api/v1/repositories/{REPO}/artifacts/{made['id']}/content"
    gateway = s3_cluster.gateway(
        1, shared, host=GATEWAY_HOSTS[0], ARKVORY_S3_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}"
    ).wait_ready()
    pid = gateway.proc.pid

    received = bytearray()
    outcome: dict[str, object] = {}

    def download() -> None:
        try:
            with httpx.stream("GET", gateway.url + path, headers=AUTH, timeout=60) as answer:
                outcome["etag"] = answer.headers["ETag"]
                for chunk in answer.iter_bytes():
                    received.extend(chunk)
            outcome["result"] = "complete"
        except httpx.HTTPError as exc:
            outcome["result"] = exc

    thread = threading.Thread(target=download)
    thread.start()
    wait_until(lambda: len(received) > 256 * KiB or not thread.is_alive(), "downloading")
    proxy.stall()  # the fault point, held: the gateway reads nothing more of the blob
    assert thread.is_alive(), f"the download ended before the store was stopped: {outcome}"
    assert proxy.sent_downstream < len(data), "the gateway had read the whole blob from the store"
    seaweedfs.kill()
    proxy.cut()  # what the gateway's held connections meet now: a store that is gone
    proxy.resume()  # new connections reach the dead port and are refused
    thread.join(30)
    assert isinstance(outcome["result"], httpx.HTTPError), outcome  # cut, not completed short
    assert 0 < len(received) < len(data) and bytes(received) == data[:len(received)]

    # New reads answer 503 with Retry-After; the process stays in the balancer's pool.
    with gateway.client() as client:
        refused = client.get(path)
        assert refused.status_code == 503 and refused.json()["code"] == "unavailable"
        assert int(refused.headers["Retry-After"]) >= 1
        assert client.head(path).status_code == 200  # what needs no blob still answers
    # A failed read only asks for a probe (one refused connection is no outage); the probe's
    # verdict makes the process degraded, within its timeout (storage/health.py CHECK_TIMEOUT_S).
    wait_until(lambda: gateway.status() == (200, "degraded"), "degraded", timeout=10)
    # A probe that the stall held says it timed out; the next one meets the refused port.
    ready = wait_until(lambda: _naming_the_endpoint(gateway.ready()), "the endpoint named", timeout=10)
    assert ready["status"] == "degraded" and ready["storage"] == "unavailable"
    assert ready["parts"] == {"database": "available", "lease": "trusted", "storage": "unavailable", "readCache": "off"}
    assert ready["sharedDownloads"]["active"] is True  # the lease is kept: no restart needed
    assert metric(gateway, 'arkvory_transfer_aborts_total{direction="download",reason="storage_unavailable"}') == 1
    assert metric(gateway, "arkvory_storage_available") == 0
    assert metric(gateway, 'arkvory_health_status{status="degraded"}') == 1

    seaweedfs.start()
    gateway.wait_ready(timeout=30)
    writer.wait_ready(timeout=30)
    assert gateway.proc.pid == pid and gateway.proc.poll() is None
    with gateway.client(timeout=60) as client:
        rest = client.get(path, headers={"Range": f"bytes={len(received)}-", "If-Range": outcome["etag"]})
    assert rest.status_code == 206 and bytes(received) + rest.content == data
    with writer.client(timeout=60) as client:
        assert client.get(path).content == data  # nothing lost
    s3_cluster.assert_secret_nowhere(ready)


def _naming_the_endpoint(ready: dict) -> dict | None:
    return ready if "ARKVORY_S3_ENDPOINT_URL" in (ready.get("storageProblem") or "") else None


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_store_killed_during_complete_answers_503_and_a_repeat_publishes_one_artifact(s3_cluster, seaweedfs, request):
    """The kill lands while the publish is under way, never after it: the writer reaches the
    store through a TCP proxy that counts what it forwards; once the publish has sent 8 MiB the
    proxy stalls (the publish is held where it is, provably unfinished), the store is killed,
    and only then do the held connections drop. (Waiting on the store's own disk raced: the
    publish could finish before the kill, and the writer answered 201.)"""
    proxy = TcpProxy("127.0.0.1", seaweedfs.ports.s3).start()
    request.addfinalizer(proxy.stop)
    writer = s3_cluster.writer(ARKVORY_S3_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}").wait_ready()
    data = os.urandom(96 * MiB)  # six 16 MiB parts to the store: long enough to kill it midway
    part_size = 32 * MiB
    base = f"/api/v1/repositories/{REPO}/uploads"
    with writer.client(timeout=120) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        descriptor = {"name": "big.bin", "size": len(data), "sha256": sha(data), "partSize": part_size}
        session = client.post(base, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex}).json()
        for index in range(session["partCount"]):
            part = data[index * part_size:(index + 1) * part_size]
            sent = client.put(f"{base}/{session['id']}/parts/{index}", content=part,
                              headers={"X-Content-SHA256": sha(part)})
            assert sent.status_code in (200, 201, 204), sent.text

        before = proxy.sent_upstream
        answer: dict[str, httpx.Response] = {}
        completing = threading.Thread(
            target=lambda: answer.setdefault("first", client.post(f"{base}/{session['id']}/complete"))
        )
        completing.start()
        wait_until(lambda: proxy.sent_upstream - before > 8 * MiB or not completing.is_alive(),
                   "publishing", timeout=60)
        proxy.stall()  # the fault point, held: the publish cannot move on
        assert completing.is_alive(), f"the publish ended before the store was stopped: {answer}"
        assert proxy.sent_upstream - before < len(data), "the whole blob had reached the store"
        seaweedfs.kill()
        proxy.cut()  # what the writer's held connections meet now: a store that is gone
        proxy.resume()  # new connections reach the dead port and are refused
        completing.join(60)
        first = answer["first"]
        assert first.status_code == 503, first.text
        assert first.json()["code"] == "unavailable" and int(first.headers["Retry-After"]) >= 1
        assert db_fetch(s3_cluster.database_url, "SELECT id FROM arkvory_artifacts") == []
        shown = client.get(f"{base}/{session['id']}").json()
        assert shown["status"] == "open"  # resumable: the parts are still there

        seaweedfs.start()
        writer.wait_ready(timeout=30)
        again = client.post(f"{base}/{session['id']}/complete")
        assert again.status_code == 201, again.text
        replay = client.post(f"{base}/{session['id']}/complete")
        assert replay.status_code == 200 and replay.json()["id"] == again.json()["id"]
        rows = db_fetch(s3_cluster.database_url, "SELECT id, sha256 FROM arkvory_artifacts")
        assert [(str(r["id"]), r["sha256"]) for r in rows] == [(again.json()["id"], sha(data))]
        body = client.get(f"/api/v1/repositories/{REPO}/artifacts/{again.json()['id']}/content")
        assert body.status_code == 200 and body.content == data
    assert s3_cluster.has_blob(sha(data))


async def _exclusive_digest_locks(conn, sha256: str) -> int:
    """Granted exclusive claims of the digest (cleanup's and verify's; uploads take it shared)."""
    from arkvory.writer.blobs.locks import DIGEST_NAMESPACE, digest_key

    return await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'"
        " AND classid = $1::bigint::oid AND objid = ($2::bigint & 4294967295)::oid AND objsubid = 2",
        DIGEST_NAMESPACE, digest_key(sha256),
    )


async def _exclusive_digest_locks_after(conn, sha256: str, within_s: float) -> int:
    """The digest's granted exclusive claims once they are gone, or after `within_s` if not."""
    deadline = time.monotonic() + within_s
    while (held := await _exclusive_digest_locks(conn, sha256)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return held


async def _being_removed(conn, sha256: str) -> bool:
    """Cleanup has decided to remove the blob and is at the store: a pending removal mark (or,
    before marks existed, its exclusive claim held across the store's DELETE)."""
    if await conn.fetchval("SELECT to_regclass('arkvory_blob_removals') IS NOT NULL"):
        if await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM arkvory_blob_removals WHERE sha256 = $1 AND settled_at IS NULL)", sha256
        ):
            return True
    return await _exclusive_digest_locks(conn, sha256) > 0


async def _until(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        await asyncio.sleep(0.05)
    return found


FROZEN_S = 12.0  # longer than the 10 s an upload used to wait for cleanup's digest lock


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_a_store_frozen_during_a_cleanup_delete_holds_up_no_upload_of_the_same_bytes(s3_cluster, seaweedfs):
    """Cleanup removes an old unreferenced blob while SeaweedFS is frozen (SIGSTOP) under its
    DELETE, and an upload of the same bytes, staged a moment before, reaches its publishing
    transaction meanwhile. Cleanup holds no transaction and no digest lock across the store
    (it marked the removal and committed first), the upload waits for the removal without one,
    stages its bytes again once the store is back, and completes: the blob is there after both.
    (Cleanup held its transaction and the digest lock across the DELETE: the upload's claim
    gave up after 10 s and the upload failed.)"""
    url = s3_cluster.database_url
    writer = s3_cluster.writer().wait_ready()
    start_worker(s3_cluster, real=True).wait_active()
    data = os.urandom(200 * KiB)
    base = f"/api/v1/repositories/{REPO}/uploads"
    with writer.client(timeout=60) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        old = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": "old"}, content=data).json()
        assert client.delete(f"/api/v1/repositories/{REPO}/artifacts/{old['id']}").status_code == 204
        descriptor = {"name": "again.bin", "size": len(data), "sha256": sha(data), "partSize": MiB}
        session = client.post(base, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex}).json()
        sent = client.put(f"{base}/{session['id']}/parts/0", content=data, headers={"X-Content-SHA256": sha(data)})
        assert sent.status_code in (200, 201, 204), sent.text

    async def scenario() -> dict:
        holder = await asyncpg.connect(url)
        observer = await asyncpg.connect(url)
        seen: dict = {}
        try:
            # The upload's `complete` stages its bytes, then waits at its session's row lock:
            # its publishing transaction starts only once cleanup is at the frozen store.
            held = holder.transaction()
            await held.start()
            await holder.execute("SELECT 1 FROM arkvory_uploads WHERE id = $1 FOR UPDATE", uuid.UUID(session["id"]))
            async with httpx.AsyncClient(base_url=writer.url, headers=AUTH, timeout=120) as http:
                completing = asyncio.create_task(http.post(f"{base}/{session['id']}/complete"))
                await _until(
                    lambda: observer.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%FROM arkvory_uploads WHERE id = $1 FOR UPDATE%')"
                    ),
                    "staged and waiting for the session row",
                )
                os.kill(seaweedfs.pid, signal.SIGSTOP)
                frozen_at = time.monotonic()
                try:
                    seen["task"] = await asyncio.to_thread(
                        dispatch, url, "cleanup", {"grace_seconds": 0}, on_restart="fail"
                    )
                    await _until(lambda: _being_removed(observer, sha(data)), "removing the old blob")
                    # The mark is visible a moment before its transaction's digest claim is
                    # released (PostgreSQL makes a commit visible, then releases its locks): a
                    # claim held across the frozen store's DELETE would stay for all 12 s.
                    seen["exclusive_locks"] = await _exclusive_digest_locks_after(observer, sha(data), 1.0)
                    await held.commit()  # the upload publishes now, while the store is frozen
                    await asyncio.sleep(max(0.0, frozen_at + FROZEN_S - time.monotonic()))
                    seen["exclusive_locks_later"] = await _exclusive_digest_locks(observer, sha(data))
                    seen["answered_while_frozen"] = completing.done()
                finally:
                    os.kill(seaweedfs.pid, signal.SIGCONT)
                seen["answer"] = await completing
        finally:
            await holder.close()
            await observer.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen["exclusive_locks"] == 0 and seen["exclusive_locks_later"] == 0, "a digest lock was held across the store"
    answer = seen["answer"]
    assert not seen["answered_while_frozen"], answer.text
    assert answer.status_code == 201, answer.text
    ended = wait_task(url, seen["task"], ("completed", "failed"), timeout=60)
    assert ended["status"] == "completed" and ended["result"]["steps"]["blobs"]["deleted"] == 1, ended
    # Nothing lost: the blob is there, with its row, and the new artifact serves its bytes.
    assert s3_cluster.has_blob(sha(data))
    assert db_fetch(url, "SELECT sha256 FROM arkvory_blobs")[0]["sha256"] == sha(data)
    assert not db_fetch(url, "SELECT id FROM arkvory_blob_removals WHERE settled_at IS NULL")
    with writer.client(timeout=60) as client:
        body = client.get(f"/api/v1/repositories/{REPO}/artifacts/{answer.json()['id']}/content")
        assert body.status_code == 200 and body.content == data
