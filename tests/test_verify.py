"""The `verify` task kind against a real store: a real writer and gateway, real PostgreSQL, the
kind's `run(ctx)` driven by a small context with a real pool and the real storage directory.

It finds a blob corrupted in place and one deleted; the corrupt one is quarantined and every
process (a gateway that had its descriptor cached too) answers 503 `content_unavailable` for it;
the diagnostics show in /health/ready; content uploaded again clears them; a resumed run skips
what its checkpoint covers; and the rate bound holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
import uuid
from types import SimpleNamespace

import asyncpg
import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from arkvory.shared.errors import InvalidInput
from arkvory.shared.settings import Settings
from arkvory.shared.storage import Storage
from arkvory.writer.maintenance import verify
from arkvory.writer.blobs.quarantine import quarantine_dir
from arkvory.writer.tasks.context import TaskCancelled

from .harness import ADMIN_TOKEN, Cluster, db_execute, db_fetch

pytestmark = pytest.mark.timeout(120)


class LocalContext:
    """What the worker hands a kind, kept in memory: progress and checkpoints are recorded."""

    def __init__(self, pool: asyncpg.Pool, cluster: Cluster, params: dict, resumed_from: dict | None = None):
        self.task_id = uuid.uuid4()
        self.kind = "verify"
        self.params = verify.validate_params(params)
        self.resumed_from = resumed_from
        self.pool = pool
        self.storage = Storage(cluster.data_dir)
        self.settings = Settings.from_env(
            {"ARKVORY_DATABASE_URL": cluster.database_url, "ARKVORY_DATA_DIR": str(cluster.data_dir)}
        )
        registry = CollectorRegistry()
        self.metrics = SimpleNamespace(
            verify_hashed_bytes=Counter("arkvory_verify_hashed_bytes", "", registry=registry),
            storage_diagnostics=Gauge("arkvory_storage_diagnostics", "", ["problem"], registry=registry),
        )
        self.progressed: list[dict] = []
        self.checkpoints: list[dict] = []
        self.cancel = False

    @contextlib.asynccontextmanager
    async def reserving(self, **needed):
        yield

    async def progress(self, *, items=0, bytes=0, cost_units=0, message=None, data=None, conn=None) -> None:
        self.progressed.append({"items": items, "bytes": bytes, "data": data})
        if self.cancel:
            raise TaskCancelled()

    async def checkpoint(self, state: dict) -> None:
        self.checkpoints.append(state)

    def cancel_requested(self) -> bool:
        return self.cancel

    def budget_left(self) -> dict[str, int]:
        return {}  # budgets are the worker's (tests/test_worker_budgets.py runs verify on one)

    def require_budget(self, **needed) -> None:
        pass

    @property
    def hashed(self) -> float:
        return self.metrics.verify_hashed_bytes._value.get()


def run_verify(cluster: Cluster, params: dict | None = None, resumed_from: dict | None = None) -> tuple[dict, LocalContext]:
    async def go():
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=3)
        try:
            ctx = LocalContext(pool, cluster, params or {"bytes_per_second": 0}, resumed_from)
            return await verify.run(ctx), ctx
        finally:
            await pool.close()

    return asyncio.run(go())


def upload(client: httpx.Client, repo: str, name: str, data: bytes) -> dict:
    answer = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": name}, content=data)
    assert answer.status_code == 201, answer.text
    return answer.json()


def blob_path(cluster: Cluster, sha256: str) -> str:
    return Storage(cluster.data_dir).blob_file(sha256)


def flip_bytes_in_place(path: str, offset: int) -> None:
    with open(path, "r+b") as f:  # same file, same size: only the bytes differ
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def eventually(check, timeout: float = 10.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def content_url(artifact: dict, repo: str = "r") -> str:
    return f"/api/v1/repositories/{repo}/artifacts/{artifact['id']}/content"


def test_verify_quarantines_corrupt_records_missing_and_a_reupload_clears_both(cluster):
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    admin = writer.client()
    assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
    good_bytes, bad_bytes, gone_bytes = (os.urandom(300_000) for _ in range(3))
    good = upload(admin, "r", "good.bin", good_bytes)
    bad = upload(admin, "r", "bad.bin", bad_bytes)
    gone = upload(admin, "r", "gone.bin", gone_bytes)
    gateway = cluster.gateway(1, shared).wait_ready()
    on_gateway = gateway.client()

    # Both processes now hold the blob's descriptor open (shared/storage/open_blobs.py, up to 10 s).
    for client in (admin, on_gateway):
        assert client.get(content_url(bad)).content == bad_bytes
    flip_bytes_in_place(blob_path(cluster, bad["sha256"]), 1000)
    os.unlink(blob_path(cluster, gone["sha256"]))
    # Without the quarantine, the cached descriptor serves the flipped bytes as if good.
    assert on_gateway.get(content_url(bad)).content != bad_bytes

    result, ctx = run_verify(cluster)
    assert result["checked"] == 3 and result["missing"] == 1 and result["corrupt"] == 1, result
    assert result["bytes"] == 600_000  # the good and the corrupt one were read; the gone one had nothing
    assert ctx.hashed == 600_000
    assert ctx.metrics.storage_diagnostics.labels(problem="corrupt")._value.get() == 1
    assert sum(p["items"] for p in ctx.progressed) == 3

    # The corrupt file is out of the store, kept as evidence.
    assert not os.path.exists(blob_path(cluster, bad["sha256"]))
    kept = [p for p in os.listdir(quarantine_dir(Storage(cluster.data_dir))) if p.startswith(bad["sha256"])]
    assert len(kept) == 1

    # Every process stops serving it promptly, the gateway's cached descriptor included.
    for client in (admin, on_gateway):
        def refused(client=client):
            answer = client.get(content_url(bad))
            return answer if answer.status_code == 503 else None

        answer = eventually(refused, timeout=5, every=0.05)
        assert answer is not None, f"{client.base_url} still serves the quarantined blob"
        assert answer.json()["code"] == "content_unavailable" and "Retry-After" in answer.headers
        missing = client.get(content_url(gone))
        assert missing.status_code == 503 and missing.json()["code"] == "content_unavailable"
        assert client.get(content_url(good)).content == good_bytes

    rows = db_fetch(cluster.database_url, "SELECT sha256, problem, task_id FROM arkvory_storage_diagnostics")
    assert {(r["sha256"], r["problem"]) for r in rows} == {(bad["sha256"], "corrupt"), (gone["sha256"], "missing")}
    assert all(r["task_id"] == ctx.task_id for r in rows)

    # Every process reports them (cached for a few seconds).
    for client in (admin, on_gateway):
        def reported(client=client):
            body = client.get("/health/ready").json()
            return body["storageDiagnostics"] == {"missing": 1, "corrupt": 1}

        assert eventually(reported, timeout=12, every=0.5)
    metrics = on_gateway.get("/health/metrics").text
    assert 'arkvory_storage_diagnostics{problem="corrupt"} 1.0' in metrics

    # A second run keeps the corrupt one corrupt (missing only because it was quarantined).
    again, _ = run_verify(cluster)
    assert again["corrupt"] == 1 and again["missing"] == 1, again
    problems = {r["problem"] for r in db_fetch(cluster.database_url, "SELECT problem FROM arkvory_storage_diagnostics")}
    assert problems == {"corrupt", "missing"}

    # The right bytes uploaded again put a good file back; verify then clears the diagnostics.
    upload(admin, "r", "bad-again.bin", bad_bytes)
    upload(admin, "r", "gone-again.bin", gone_bytes)
    result, _ = run_verify(cluster)
    assert result["missing"] == 0 and result["corrupt"] == 0, result
    assert db_fetch(cluster.database_url, "SELECT * FROM arkvory_storage_diagnostics") == []
    for client in (admin, on_gateway):
        answer = eventually(lambda client=client: client.get(content_url(bad)).status_code == 200, timeout=5)
        assert answer and client.get(content_url(bad)).content == bad_bytes
        assert client.get(content_url(gone)).content == gone_bytes
    admin.close()
    on_gateway.close()


def upload_in_session(client: httpx.Client, repo: str, name: str, data: bytes) -> dict:
    """The resumable way (writer/uploads/routes.py): the session's file is linked under the digest."""
    descriptor = {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "partSize": 1024 * 1024}
    base = f"/api/v1/repositories/{repo}/uploads"
    session = client.post(base, json=descriptor, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert session.status_code == 201, session.text
    sent = client.put(f"{base}/{session.json()['id']}/content", content=data)
    assert sent.status_code == 200, sent.text
    done = client.post(f"{base}/{session.json()['id']}/complete")
    assert done.status_code == 201, done.text
    return done.json()


def test_an_upload_that_places_good_bytes_clears_the_diagnostic_without_another_verify(cluster):
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    admin = writer.client()
    assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
    bad_bytes, gone_bytes, kept_bytes = (os.urandom(300_000) for _ in range(3))
    bad = upload(admin, "r", "bad.bin", bad_bytes)
    gone = upload(admin, "r", "gone.bin", gone_bytes)
    kept = upload(admin, "r", "kept.bin", kept_bytes)
    gateway = cluster.gateway(1, shared).wait_ready()
    on_gateway = gateway.client()
    flip_bytes_in_place(blob_path(cluster, bad["sha256"]), 1000)
    os.unlink(blob_path(cluster, gone["sha256"]))
    result, _ = run_verify(cluster)
    assert result["corrupt"] == 1 and result["missing"] == 1, result
    # A diagnostic of a blob whose file is still in place (as an I/O error that could not
    # quarantine would leave): an upload replaces that file with the bytes it hashed.
    db_execute(
        cluster.database_url,
        "INSERT INTO arkvory_storage_diagnostics (sha256, problem, detail) VALUES ($1, 'corrupt', 'read error')",
        kept["sha256"],
    )

    def ready_counts(client) -> dict | None:
        return client.get("/health/ready").json()["storageDiagnostics"]

    for client in (admin, on_gateway):
        assert eventually(lambda client=client: ready_counts(client) == {"missing": 1, "corrupt": 2}, timeout=12, every=0.5)
        assert client.get(content_url(bad)).status_code == 503

    upload(admin, "r", "bad-again.bin", bad_bytes)  # one-shot: its file is renamed into place
    upload_in_session(admin, "r", "gone-again.bin", gone_bytes)  # a session's file is linked into place
    upload_in_session(admin, "r", "kept-again.bin", kept_bytes)  # a file is there: replaced

    assert admin.get("/api/v1/storage/diagnostics").json()["items"] == []
    for client in (admin, on_gateway):
        # /health/ready answers from a cache at most DIAGNOSTICS_FRESH_S (5 s) old.
        assert eventually(lambda client=client: ready_counts(client) == {"missing": 0, "corrupt": 0}, timeout=8, every=0.25)
        good = eventually(lambda client=client: client.get(content_url(bad)).status_code == 200, timeout=5)
        assert good and client.get(content_url(bad)).content == bad_bytes
        assert client.get(content_url(gone)).content == gone_bytes
    admin.close()
    on_gateway.close()


@pytest.mark.parametrize("how", ["session", "one-shot"])
def test_uploading_rotted_content_again_puts_the_verified_bytes_back_everywhere(cluster, how):
    """A blob rots in place and nobody has noticed yet (no verify ran; the gateway serves it
    from a cached descriptor). The same content uploaded again, either way, leaves the bytes it
    hashed under the digest and clears the blob's diagnostic, and every process serves the good
    bytes at once: the file it had open is not the blob any more. (Before: a session kept the
    rotten file it never checked; a one-shot upload replaced it, but the gateway went on
    serving the rotten one from its cached descriptor.)"""
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    admin = writer.client()
    assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
    data = os.urandom(300_000)
    first = upload(admin, "r", "a.bin", data)
    gateway = cluster.gateway(1, shared).wait_ready()
    on_gateway = gateway.client()
    assert on_gateway.get(content_url(first)).content == data  # its descriptor is cached now
    flip_bytes_in_place(blob_path(cluster, first["sha256"]), 1000)
    assert on_gateway.get(content_url(first)).content != data  # rotten, and served so
    db_execute(
        cluster.database_url,
        "INSERT INTO arkvory_storage_diagnostics (sha256, problem, detail) VALUES ($1, 'corrupt', 'read error')",
        first["sha256"],
    )

    if how == "session":
        upload_in_session(admin, "r", "a-again.bin", data)
    else:
        upload(admin, "r", "a-again.bin", data)

    with open(blob_path(cluster, first["sha256"]), "rb") as stored:
        assert hashlib.sha256(stored.read()).hexdigest() == first["sha256"], "the rotten file was kept"
    assert admin.get("/api/v1/storage/diagnostics").json()["items"] == []
    # The notification reaches the gateway's control connection within moments; its cached
    # descriptor would otherwise live on as long as downloads keep it busy.
    assert eventually(lambda: on_gateway.get(content_url(first)).content == data, timeout=3, every=0.05)
    assert admin.get(content_url(first)).content == data
    admin.close()
    on_gateway.close()


def test_wrong_size_is_corrupt_and_quarantined(cluster):
    writer = cluster.writer().wait_ready()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        artifact = upload(admin, "r", "a.bin", os.urandom(5000))
    with open(blob_path(cluster, artifact["sha256"]), "ab") as f:
        f.write(b"tail")
    result, _ = run_verify(cluster)
    assert result["corrupt"] == 1
    detail = db_fetch(cluster.database_url, "SELECT detail FROM arkvory_storage_diagnostics")[0]["detail"]
    assert "5004 bytes on disk, 5000 recorded" in detail and "quarantined" in detail


def test_a_resumed_run_skips_the_blobs_its_checkpoint_covers(cluster, monkeypatch):
    writer = cluster.writer().wait_ready()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        artifacts = [upload(admin, "r", f"{i}.bin", os.urandom(10_000 + i)) for i in range(6)]
    digests = sorted(a["sha256"] for a in artifacts)
    sizes = {a["sha256"]: a["size"] for a in artifacts}

    monkeypatch.setattr(verify, "CHECKPOINT_EVERY_S", 0.0)  # a checkpoint after every blob
    _, first = run_verify(cluster)
    assert [c["after"] for c in first.checkpoints] == digests
    assert first.checkpoints[2]["checked"] == 3

    # Corrupt a blob the checkpoint says is done: a resumed run must not read it again.
    flip_bytes_in_place(blob_path(cluster, digests[0]), 0)
    result, resumed = run_verify(cluster, resumed_from=first.checkpoints[2])
    assert result["checked"] == 6 and result["corrupt"] == 0, result
    assert resumed.hashed == sum(sizes[d] for d in digests[3:])
    assert [c["after"] for c in resumed.checkpoints] == digests[3:]
    # A fresh run does find it.
    fresh, _ = run_verify(cluster)
    assert fresh["corrupt"] == 1


def test_a_blob_back_before_verify_records_it_missing_is_not_reported(cluster, monkeypatch):
    """The file is gone when verify reads it, and back (an upload put the bytes back) by the
    time verify claims the digest to record it: verify looks once more after recording, outside
    any transaction, and withdraws the finding."""
    writer = cluster.writer().wait_ready()
    content = os.urandom(20_000)
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        made = upload(admin, "r", "x.bin", content)
    path = blob_path(cluster, made["sha256"])
    os.unlink(path)
    claim = verify.claim_for_diagnosis

    async def put_back_then_claim(conn, sha256):
        with open(path, "wb") as back:
            back.write(content)
        await claim(conn, sha256)

    monkeypatch.setattr(verify, "claim_for_diagnosis", put_back_then_claim)
    result, _ = run_verify(cluster)
    assert (result["checked"], result["missing"]) == (1, 0), result
    assert db_fetch(cluster.database_url, "SELECT sha256 FROM arkvory_storage_diagnostics") == []


@pytest.mark.parametrize("blobs", [1, 16])  # one large blob (paced by piece), small ones (by group)
def test_the_rate_bound_holds(cluster, blobs):
    writer = cluster.writer().wait_ready()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for n in range(blobs):
            upload(admin, "r", f"{n}.bin", os.urandom(4 * 1024 * 1024 // blobs))
    started = time.monotonic()
    result, _ = run_verify(cluster, {"bytes_per_second": 2 * 1024 * 1024})
    paced = time.monotonic() - started
    assert result["bytes"] == 4 * 1024 * 1024
    assert paced >= 1.5, f"4 MiB at 2 MiB/s took only {paced:.2f} s"
    started = time.monotonic()
    run_verify(cluster, {"bytes_per_second": 0})
    assert time.monotonic() - started < paced  # unthrottled is not paced


@pytest.mark.parametrize("rate", [1024 * 1024, 1000])  # the second waits over a minute per piece
def test_a_cancel_stops_inside_a_large_blob(cluster, rate):
    writer = cluster.writer().wait_ready()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        upload(admin, "r", "big.bin", os.urandom(2 * 1024 * 1024))

    async def go():
        pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
        try:
            ctx = LocalContext(pool, cluster, {"bytes_per_second": rate})
            task = asyncio.ensure_future(verify.run(ctx))
            await asyncio.sleep(0.3)
            ctx.cancel = True
            started = time.monotonic()
            with pytest.raises(TaskCancelled):
                await asyncio.wait_for(task, 5)
            return time.monotonic() - started, ctx
        finally:
            await pool.close()

    waited, ctx = asyncio.run(go())
    assert waited < 1.0 and ctx.hashed < 2 * 1024 * 1024


def test_params_are_checked():
    assert verify.validate_params(None) == {}
    assert verify.validate_params({"bytes_per_second": 0}) == {"bytes_per_second": 0}
    for bad in ([], {"bytes_per_second": -1}, {"bytes_per_second": True}, {"bytes_per_second": "1"},
                {"bytes_per_second": 2**41}, {"sample": 1}):
        with pytest.raises(InvalidInput):
            verify.validate_params(bad)


def test_pacer_grants_rate_times_time_plus_one_piece():
    now = [0.0]
    pacer = verify.Pacer(1000, clock=lambda: now[0])
    assert pacer.delay(250) == 0.0  # the first piece goes at once
    assert pacer.delay(250) == pytest.approx(0.25)
    now[0] = 10.0  # idle time banks no credit beyond the next piece
    assert pacer.delay(250) == 0.0
    assert pacer.delay(250) == pytest.approx(0.25)
    assert verify.Pacer(0).delay(10**12) == 0.0


def test_the_cached_descriptor_is_dropped_on_notification(tmp_path):
    from arkvory.shared.storage import open_blobs

    path = tmp_path / "blob"
    path.write_bytes(b"x")
    blobs = open_blobs.OpenBlobs(lambda sha256: str(path))
    fd = blobs.acquire("a" * 64)
    blobs.release("a" * 64, fd)
    assert len(blobs) == 1
    open_blobs.forget_everywhere("b" * 64)
    assert len(blobs) == 1
    open_blobs.forget_everywhere("a" * 64)
    assert len(blobs) == 0
    path.unlink()
    with pytest.raises(FileNotFoundError):
        blobs.acquire("a" * 64)


def test_a_database_that_does_not_answer_makes_the_counts_null_not_a_hang(cluster, db_proxy):
    writer = cluster.writer(ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url)).wait_ready()
    db_proxy.stall()
    try:
        started = time.monotonic()
        answer = httpx.get(
            f"{writer.url}/health/ready", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
        )
        assert time.monotonic() - started < 3
        assert answer.json()["storageDiagnostics"] is None
    finally:
        db_proxy.resume()


@pytest.mark.parametrize("size", [0, verify.READ_BYTES + 1])
def test_edge_sizes_hash_right(cluster, size):
    writer = cluster.writer().wait_ready()
    data = os.urandom(size)
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        artifact = upload(admin, "r", "e.bin", data)
    assert artifact["sha256"] == hashlib.sha256(data).hexdigest()
    # Paced (piece boundaries are part of what is checked), fast enough for a second a blob.
    result, _ = run_verify(cluster, {"bytes_per_second": 1_000_000})
    assert result == {"checked": 1, "bytes": size, "missing": 0, "corrupt": 0, "cleared": 0}


def test_verify_dispatched_through_the_api_runs_on_a_real_worker(cluster):
    from .worker_harness import start_worker

    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        data = os.urandom(100_000)
        bad = upload(admin, "r", "bad.bin", data)
        upload(admin, "r", "good.bin", os.urandom(100_000))
        gateway = cluster.gateway(1, shared).wait_ready()
        with gateway.client() as on_gateway:
            assert on_gateway.get(content_url(bad)).content == data  # its descriptor is cached now
            flip_bytes_in_place(blob_path(cluster, bad["sha256"]), 99_999)

            answer = admin.post(
                "/api/v1/tasks", json={"kind": "verify", "params": {"bytes_per_second": 0}, "on_restart": "resume"}
            )
            assert answer.status_code == 202, answer.text
            location = answer.headers["Location"]
            task = eventually(lambda: (t := admin.get(location).json())["status"] in ("completed", "failed") and t, 30)
            assert task and task["status"] == "completed", task
            assert task["result"]["corrupt"] == 1 and task["result"]["checked"] == 2
            assert task["budget"]["usage"]["items"] == 2 and task["budget"]["usage"]["bytes"] == 200_000

            refused = eventually(lambda: (a := on_gateway.get(content_url(bad))).status_code == 503 and a, 5, 0.05)
            assert refused and refused.json()["code"] == "content_unavailable"
            listed = admin.get("/api/v1/storage/diagnostics").json()["items"]
            assert [(i["sha256"], i["problem"], i["taskId"]) for i in listed] == [(bad["sha256"], "corrupt", task["id"])]
    assert 'arkvory_storage_diagnostics{problem="corrupt"} 1.0' in worker.get("/health/metrics").text


def test_the_offline_scrub_finds_and_quarantines(cluster):
    from .harness import run_arkvory

    writer = cluster.writer().wait_ready()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        bad = upload(admin, "r", "bad.bin", os.urandom(50_000))
        gone = upload(admin, "r", "gone.bin", os.urandom(50_000))
    env = writer.env
    refused = run_arkvory(env, "admin", "scrub")
    assert refused.returncode == 75, refused.stderr  # the writer is up
    writer.kill()
    flip_bytes_in_place(blob_path(cluster, bad["sha256"]), 0)
    os.unlink(blob_path(cluster, gone["sha256"]))
    done = run_arkvory(env, "admin", "scrub", "--params", '{"bytes_per_second": 0}')
    assert done.returncode == 0, done.stderr
    assert '"corrupt": 1' in done.stdout and '"missing": 1' in done.stdout
    assert "2 blobs checked" in done.stdout  # the progress line
    assert not os.path.exists(blob_path(cluster, bad["sha256"]))
    restarted = cluster.writer().wait_ready()
    with restarted.client() as admin:
        answer = admin.get(content_url(bad))
        assert answer.status_code == 503 and answer.json()["code"] == "content_unavailable"
        assert admin.get("/health/ready").json()["storageDiagnostics"] == {"missing": 1, "corrupt": 1}


def test_quarantine_moves_only_the_file_that_was_hashed(tmp_path):
    from arkvory.writer.blobs.quarantine import move_to_quarantine

    storage = Storage(tmp_path)
    storage.create_layout("test")
    sha256 = "ab" * 32
    path = storage.blob_path(sha256)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"bad bytes")
    hashed = os.stat(path)
    # A re-upload puts a good file under the digest between the hashing and the move.
    (tmp_path / "good").write_bytes(b"good bytes")
    os.replace(tmp_path / "good", path)
    assert move_to_quarantine(storage, sha256, hashed) is None
    assert path.read_bytes() == b"good bytes"
    assert os.listdir(quarantine_dir(storage)) == []
    # The file that was hashed is moved, and kept.
    moved = move_to_quarantine(storage, sha256, os.stat(path))
    assert moved is not None and moved.read_bytes() == b"good bytes" and not path.exists()
    assert move_to_quarantine(storage, sha256, hashed) is None  # nothing there any more
