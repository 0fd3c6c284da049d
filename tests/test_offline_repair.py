"""`arkvory admin gc` (writer/worker/offline.py, commands.py): refuses with exit 75 while a
gateway, the writer or the worker is up and names each; with everything stopped it runs the
cleanup kind, prints progress lines and a JSON result, and exits 0.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from arkvory.shared import db

from .harness import db_fetch, run_arkvory
from .worker_harness import start_worker

pytestmark = pytest.mark.timeout(180)


def blob_path(data_dir: pathlib.Path, sha256: str) -> pathlib.Path:
    return data_dir / "blobs" / "sha256" / sha256[:2] / sha256[2:4] / sha256


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_gc_refuses_while_servers_are_up_and_names_them_then_runs_when_all_are_down(cluster):
    shared = cluster.shared_env(slots=3)
    writer = cluster.writer(shared).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        kept = client.post("/api/v1/repositories/r/artifacts", params={"name": "k"}, content=b"kept" * 100).json()
        gone = client.post("/api/v1/repositories/r/artifacts", params={"name": "g"}, content=b"gone" * 100).json()
        assert client.delete(f"/api/v1/repositories/r/artifacts/{gone['id']}").status_code == 204
    gateway = cluster.gateway(2, shared).wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    env = cluster.base_env()

    refused = run_arkvory(env, "admin", "gc", "--grace", "0")
    assert refused.returncode == 75, refused.stderr
    assert f"gateway slot 2 (pid {gateway.proc.pid} " in refused.stderr
    assert "holds the maintenance lock" in refused.stderr
    assert f"the writer slot 0 (pid {writer.proc.pid} " in refused.stderr
    assert "holds the writer lock" in refused.stderr
    assert "holds the worker lock" in refused.stderr
    assert blob_path(cluster.data_dir, gone["sha256"]).is_file()  # nothing was done

    worker.kill()
    writer.kill()
    refused = run_arkvory(env, "admin", "gc", "--grace", "0")
    assert refused.returncode == 75 and "gateway slot 2" in refused.stderr
    assert "writer lock" not in refused.stderr and "worker lock" not in refused.stderr

    gateway.kill()
    done = run_arkvory(env, "admin", "gc", "--grace", "0")
    assert done.returncode == 0, done.stderr
    assert "cleanup: unreferenced blobs: 1 deleted" in done.stdout
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kind"] == "cleanup" and result["result"]["deleted_blobs"] == 1
    assert not blob_path(cluster.data_dir, gone["sha256"]).exists()
    assert blob_path(cluster.data_dir, kept["sha256"]).is_file()
    assert not db_fetch(cluster.database_url, "SELECT 1 FROM arkvory_blobs WHERE sha256 = $1", gone["sha256"])
    # The locks went with the tool: a writer starts again.
    cluster.writer(shared).wait_ready()


def test_gc_names_an_unknown_holder_of_the_worker_lock(cluster):
    writer = cluster.writer().wait_ready()
    writer.kill()
    import asyncio

    import asyncpg

    async def scenario() -> str:
        holder = await asyncpg.connect(cluster.database_url, server_settings={"application_name": "some-old-worker"})
        try:
            assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", db.WORKER_LOCK)
            backend = await holder.fetchval("SELECT pg_backend_pid()")
            refused = await asyncio.to_thread(run_arkvory, cluster.base_env(), "admin", "gc")
            assert refused.returncode == 75, refused.stderr
            assert f"the worker (some-old-worker, database backend pid {backend}" in refused.stderr
            return refused.stderr
        finally:
            await holder.close()

    asyncio.run(scenario())
    assert run_arkvory(cluster.base_env(), "admin", "gc").returncode == 0


def test_gc_names_a_worker_waiting_in_standby(cluster):
    """A standby worker holds no lock, only its named connection: once the tool let the worker
    lock go it would become active with the settings it started with (for migrate-storage, the
    old storage). The offline tools refuse it too, naming it beside the lock's holder."""
    cluster.writer().wait_ready().kill()
    import asyncio

    import asyncpg

    async def scenario() -> None:
        holder = await asyncpg.connect(cluster.database_url, server_settings={"application_name": "some-old-worker"})
        try:
            assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", db.WORKER_LOCK)
            standby = await asyncio.to_thread(lambda: start_worker(cluster, real=True).wait_status("standby"))
            refused = await asyncio.to_thread(run_arkvory, cluster.base_env(), "admin", "gc")
            assert refused.returncode == 75, refused.stderr
            assert "the worker (some-old-worker, " in refused.stderr
            assert f"a worker in standby (arkvory-worker {os.uname().nodename}"[:60] in refused.stderr
            assert f" pid {standby.proc.pid}, database backend pid " in refused.stderr
            assert "would take over when this tool ends" in refused.stderr
            assert refused.stderr.count("in standby") == 1, refused.stderr  # the holder is named once
            return standby
        finally:
            await holder.close()

    standby = asyncio.run(scenario())
    # With the other holder gone the standby worker becomes the active one: still refused.
    standby.wait_active()
    refused = run_arkvory(cluster.base_env(), "admin", "gc")
    assert refused.returncode == 75 and "holds the worker lock" in refused.stderr


def test_gc_bad_params_exit_2(cluster):
    env = cluster.base_env()
    assert run_arkvory(env, "admin", "gc", "--params", "{nope").returncode == 2
    bad = run_arkvory(env, "admin", "gc", "--params", '{"grace_seconds": -5}')
    assert bad.returncode == 2 and "grace_seconds" in bad.stderr
    missing = {k: v for k, v in env.items() if k != "ARKVORY_DATA_DIR"}
    unset = run_arkvory(missing, "admin", "gc")
    assert unset.returncode == 2 and "ARKVORY_DATA_DIR" in unset.stderr


def test_gc_refuses_a_storage_directory_of_another_installation(cluster, tmp_path):
    cluster.writer().wait_ready().kill()
    other = tmp_path / "other"
    other.mkdir()
    (other / "arkvory-storage-id").write_text("00000000-0000-0000-0000-000000000000\n")
    answer = run_arkvory(cluster.base_env(ARKVORY_DATA_DIR=str(other)), "admin", "gc")
    assert answer.returncode == 78 and "mismatch" in answer.stderr
    assert os.listdir(other) == ["arkvory-storage-id"]
