"""The `cleanup` task (writer/maintenance/cleanup.py) against real processes: run by a real
worker in a loop while two gateways serve downloads and uploads of the same content come and go,
and run in the test (with the offline context) to check each rule: grace period for blobs and
stray files, read pins, abandoned uploads, expired keys and credentials, task retention.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import pathlib
import time
import uuid

import asyncpg
import httpx
import pytest

from arkvory.shared.settings import Settings
from arkvory.shared.storage import Storage
from arkvory.writer.maintenance import cleanup
from arkvory.writer.worker.offline import OfflineContext

from .harness import ADMIN_TOKEN, db_execute, db_fetch
from .worker_harness import dispatch, events, start_worker, wait_task

pytestmark = pytest.mark.timeout(240)

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def blob_path(data_dir: pathlib.Path, sha256: str) -> pathlib.Path:
    return data_dir / "blobs" / "sha256" / sha256[:2] / sha256[2:4] / sha256


async def run_cleanup(cluster, params: dict) -> tuple[dict, str]:
    """Run the kind in this process, as `arkvory admin gc` does; (result, progress lines)."""
    settings = Settings.from_env(cluster.base_env())
    out = io.StringIO()
    pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=2)
    try:
        ctx = OfflineContext("cleanup", cleanup.validate_params(params), pool, Storage(cluster.data_dir), settings, out=out)
        result = await cleanup.run(ctx)
    finally:
        await pool.close()
    return result, out.getvalue()


@pytest.mark.soak  # ~20 s of cleanups in a loop: .ci/run runs it (pytest -m soak)
def test_cleanup_in_a_loop_during_downloads_and_uploads_breaks_nothing_and_reclaims(cluster):
    shared = cluster.shared_env(slots=3)
    writer = cluster.writer(shared, ARKVORY_MAX_UPLOADS="8", ARKVORY_MAX_UPLOADS_PER_PRINCIPAL="8").wait_ready()
    keep, garbage, churn = {}, {}, [os.urandom(150_000 + n) for n in range(3)]
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for n in range(6):
            content = os.urandom(300_000 + n)
            made = client.post("/api/v1/repositories/r/artifacts", params={"name": f"k{n}"}, content=content)
            assert made.status_code == 201
            keep[made.json()["id"]] = content
        for n in range(20):
            content = os.urandom(20_000 + n)
            made = client.post("/api/v1/repositories/r/artifacts", params={"name": f"g{n}"}, content=content).json()
            assert client.delete(f"/api/v1/repositories/r/artifacts/{made['id']}").status_code == 204
            garbage[made["sha256"]] = len(content)
    gateways = [cluster.gateway(1, shared).wait_ready(), cluster.gateway(2, shared).wait_ready()]
    worker = start_worker(cluster, real=True).wait_active()
    stop_at = time.monotonic() + 15

    async def download_loop(url: str, counts: dict) -> None:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:
            while time.monotonic() < stop_at:
                for artifact_id, content in keep.items():
                    answer = await http.get(f"/api/v1/repositories/r/artifacts/{artifact_id}/content")
                    assert answer.status_code == 200, answer.text
                    assert answer.content == content, "a download got wrong bytes"
                    counts["ok"] += 1

    async def churn_loop(content: bytes, counts: dict) -> None:
        """Upload, download from a gateway, delete, again: the blob is garbage between rounds."""
        async with (
            httpx.AsyncClient(base_url=writer.url, headers=AUTH, timeout=30) as w,
            httpx.AsyncClient(base_url=gateways[counts["uploads"] % 2].url, headers=AUTH, timeout=30) as g,
        ):
            while time.monotonic() < stop_at:
                made = await w.post("/api/v1/repositories/r/artifacts", params={"name": "c"}, content=content)
                assert made.status_code == 201, made.text
                counts["uploads"] += 1
                path = f"/api/v1/repositories/r/artifacts/{made.json()['id']}"
                answer = await g.get(f"{path}/content")
                assert answer.status_code == 200 and answer.content == content, answer.status_code
                assert (await w.delete(path)).status_code == 204
                await asyncio.sleep(0.05)

    async def cleanup_loop(tasks: list) -> None:
        while time.monotonic() < stop_at:
            task_id = await asyncio.to_thread(dispatch, cluster.database_url, "cleanup", {"grace_seconds": 0})
            tasks.append(await asyncio.to_thread(wait_task, cluster.database_url, task_id, "completed", 60))

    async def scenario() -> tuple[dict, list]:
        counts = {"ok": 0, "uploads": 0}
        tasks: list = []
        await asyncio.gather(
            *(download_loop(g.url, counts) for g in gateways),
            # Two uploaders per content: concurrent uploads of the same bytes.
            *(churn_loop(content, counts) for content in churn for _ in range(2)),
            cleanup_loop(tasks),
        )
        return counts, tasks

    counts, tasks = asyncio.run(scenario())
    assert counts["ok"] > 20 and counts["uploads"] > 10, counts
    assert len(tasks) >= 3, len(tasks)
    # Every artifact still in the catalog has its file, with the right bytes.
    rows = db_fetch(cluster.database_url, "SELECT DISTINCT sha256 FROM arkvory_artifacts")
    for row in rows:
        path = blob_path(cluster.data_dir, row["sha256"])
        assert path.is_file(), f"referenced blob {row['sha256']} was deleted"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == row["sha256"]
    # The garbage is gone, rows and files, and was counted.
    left = db_fetch(cluster.database_url, "SELECT sha256 FROM arkvory_blobs WHERE sha256 = ANY($1::text[])", list(garbage))
    assert left == []
    assert not any(blob_path(cluster.data_dir, sha256).exists() for sha256 in garbage)
    reclaimed = sum(t["result"]["reclaimed_bytes"] for t in tasks)
    assert reclaimed >= sum(garbage.values())
    metrics = worker.get("/health/metrics").text
    assert f"arkvory_cleanup_reclaimed_bytes_total {float(reclaimed)}" in metrics
    # Progress is visible as task events (the worker writes at most a few per second), and a
    # checkpoint after each step; the result counts each step.
    first = events(cluster.database_url, tasks[0]["id"])
    messages = [e["data"].get("message", "") for e in first if e["type"] == "task.progress"]
    assert messages and all(m.startswith(("expired", "abandoned", "finished", "unreferenced", "stray")) for m in messages)
    assert sum(e["type"] == "task.checkpoint" for e in first) == len(cleanup.STEP_NAMES)
    assert tasks[0]["result"]["steps"]["blobs"]["deleted"] >= len(garbage)


def test_grace_pins_strays_uploads_keys_and_retention(cluster):
    writer = cluster.writer().wait_ready()
    db = cluster.database_url
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201

        def made(content: bytes, *, drop: bool) -> dict:
            answer = client.post("/api/v1/repositories/r/artifacts", params={"name": "x"}, content=content).json()
            if drop:
                assert client.delete(f"/api/v1/repositories/r/artifacts/{answer['id']}").status_code == 204
            return answer

        kept = made(os.urandom(1000), drop=False)
        young = made(os.urandom(2000), drop=True)  # unreferenced, younger than the grace
        old = made(os.urandom(3000), drop=True)  # unreferenced, older than the grace
        pinned = made(os.urandom(4000), drop=True)  # unreferenced and old, but being read
        session = client.post(
            "/api/v1/repositories/r/uploads", json={"name": "s", "size": 10}, headers={"Idempotency-Key": "k1"}
        )
        assert session.status_code == 201, session.text
    hour_ago = "now() - interval '2 hours'"
    db_execute(db, f"UPDATE arkvory_blobs SET created_at = {hour_ago} WHERE sha256 = ANY($1::text[])",
                    [kept["sha256"], old["sha256"], pinned["sha256"]])
    db_execute(db, "INSERT INTO arkvory_read_pins (slot, sha256, pinned_until) VALUES (5, $1, now() + interval '1 minute')",
                    pinned["sha256"])
    db_execute(db, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second' WHERE id = $1",
                    uuid.UUID(session.json()["id"]))
    db_execute(db, "UPDATE arkvory_idempotency_keys SET expires_at = now() - interval '1 second'")
    # Strays: files without a row, one old, one fresh; and a file that is not a blob at all.
    stray_old, stray_new = os.urandom(5000), os.urandom(6000)
    paths = {}
    for name, content in (("old", stray_old), ("new", stray_new)):
        sha256 = hashlib.sha256(content).hexdigest()
        paths[name] = blob_path(cluster.data_dir, sha256)
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        paths[name].write_bytes(content)
    two_hours_ago = time.time() - 7200
    os.utime(paths["old"], (two_hours_ago, two_hours_ago))
    foreign = cluster.data_dir / "blobs" / "sha256" / "ab" / "notes.txt"
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_text("not a blob")
    os.utime(foreign, (two_hours_ago, two_hours_ago))
    # Tasks: one finished long ago (pruned), one queued as long ago (never pruned).
    finished = dispatch(db, "cleanup", {})
    queued = dispatch(db, "cleanup", {})
    db_execute(db, "UPDATE arkvory_tasks SET status = 'completed', finished_at = now() - interval '30 days' WHERE id = $1", finished)
    db_execute(db, "UPDATE arkvory_tasks SET created_at = now() - interval '30 days' WHERE id = $1", queued)

    result, lines = asyncio.run(run_cleanup(cluster, {"grace_seconds": 3600}))

    def exists(sha256: str) -> bool:
        return bool(db_fetch(db, "SELECT 1 FROM arkvory_blobs WHERE sha256 = $1", sha256))

    assert exists(kept["sha256"]) and blob_path(cluster.data_dir, kept["sha256"]).is_file()
    assert exists(young["sha256"]) and blob_path(cluster.data_dir, young["sha256"]).is_file()
    assert exists(pinned["sha256"]) and blob_path(cluster.data_dir, pinned["sha256"]).is_file()
    assert not exists(old["sha256"]) and not blob_path(cluster.data_dir, old["sha256"]).exists()
    assert not paths["old"].exists() and paths["new"].is_file() and foreign.is_file()
    assert result["deleted_blobs"] == 2
    assert result["reclaimed_bytes"] == 3000 + 5000
    steps = result["steps"]
    assert steps["upload_sessions"]["sessions"] == 1 and steps["idempotency_keys"]["deleted"] >= 1
    assert steps["tasks"]["pruned"] == 1
    assert not db_fetch(db, "SELECT 1 FROM arkvory_uploads")
    assert not db_fetch(db, "SELECT 1 FROM arkvory_tasks WHERE id = $1", finished)
    assert db_fetch(db, "SELECT status FROM arkvory_tasks WHERE id = $1", queued)[0]["status"] == "queued"
    assert "unreferenced blobs: 1 deleted, 3000 bytes reclaimed" in lines
    assert "stray blob files: 1 deleted, 5000 bytes reclaimed" in lines
    # The pin expires: the next run takes that blob too.
    db_execute(db, "UPDATE arkvory_read_pins SET pinned_until = now() - interval '1 second'")
    result, _ = asyncio.run(run_cleanup(cluster, {"grace_seconds": 3600}))
    assert result["deleted_blobs"] == 1 and not exists(pinned["sha256"])


def test_expired_credentials_of_an_idle_account_are_deleted_and_live_ones_kept(cluster):
    """An account that makes no more tokens and logs in no more keeps its expired rows until a
    cleanup takes them (writer/identity/tokens.py forgets them only at the account's next token)."""
    from .test_accounts import PASSWORD, make_account, session_of

    writer = cluster.writer().wait_ready()
    db = cluster.database_url
    make_account(writer, "idle")
    session = session_of(writer, "idle")
    with writer.client(session) as client:
        # With the password: made through the session without it, they would end with it.
        made = [client.post("/api/v1/tokens", json={"access": "read", "label": f"t{n}", "password": PASSWORD})
                for n in range(3)]
    assert [m.status_code for m in made] == [201] * 3
    live, expired = made[0].json(), [m.json()["id"] for m in made[1:]]
    db_execute(db, "UPDATE arkvory_credentials SET expires_at = now() - interval '1 second'"
                   " WHERE id = ANY($1::uuid[]) OR kind = 'session'", expired)
    result, lines = asyncio.run(run_cleanup(cluster, {}))
    assert result["steps"]["credentials"] == {"deleted": 3}  # two tokens and the session
    assert "expired credentials: 3 deleted" in lines
    left = db_fetch(db, "SELECT id::text AS id FROM arkvory_credentials WHERE account_id IS NOT NULL")
    assert [r["id"] for r in left] == [live["id"]]
    with writer.client(live["token"]) as client:
        assert client.get("/api/v1/repositories").status_code == 200  # the live token still works
    again, _ = asyncio.run(run_cleanup(cluster, {}))
    assert again["steps"]["credentials"] == {"deleted": 0}


@pytest.mark.parametrize(
    "params",
    [[], {"grace_seconds": -1}, {"grace_seconds": "60"}, {"grace_seconds": True}, {"other": 1},
     {"grace_seconds": 10**12}],
)
def test_bad_params_are_invalid_input(params):
    from arkvory.shared.errors import InvalidInput

    with pytest.raises(InvalidInput):
        cleanup.validate_params(params)


def test_params_default_and_override():
    assert cleanup.validate_params(None) == {}
    assert cleanup.validate_params({"grace_seconds": 0}) == {"grace_seconds": 0}


def test_cleanup_finishes_the_removals_earlier_runs_left(cluster):
    """What a crash or a failing store left between a removal's mark and its settling: the
    next cleanup deletes those blobs (again) and settles them first thing; a quarantine whose
    verify ended without settling it is settled (uploads of those bytes need not wait for the
    next verify); settled marks older than a day go."""
    from arkvory.writer.blobs.locks import SETTLED_KEPT_S

    cluster.writer().wait_ready()
    url = cluster.database_url
    left = hashlib.sha256(b"left pending").hexdigest()
    path = blob_path(cluster.data_dir, left)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left pending")  # its row went with the mark; the file did not
    quarantined, running_verify = hashlib.sha256(b"q").hexdigest(), hashlib.sha256(b"r").hexdigest()
    verify_task = uuid.uuid4()
    db_execute(
        url,
        "INSERT INTO arkvory_tasks (id, kind, params, on_restart, definition_hash, budget, status, last_event)"
        " VALUES ($1, 'verify', '{}', 'resume', repeat('0', 64), '{}', 'running', 1)",
        verify_task,
    )
    db_execute(
        url,
        "INSERT INTO arkvory_blob_removals (sha256, reason, task_id, settled_at) VALUES"
        " ($1, 'unreferenced', NULL, NULL), ($2, 'quarantine', gen_random_uuid(), NULL),"
        " ($3, 'quarantine', $4, NULL), (repeat('a', 64), 'stray', NULL, now() - make_interval(secs => $5 + 60)),"
        " (repeat('b', 64), 'stray', NULL, now())",
        left, quarantined, running_verify, verify_task, float(SETTLED_KEPT_S),
    )
    result, _ = asyncio.run(run_cleanup(cluster, {"grace_seconds": 0}))
    assert not path.exists()
    marks = {r["sha256"]: r["settled"] for r in db_fetch(url, "SELECT sha256, settled_at IS NOT NULL AS settled FROM arkvory_blob_removals")}
    # The running verify's quarantine is its own to settle.
    assert marks == {left: True, quarantined: True, running_verify: False, "b" * 64: True}, marks
