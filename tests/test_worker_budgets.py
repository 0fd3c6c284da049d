"""Task budgets in a real worker (SPEC §7): each limit trips on the very step that exceeds it, the
task ends `failed` with `budget_exceeded` at once, and it is never run again, not even by the
restart recovery of the next worker (the policy here is `retry`, the one that would re-run it).

The `steps` kind (tests/worker_kinds.py) records each step before reporting it, then reports
progress (one transition) and checkpoints (another), so the step that trips is the last
recorded one. The real kinds ask before each step instead: `verify` never reads the blob that
would trip, `cleanup` never removes the blob that would.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time

import pytest

from arkvory.shared.storage import Storage

from .harness import db_execute, db_fetch
from .worker_harness import dispatch, events, start_worker, steps_done, task, wait_task

pytestmark = pytest.mark.timeout(120)


def _state_bytes(step: int, growth: int) -> int:
    state = {"next": step + 1, "pad": "x" * (growth * step)}
    return len(json.dumps(state, separators=(",", ":"), sort_keys=True))


# name: (params, budget, steps recorded when it trips, usage counter, used when it trips)
CASES = {
    "max_items": ({"steps": 10, "items": 1}, {"max_items": 3}, 4, "items", 4),
    "max_bytes": ({"steps": 10, "bytes": 300}, {"max_bytes": 1000}, 4, "bytes", 1200),
    # Two transitions a step (progress, checkpoint): the 6th is step 2's checkpoint.
    "max_transitions": ({"steps": 10}, {"max_transitions": 5}, 3, "transitions", 6),
    "max_cost_units": ({"steps": 10, "cost_units": 4}, {"max_cost_units": 10}, 3, "cost_units", 12),
    # The checkpoint grows 50 bytes a step: step 4's is the first over 200 bytes.
    "max_state_bytes": ({"steps": 10, "pad_growth": 50}, {"max_state_bytes": 200}, 5, "state_bytes", _state_bytes(4, 50)),
}


@pytest.fixture
def writer(cluster):
    # No scheduled cleanup: the tests decide which tasks the worker sees.
    return cluster.writer(ARKVORY_CLEANUP_INTERVAL="off").wait_ready()


def test_each_budget_trips_at_the_right_moment_and_is_never_retried(cluster, writer):
    url = cluster.database_url
    worker = start_worker(cluster).wait_active()
    dispatched = {
        name: dispatch(url, "steps" if n % 2 else "steps_b", params, on_restart="retry", budget=budget)
        for n, (name, (params, budget, _, _, _)) in enumerate(CASES.items())
    }
    # Exactly at a limit is within it.
    at_limit = dispatch(url, "steps", {"steps": 3}, on_restart="retry", budget={"max_items": 3, "max_transitions": 6})
    ended = {}
    for name, task_id in dispatched.items():
        params, budget, tripped_at, counter, used = CASES[name]
        failed = wait_task(url, task_id, ("failed", "completed"))
        ended[name] = failed
        assert failed["status"] == "failed", name
        assert failed["error_code"] == "budget_exceeded", (name, failed["error_message"])
        allowed = budget[name]
        assert failed["error_message"] == f"{name} exceeded: {used} > {allowed}"
        assert failed["usage"][counter] == used, (name, failed["usage"])
        assert steps_done(url, task_id) == list(range(tripped_at)), name
        last = events(url, task_id)[-1]
        assert last["type"] == "task.failed" and last["data"]["error_code"] == "budget_exceeded"
        if name == "max_state_bytes":
            # The checkpoint over the limit was never saved: the last good one stays.
            assert failed["checkpoint"]["next"] == tripped_at - 1
    assert wait_task(url, at_limit, ("completed", "failed"))["status"] == "completed"
    assert 'outcome="budget_exceeded"} ' in worker.get("/health/metrics").text

    # A restart (kill -9, a new worker) applies the restart table to unfinished tasks only.
    worker.kill()
    start_worker(cluster, "next").wait_active()
    time.sleep(2)
    for name, task_id in dispatched.items():
        again = task(url, task_id)
        assert again["status"] == "failed" and again["last_event"] == ended[name]["last_event"], name
        assert again["attempts"] == 1
    assert len(steps_done(url, dispatched["max_items"])) == 4


def _hashed_bytes(worker) -> float:
    for line in worker.get("/health/metrics").text.splitlines():
        if line.startswith("arkvory_verify_hashed_bytes_total "):
            return float(line.split()[1])
    raise AssertionError("no arkvory_verify_hashed_bytes_total on the worker")


def test_verify_never_reads_a_blob_its_budget_does_not_cover(cluster, writer):
    """verify knows each blob's size before reading it, so it asks first (writer/tasks/budgets.py):
    the blob that would exceed a limit is never read, the usage stays within the limits, and the
    error names what that blob would have made it."""
    url = cluster.database_url
    worker = start_worker(cluster, real=True).wait_active()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for i in range(10):
            answer = admin.post("/api/v1/repositories/r/artifacts", params={"name": f"{i}.bin"}, content=os.urandom(1000))
            assert answer.status_code == 201, answer.text
    hashed = _hashed_bytes(worker)
    assert hashed == 0
    # (budget, error message): 3 blobs fit each budget, the 4th would exceed it.
    for budget, message in (
        ({"max_items": 3}, "max_items exceeded: 4 > 3"),
        ({"max_bytes": 3500}, "max_bytes exceeded: 4000 > 3500"),
        # A blob of 1000 bytes costs 2 units: opening it, and the MiB started.
        ({"max_cost_units": 7}, "max_cost_units exceeded: 8 > 7"),
    ):
        task_id = dispatch(url, "verify", {"bytes_per_second": 0}, on_restart="retry", budget=budget)
        failed = wait_task(url, task_id, ("failed", "completed"))
        assert failed["status"] == "failed" and failed["error_code"] == "budget_exceeded", failed
        assert failed["error_message"] == message
        assert failed["usage"]["items"] == 3 and failed["usage"]["bytes"] == 3000, failed["usage"]
        assert failed["usage"]["cost_units"] == 6, failed["usage"]
        assert _hashed_bytes(worker) - hashed == 3000, "only the blobs within the budget were read"
        hashed = _hashed_bytes(worker)
        assert failed["attempts"] == 1
        assert events(url, task_id)[-1]["type"] == "task.failed"
    # Exactly at both limits is within them.
    at_limit = dispatch(url, "verify", {"bytes_per_second": 0}, on_restart="retry", budget={"max_items": 10, "max_bytes": 10_000})
    done = wait_task(url, at_limit, ("failed", "completed"))
    assert done["status"] == "completed", done
    assert done["usage"]["items"] == 10 and done["usage"]["bytes"] == 10_000 and done["usage"]["cost_units"] == 20
    assert _hashed_bytes(worker) - hashed == 10_000
    # Not retried by the next worker either.
    worker.kill()
    start_worker(cluster, "next", real=True).wait_active()
    time.sleep(2)
    assert task(url, task_id)["status"] == "failed" and task(url, task_id)["attempts"] == 1


def test_cleanup_never_removes_a_blob_its_budget_does_not_cover(cluster, writer):
    """Checked before each batch, cut to what is left: 20 unreferenced blobs, budgets that
    cover 3 of them, and exactly 3 go each time (they went in a batch of 20 before)."""
    url = cluster.database_url
    start_worker(cluster, real=True).wait_active()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for i in range(20):
            made = admin.post("/api/v1/repositories/r/artifacts", params={"name": f"{i}.bin"}, content=os.urandom(1000))
            assert made.status_code == 201, made.text
            assert admin.delete(f"/api/v1/repositories/r/artifacts/{made.json()['id']}").status_code == 204

    def blobs_left() -> int:
        return len(db_fetch(url, "SELECT sha256 FROM arkvory_blobs"))

    # (budget, error message): 3 blobs fit each budget, the 4th would exceed it. An
    # unreferenced blob costs 2 units (its row and its file).
    left = 20
    for budget, message in (
        ({"max_items": 3}, "max_items exceeded: 4 > 3"),
        ({"max_bytes": 3500}, "max_bytes exceeded: 4000 > 3500"),
        ({"max_cost_units": 7}, "max_cost_units exceeded: 8 > 7"),
    ):
        task_id = dispatch(url, "cleanup", {"grace_seconds": 0}, on_restart="retry", budget=budget)
        failed = wait_task(url, task_id, ("failed", "completed"))
        assert (failed["status"], failed["error_code"]) == ("failed", "budget_exceeded"), failed
        assert failed["error_message"] == message
        assert (failed["usage"]["items"], failed["usage"]["bytes"], failed["usage"]["cost_units"]) == (3, 3000, 6)
        left -= 3
        assert blobs_left() == left
    # Exactly what is left: within the budget, completed.
    at_limit = dispatch(url, "cleanup", {"grace_seconds": 0}, on_restart="retry", budget={"max_items": left})
    done = wait_task(url, at_limit, ("failed", "completed"))
    assert done["status"] == "completed", done
    assert done["result"]["deleted_blobs"] == left and done["usage"]["items"] == left
    assert blobs_left() == 0


def test_each_cleanup_step_stops_before_its_budget(cluster, writer):
    """Expired keys, finished tasks past retention and stray files: each step's batch is cut
    to what the budget has left, and work left over fails the task before it is done."""
    url = cluster.database_url
    start_worker(cluster, real=True).wait_active()
    with writer.client() as admin:
        for i in range(5):
            made = admin.post("/api/v1/repositories", json={"name": f"k{i}"}, headers={"Idempotency-Key": f"key-{i}"})
            assert made.status_code == 201, made.text
    db_execute(url, "UPDATE arkvory_idempotency_keys SET expires_at = now() - interval '1 second'")
    old_tasks = [dispatch(url, "verify") for _ in range(5)]
    db_execute(url, "UPDATE arkvory_tasks SET status = 'completed', finished_at = now() - interval '30 days'"
                    " WHERE id = ANY($1::uuid[])", old_tasks)
    strays = []
    for _ in range(3):
        content = os.urandom(5000)
        sha256 = hashlib.sha256(content).hexdigest()
        path = cluster.data_dir / "blobs" / "sha256" / sha256[:2] / sha256[2:4] / sha256
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, (time.time() - 7200, time.time() - 7200))
        strays.append(path)

    def cleanup_with(budget: dict) -> dict:
        task_id = dispatch(url, "cleanup", {"grace_seconds": 0}, on_restart="retry", budget=budget)
        return wait_task(url, task_id, ("failed", "completed"))

    def count(sql: str) -> int:
        return len(db_fetch(url, sql))

    # Keys first: 3 of 5 fit.
    failed = cleanup_with({"max_items": 3})
    assert failed["error_message"] == "max_items exceeded: 4 > 3" and failed["usage"]["items"] == 3
    assert count("SELECT 1 FROM arkvory_idempotency_keys") == 2
    # The 2 keys left, then 2 of the 5 old tasks.
    failed = cleanup_with({"max_items": 4})
    assert failed["error_message"] == "max_items exceeded: 5 > 4" and failed["usage"]["items"] == 4
    assert count("SELECT 1 FROM arkvory_idempotency_keys") == 0
    assert count("SELECT 1 FROM arkvory_tasks WHERE finished_at < now() - interval '1 day'") == 3
    # The 3 old tasks (a unit each), then 2 of the 3 strays (a unit each).
    failed = cleanup_with({"max_cost_units": 5})
    assert failed["error_message"] == "max_cost_units exceeded: 6 > 5" and failed["usage"]["cost_units"] == 5
    assert count("SELECT 1 FROM arkvory_tasks WHERE finished_at < now() - interval '1 day'") == 0
    assert sum(path.exists() for path in strays) == 1
    # The last stray is larger than the bytes left.
    failed = cleanup_with({"max_bytes": 4999})
    assert failed["error_message"] == "max_bytes exceeded: 5000 > 4999" and failed["usage"]["bytes"] == 0
    assert sum(path.exists() for path in strays) == 1
    done = cleanup_with({"max_bytes": 5000})
    assert done["status"] == "completed" and done["usage"]["bytes"] == 5000, done
    assert not any(path.exists() for path in strays)


def test_the_abandoned_upload_sweep_stops_before_its_budget(cluster, writer):
    """Expired upload sessions and stale temp files are removed one budget unit at a time like
    every other step: an abandoned upload is an item and 2 cost units (its row and its file)."""
    url = cluster.database_url
    start_worker(cluster, real=True).wait_active()
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for i in range(5):
            made = admin.post(
                "/api/v1/repositories/r/uploads", json={"name": f"{i}.bin", "size": 1000},
                headers={"Idempotency-Key": f"upload-{i}"},
            )
            assert made.status_code == 201, made.text
    db_execute(url, "UPDATE arkvory_uploads SET expires_at = now() - interval '1 second'")
    temp_files = []
    for i in range(2):
        path = cluster.data_dir / "tmp" / f"upload-abandoned-{i}"
        path.write_bytes(b"x" * 100)
        os.utime(path, (time.time() - 7200, time.time() - 7200))
        temp_files.append(path)

    def cleanup_with(budget: dict) -> dict:
        task_id = dispatch(url, "cleanup", {"grace_seconds": 0}, on_restart="retry", budget=budget)
        return wait_task(url, task_id, ("failed", "completed"))

    def sessions_left() -> int:
        return len(db_fetch(url, "SELECT id FROM arkvory_uploads"))

    failed = cleanup_with({"max_items": 3})
    assert failed["error_message"] == "max_items exceeded: 4 > 3", failed
    assert (failed["usage"]["items"], failed["usage"]["cost_units"]) == (3, 6)
    assert sessions_left() == 2 and all(path.exists() for path in temp_files)
    failed = cleanup_with({"max_cost_units": 7})  # 3 uploads fit, the 4th would make 8
    assert failed["error_message"] == "max_cost_units exceeded: 8 > 7", failed
    assert sessions_left() == 0 and sum(path.exists() for path in temp_files) == 1
    done = cleanup_with({"max_items": 1})
    assert done["status"] == "completed" and done["usage"]["items"] == 1, done
    assert not any(path.exists() for path in temp_files)


# -- a crash buys no budget ---------------------------------------------------------------------


def _unreferenced_blobs(writer, count: int, size: int = 1000) -> list[str]:
    """`count` blobs no artifact references any more (rows and files stay for cleanup)."""
    digests = []
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for i in range(count):
            made = admin.post("/api/v1/repositories/r/artifacts", params={"name": f"{i}.bin"}, content=os.urandom(size))
            assert made.status_code == 201, made.text
            assert admin.delete(f"/api/v1/repositories/r/artifacts/{made.json()['id']}").status_code == 204
            digests.append(made.json()["sha256"])
    return digests


@pytest.mark.parametrize(
    "killed_at",
    [
        # Right after a batch of removals committed (and, with it, its usage).
        "arkvory.writer.maintenance.cleanup:remove_unreferenced:after:1",
        # Between that commit and the storage's deletes: the retry finishes the removals.
        "arkvory.writer.maintenance.cleanup:remove_marked:before:1",
    ],
    ids=["after-the-batch", "before-the-store-deletes"],
)
def test_a_cleanup_killed_after_a_batch_keeps_its_usage_and_the_retry_stays_within_the_budget(cluster, writer, killed_at):
    """SIGKILL right after cleanup's first batch of unreferenced blobs committed: the usage on
    record is exactly what was removed (it commits with the batch), and the retry, which goes
    on from that usage, removes nothing more than `max_items` allows in total. (The usage was
    written only by a later progress event, checkpoint or heartbeat: the kill lost it, and the
    retry removed another `max_items`.)"""
    url = cluster.database_url
    digests = _unreferenced_blobs(writer, 20)
    worker = start_worker(cluster, "killed", TEST_WORKER_KILL_AT=killed_at).wait_active()
    task_id = dispatch(url, "cleanup", {"grace_seconds": 0}, on_restart="retry", budget={"max_items": 12})
    assert worker.wait_exit(60) == -signal.SIGKILL, worker.stderr

    def rows_left() -> set[str]:
        return {r["sha256"] for r in db_fetch(url, "SELECT sha256 FROM arkvory_blobs")}

    removed = set(digests) - rows_left()
    recorded = task(url, task_id)
    assert recorded["status"] == "running" and len(removed) == 12, (recorded, len(removed))
    assert recorded["usage"]["items"] == 12, recorded["usage"]
    assert recorded["usage"]["cost_units"] == 12 * 2 and recorded["usage"]["bytes"] == 12 * 1000

    start_worker(cluster, "next").wait_active()
    ended = wait_task(url, task_id, ("failed", "completed"), timeout=60)
    assert (ended["status"], ended["error_code"]) == ("failed", "budget_exceeded"), ended
    assert ended["attempts"] == 2 and ended["usage"]["items"] == 12, ended
    assert set(digests) - rows_left() == removed, "the retry removed more than the budget allows"
    storage = Storage(cluster.data_dir)
    assert not any(os.path.exists(storage.blob_file(d)) for d in removed), "a removed blob's file stayed"
    assert all(os.path.exists(storage.blob_file(d)) for d in set(digests) - removed)
    assert not db_fetch(url, "SELECT id FROM arkvory_blob_removals WHERE settled_at IS NULL")


def test_a_verify_killed_while_reading_keeps_its_usage_and_the_retry_stays_within_the_budget(cluster, writer, tmp_path):
    """SIGKILL right after verify read a group of blobs, before it reported them: the group's
    cost was on record before it was read, so the retry (which starts over) reads nothing the
    budget does not cover: in all, the two runs read `max_items` blobs. (Unreserved, the kill
    lost the usage and the retry read another `max_items`.)"""
    url = cluster.database_url
    with writer.client() as admin:
        assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for i in range(10):
            answer = admin.post("/api/v1/repositories/r/artifacts", params={"name": f"{i}.bin"}, content=os.urandom(1000))
            assert answer.status_code == 201, answer.text
    reads = tmp_path / "reads"
    hooks = {"TEST_WORKER_CALLS_LOG": f"arkvory.writer.maintenance.verify:check_whole={reads}"}
    worker = start_worker(
        cluster, "killed", TEST_WORKER_KILL_AT="arkvory.writer.maintenance.verify:check_whole:after:1", **hooks
    ).wait_active()
    task_id = dispatch(url, "verify", {"bytes_per_second": 0}, on_restart="retry", budget={"max_items": 6})
    assert worker.wait_exit(60) == -signal.SIGKILL, worker.stderr
    recorded = task(url, task_id)
    first_run = sum(int(n) for n in reads.read_text().split())
    assert recorded["status"] == "running" and first_run == 6, (recorded, first_run)
    # On record before the read; only the limited counter must be (the others are news).
    assert recorded["usage"].get("items", 0) == first_run, recorded["usage"]

    start_worker(cluster, "next", **hooks).wait_active()
    ended = wait_task(url, task_id, ("failed", "completed"), timeout=60)
    assert (ended["status"], ended["error_code"]) == ("failed", "budget_exceeded"), ended
    assert ended["attempts"] == 2 and ended["usage"]["items"] <= 6, ended
    read_in_all = sum(int(n) for n in reads.read_text().split())
    assert read_in_all == 6, f"the two runs read {read_in_all} blobs with max_items 6"
