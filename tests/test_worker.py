"""`arkvory worker` as a real process against a real PostgreSQL: start-up refusals, running a task
from a notification to its end, cancellation, one active worker with a standby that takes over,
SIGTERM, a lost lock connection, and the health endpoints.

Tasks are made with the task store (tests/worker_harness.py) and run by the `steps` test kind
(tests/worker_kinds.py) unless the test is about a real kind.
"""

from __future__ import annotations

import re
import signal
import socket
import time

import httpx
import pytest

from arkvory.shared import db

from .harness import ADMIN_TOKEN, READER_TOKEN, db_execute, run_arkvory
from .worker_harness import (
    dispatch,
    event_types,
    events,
    lock_backend,
    open_gate,
    start_worker,
    steps_done,
    task,
    terminate_backend,
    wait_checkpoint,
    wait_for,
    wait_held,
    wait_task,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def writer(cluster):
    """The writer migrates the schema and creates the storage the worker checks."""
    # No scheduled cleanup: the tests decide which tasks the worker sees.
    return cluster.writer(ARKVORY_CLEANUP_INTERVAL="off").wait_ready()


# -- start-up ----------------------------------------------------------------------------------


def test_a_bad_setting_exits_2_naming_the_variable(cluster):
    result = run_arkvory(cluster.base_env(ARKVORY_WORKER_PORT="http"), "worker")
    assert result.returncode == 2
    assert "ARKVORY_WORKER_PORT" in result.stderr and "'http'" in result.stderr


def test_the_shared_download_variables_are_not_the_workers(cluster, writer):
    # common.env carries the slot count and rates but no slot (a serve process would refuse
    # that): they, the role and the API port are not the worker's, so it does not mind.
    start_worker(
        cluster,
        ARKVORY_GATEWAY_SLOTS="3",
        ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND="1000000000",
        ARKVORY_ROLE="reader",
        ARKVORY_PORT="not-a-port",
    ).wait_active()


def test_without_the_writers_schema_it_refuses_with_78(cluster):
    result = run_arkvory(cluster.base_env(ARKVORY_WORKER_PORT="1"), "worker")
    assert result.returncode == 78, result.stderr
    assert "start the writer first" in result.stderr


@pytest.mark.parametrize(
    "change, says",
    [
        ("INSERT INTO arkvory_schema_version (version, name) VALUES (99, 'future')", "newer than this worker's"),
        (f"DELETE FROM arkvory_schema_version WHERE version = {db.CODE_SCHEMA_VERSION}", "older than this worker's"),
    ],
)
def test_a_schema_other_than_the_codes_is_refused_with_78(cluster, writer, change, says):
    db_execute(cluster.database_url, change)
    result = run_arkvory(cluster.base_env(ARKVORY_WORKER_PORT="1"), "worker")
    assert result.returncode == 78, result.stderr
    assert says in result.stderr


def test_missing_storage_is_refused_with_78(cluster, writer, tmp_path):
    result = run_arkvory(cluster.base_env(ARKVORY_DATA_DIR=str(tmp_path / "nowhere")), "worker")
    assert result.returncode == 78, result.stderr
    assert "does not exist" in result.stderr and "the worker never creates storage" in result.stderr


def test_a_health_port_in_use_is_one_line_and_exit_1(cluster, writer):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_arkvory(cluster.base_env(ARKVORY_WORKER_PORT=str(port)), "worker")
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port} (ARKVORY_HOST, ARKVORY_WORKER_PORT)" in result.stderr
    assert "Traceback" not in result.stderr


# -- running tasks ---------------------------------------------------------------------------


def test_a_dispatched_task_runs_to_completion_with_its_events(cluster, writer):
    worker = start_worker(cluster).wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 3, "bytes": 10, "cost_units": 2})
    done = wait_task(cluster.database_url, task_id, "completed")
    assert done["result"] == {"steps": 3, "first": 0}
    assert done["usage"] == {"items": 3, "bytes": 30, "cost_units": 6, "transitions": 6, "state_bytes": done["usage"]["state_bytes"]}
    assert done["attempts"] == 1 and done["started_at"] is not None and done["finished_at"] is not None
    types = event_types(cluster.database_url, task_id)
    assert types[:3] == ["task.queued", "task.loading", "task.running"]
    assert types[-1] == "task.completed"
    assert types.count("task.checkpoint") == 3
    seqs = [e["seq"] for e in events(cluster.database_url, task_id)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert worker.status() == "active"


def test_a_task_is_claimed_on_its_notification_not_by_polling(cluster, writer):
    start_worker(cluster).wait_active()
    time.sleep(1)  # idle: the first poll is long past
    latencies = []
    for _ in range(3):
        task_id = dispatch(cluster.database_url, "steps", {"steps": 1})
        done = wait_task(cluster.database_url, task_id, "completed", timeout=10)
        queued, running = events(cluster.database_url, task_id)[0], events(cluster.database_url, task_id)[2]
        assert running["type"] == "task.running"
        latencies.append((running["created_at"] - queued["created_at"]).total_seconds())
        assert done["status"] == "completed"
    # The safety-net poll runs every 10 s: well under it means the notification woke the worker.
    assert max(latencies) < 5.0, latencies


def test_an_unexpected_error_fails_the_task_as_internal(cluster, writer):
    worker = start_worker(cluster).wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 3, "fail_at": 1})
    failed = wait_task(cluster.database_url, task_id, "failed")
    assert failed["error_code"] == "internal"
    assert "step 1 went wrong" in failed["error_message"]
    assert event_types(cluster.database_url, task_id)[-1] == "task.failed"
    wait_for(lambda: "step 1 went wrong" in worker.stderr and "Traceback" in worker.stderr, "logged")


def test_bad_params_fail_the_task_at_loading(cluster, writer):
    start_worker(cluster).wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"nonsense": 1})
    failed = wait_task(cluster.database_url, task_id, "failed")
    assert failed["error_code"] == "invalid_input"
    assert event_types(cluster.database_url, task_id) == ["task.queued", "task.loading", "task.failed"]


def test_two_kinds_run_at_once_but_never_two_of_one_kind(cluster, writer):
    start_worker(cluster).wait_active()
    slow = {"steps": 20, "step_seconds": 0.1}
    first = dispatch(cluster.database_url, "steps", slow)
    second = dispatch(cluster.database_url, "steps", slow)
    other = dispatch(cluster.database_url, "steps_b", slow)
    wait_task(cluster.database_url, first, "running")
    wait_task(cluster.database_url, other, "running")
    assert task(cluster.database_url, second)["status"] == "queued"
    wait_task(cluster.database_url, first, "completed")
    wait_task(cluster.database_url, second, "completed")
    first_done = task(cluster.database_url, first)["finished_at"]
    assert task(cluster.database_url, second)["started_at"] >= first_done


def test_a_cancel_stops_the_running_task_and_it_ends_cancelled(cluster, writer):
    start_worker(cluster).wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 200, "step_seconds": 0.05})
    wait_checkpoint(cluster.database_url, task_id, 2)
    asked = time.monotonic()
    with writer.client(ADMIN_TOKEN) as client:
        answer = client.post(f"/api/v1/tasks/{task_id}/cancel")
        assert answer.status_code == 202, answer.text
    cancelled = wait_task(cluster.database_url, task_id, "cancelled", timeout=10)
    assert time.monotonic() - asked < 5.0
    assert cancelled["result"] is None
    types = event_types(cluster.database_url, task_id)
    assert types[-2:] == ["task.cancelling", "task.cancelled"] and "task.completed" not in types
    done = len(steps_done(cluster.database_url, task_id))
    time.sleep(0.5)
    assert len(steps_done(cluster.database_url, task_id)) == done < 200


def _stop_reason(worker, task_id) -> str | None:
    tasks = worker.get("/health/ready").json().get("tasks", [])
    return next((t["stopping"] for t in tasks if t["id"] == str(task_id)), None)


def test_a_cancel_notice_reaches_the_running_kind_at_once_and_logs_no_traceback(cluster, writer):
    """The `task.cancelling` notification itself asks the kind to stop, not the heartbeat that
    re-reads the status every HEARTBEAT_EVERY_S (3 s): the task waits at a gate (so no
    progress write of its own can find the cancel either), the cancel comes right after a
    heartbeat, and the worker says the kind is stopping within a fraction of the interval.
    (The LISTEN callback used to start the status read with anyio's `start_soon` outside any
    task: NoEventLoopError, a traceback per notice, and the stop waited for the heartbeat.)"""
    from arkvory.writer.worker.runner import HEARTBEAT_EVERY_S

    url = cluster.database_url
    worker = start_worker(cluster).wait_active()
    task_id = dispatch(url, "steps", {"steps": 3, "hold_at": 1})
    wait_held(url, task_id, 1)
    beat = task(url, task_id)["heartbeat_at"]
    wait_for(lambda: task(url, task_id)["heartbeat_at"] != beat, "a heartbeat", timeout=10, every=0.02)
    asked = time.monotonic()  # the next heartbeat is HEARTBEAT_EVERY_S away
    with writer.client(ADMIN_TOKEN) as client:
        answer = client.post(f"/api/v1/tasks/{task_id}/cancel")
    assert answer.status_code == 202, answer.text
    wait_for(lambda: _stop_reason(worker, task_id) == "cancel", "asked to stop", timeout=10, every=0.02)
    took = time.monotonic() - asked
    assert took < HEARTBEAT_EVERY_S / 2, f"asked to stop {took:.2f} s after the cancel: by the heartbeat"
    assert "cancel requested" in worker.stderr
    open_gate(url, task_id)
    wait_task(url, task_id, "cancelled", timeout=10)
    assert "Traceback" not in worker.stderr and "NoEventLoopError" not in worker.stderr, worker.stderr


# -- one active worker -------------------------------------------------------------------------


def test_a_standby_worker_says_so_once_and_takes_over_when_the_active_one_dies(cluster, writer):
    first = start_worker(cluster, "first").wait_active()
    second = start_worker(cluster, "second").wait_status("standby")
    answer = httpx.get(f"{second.url}/health/status", timeout=5)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "2"
    # The first run waits at step 2 until the gate opens: it cannot finish before the kill,
    # however long the standby's retries take on a loaded machine.
    task_id = dispatch(cluster.database_url, "steps", {"steps": 20, "step_seconds": 0.05, "hold_at": 2}, on_restart="retry")
    wait_held(cluster.database_url, task_id, 2)
    time.sleep(5)  # a few retries of the standby worker (every 2 s): it says so only once
    assert second.stderr.count("standby: another worker is active") == 1, second.stderr
    assert "arkvory-worker" in second.stderr  # it names the active one
    assert task(cluster.database_url, task_id)["status"] == "running"
    first.kill()
    killed = time.monotonic()
    open_gate(cluster.database_url, task_id)
    second.wait_active(timeout=15)
    assert time.monotonic() - killed < 8.0  # retried every 2 s; slack for a loaded machine
    done = wait_task(cluster.database_url, task_id, "completed", timeout=30)
    assert done["attempts"] == 2
    assert "task.queued" in event_types(cluster.database_url, task_id)[2:]


def test_sigterm_exits_0_within_the_drain_bound_and_leaves_the_task_for_recovery(cluster, writer):
    worker = start_worker(cluster, ARKVORY_DRAIN_TIMEOUT_SECONDS="20").wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 400, "step_seconds": 0.05}, on_restart="resume")
    wait_checkpoint(cluster.database_url, task_id, 3)
    asked = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(15) == 0
    assert time.monotonic() - asked < 10.0  # the kind stopped at its next step, long before the bound
    left = task(cluster.database_url, task_id)
    assert left["status"] == "running"  # for the next start's restart recovery
    # A planned stop is no crash: the run gave its attempt back (max_attempts is not used up).
    assert left["attempts"] == 0
    stopped_at = left["checkpoint"]["next"]
    # It stopped at its next step: the one in flight may be done, not checkpointed, no more.
    assert stopped_at <= len(steps_done(cluster.database_url, task_id)) <= stopped_at + 1
    # The next worker resumes it from that checkpoint.
    start_worker(cluster, "next").wait_active()
    again = wait_for(lambda: (t := task(cluster.database_url, task_id))["checkpoint"]["next"] > stopped_at and t, "resumed")
    assert again["attempts"] == 1
    resumed = [e for e in events(cluster.database_url, task_id) if e["type"] == "task.running"][-1]
    assert resumed["data"]["resumed"] is True


def test_sigterm_cancels_a_kind_that_does_not_stop_within_the_bound(cluster, writer):
    worker = start_worker(cluster, ARKVORY_DRAIN_TIMEOUT_SECONDS="1").wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 3, "step_seconds": 30})
    wait_task(cluster.database_url, task_id, "running")
    asked = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(15) == 0
    assert time.monotonic() - asked < 10.0  # the bound (1 s), not the kind's 30 s step
    assert task(cluster.database_url, task_id)["status"] == "running"


def test_signals_close_together_are_one_stop_and_a_later_one_cancels(cluster, writer):
    """A terminal's Ctrl-C reaches a whole process group, and a supervisor in it may forward a
    signal of its own: within a second, that is one planned stop, with no warning."""
    worker = start_worker(cluster, ARKVORY_DRAIN_TIMEOUT_SECONDS="60").wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 3, "step_seconds": 30})
    wait_task(cluster.database_url, task_id, "running")
    worker.signal(signal.SIGINT)
    time.sleep(0.05)
    worker.signal(signal.SIGTERM)
    time.sleep(1.5)
    assert worker.proc.poll() is None  # still draining: the kind stops at its next step
    assert "second stop signal" not in worker.stderr and "WARNING" not in worker.stderr, worker.stderr
    asked = time.monotonic()
    worker.signal(signal.SIGTERM)  # a real second stop: cancel where they are
    assert worker.wait_exit(15) == 0
    assert time.monotonic() - asked < 10.0
    assert worker.stderr.count("second stop signal: cancelling the running tasks where they are") == 1


def test_a_standby_worker_stops_at_once_on_sigterm(cluster, writer):
    start_worker(cluster, "first").wait_active()
    second = start_worker(cluster, "second").wait_status("standby")
    second.signal(signal.SIGTERM)
    assert second.wait_exit(10) == 0


def test_a_lost_lock_stops_the_task_and_no_write_of_the_old_holder_lands(cluster, writer):
    old = start_worker(cluster, "old").wait_active()
    # The run waits before step 3 (steps 0-2 done and checkpointed) until the gate opens: frozen
    # there, the old worker holds no transaction open, and the usage it recorded stays put.
    task_id = dispatch(cluster.database_url, "steps", {"steps": 60, "step_seconds": 0.05, "hold_at": 3}, on_restart="retry")
    wait_held(cluster.database_url, task_id, 3)
    # Freeze the active worker, end its lock connection, let another worker take over.
    old.signal(signal.SIGSTOP)
    try:
        # The usage the old run recorded, carried into the new run (read before the new worker
        # starts: afterwards its own steps would already count in it).
        carried = task(cluster.database_url, task_id)["usage"]["items"]
        assert carried == 3
        assert terminate_backend(cluster.database_url, lock_backend(cluster.database_url))
        new = start_worker(cluster, "new").wait_active(timeout=15)
        requeued = wait_for(
            lambda: [e for e in events(cluster.database_url, task_id) if e["type"] == "task.queued"][1:],
            "requeued by the new worker",
        )[0]
        open_gate(cluster.database_url, task_id)  # for both runs: the new one holds at step 3 too
    finally:
        old.signal(signal.SIGCONT)  # its kind wakes up at the gate, mid-run, and tries to go on
    done = wait_task(cluster.database_url, task_id, "completed", timeout=30)
    assert done["attempts"] == 2 and done["result"] == {"steps": 60, "first": 0}
    # After the new worker requeued it, every write is the new run's: step n of it shows the
    # usage carried plus n + 1; a write of the old holder (its own count) would not.
    after = [e for e in events(cluster.database_url, task_id) if e["seq"] > requeued["seq"]]
    assert [e["type"] for e in after[:2]] == ["task.loading", "task.running"]
    progress = [e["data"] for e in after if e["type"] == "task.progress"]
    assert progress and all(d["usage"]["items"] == carried + d["data"]["step"] + 1 for d in progress), progress
    assert carried > 0 and done["usage"]["items"] == carried + 60
    # The old worker noticed, stopped its task and stands by.
    old.wait_status("standby", timeout=15)
    assert "no longer the active worker" in old.stderr
    assert "Traceback" not in old.stderr
    assert new.status() == "active"


def test_a_lost_lock_connection_of_the_only_worker_is_taken_again_and_the_task_rerun(cluster, writer):
    worker = start_worker(cluster).wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 40, "step_seconds": 0.05}, on_restart="retry")
    wait_checkpoint(cluster.database_url, task_id, 3)
    before = lock_backend(cluster.database_url)
    assert terminate_backend(cluster.database_url, before)
    done = wait_task(cluster.database_url, task_id, "completed", timeout=30)
    assert done["attempts"] == 2
    assert lock_backend(cluster.database_url) not in (None, before)
    assert worker.status() == "active"
    metrics = worker.get("/health/metrics").text
    assert "arkvory_worker_locks_lost_total 1.0" in metrics


# -- health ----------------------------------------------------------------------------------


def test_health_endpoints(cluster, writer):
    worker = start_worker(cluster).wait_active()
    assert worker.get("/health/live", token=None).json() == {"status": "ok"}
    assert worker.get("/health/status", token=None).json() == {"status": "active"}
    assert worker.get("/health/metrics", token=None).status_code == 401
    assert worker.get("/health/metrics", token="arkvory_key_unknown").status_code == 401
    task_id = dispatch(cluster.database_url, "steps", {"steps": 2})
    wait_task(cluster.database_url, task_id, "completed")
    metrics = worker.get("/health/metrics", token=READER_TOKEN)
    assert metrics.status_code == 200
    text = metrics.text
    assert "arkvory_worker_active 1.0" in text
    assert 'arkvory_worker_tasks_total{kind="steps",outcome="completed"} 1.0' in text
    assert 'arkvory_worker_task_duration_seconds_count{kind="steps"} 1.0' in text
    for name in ("arkvory_cleanup_reclaimed_bytes_total", "arkvory_cleanup_deleted_blobs_total", "arkvory_verify_hashed_bytes_total"):
        assert name in text
    ready = worker.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["role"] == "worker" and ready.json()["schemaVersion"] == db.CODE_SCHEMA_VERSION
    assert worker.get("/health/nothing", token=None).status_code == 404
    # A managed service key from the database will do too, until it is revoked.
    with writer.client(ADMIN_TOKEN) as client:
        made = client.post("/api/v1/keys", json={"scopes": ["read:*"], "label": "scraper"})
        assert made.status_code == 201, made.text
        key = made.json()
        assert worker.get("/health/metrics", token=key["token"]).status_code == 200
        assert client.delete(f"/api/v1/keys/{key['id']}").status_code in (200, 204)
    assert worker.get("/health/metrics", token=key["token"]).status_code == 401
    assert worker.get("/health/metrics", token="pat_" + "0" * 32 + "." + "x" * 40).status_code == 401


def test_public_metrics_need_no_key(cluster, writer):
    worker = start_worker(cluster, ARKVORY_PUBLIC_METRICS="true").wait_active()
    assert worker.get("/health/metrics", token=None).status_code == 200
    assert worker.get("/health/ready", token=None).status_code == 401


def test_the_real_command_runs_verify_and_cleanup(cluster, writer):
    worker = start_worker(cluster, real=True).wait_active()
    with writer.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        artifacts = []
        for n in range(3):
            answer = client.post("/api/v1/repositories/r/artifacts?name=a", content=b"blob %d" % n)
            assert answer.status_code == 201, answer.text
            artifacts.append(answer.json())
    task_id = dispatch(cluster.database_url, "verify", {}, on_restart="resume")
    done = wait_task(cluster.database_url, task_id, "completed")
    assert done["result"]["checked"] == 3
    assert "arkvory_verify_hashed_bytes_total 18.0" in worker.get("/health/metrics").text
    # Cleanup reclaims the blob of a deleted artifact, and says so in the worker's metrics.
    with writer.client(ADMIN_TOKEN) as client:
        assert client.delete(f"/api/v1/repositories/r/artifacts/{artifacts[0]['id']}").status_code in (200, 204)
    task_id = dispatch(cluster.database_url, "cleanup", {"grace_seconds": 0}, on_restart="retry")
    assert wait_task(cluster.database_url, task_id, ("completed", "failed"))["status"] == "completed"
    metrics = worker.get("/health/metrics").text
    assert "arkvory_cleanup_deleted_blobs_total 1.0" in metrics
    assert "arkvory_cleanup_reclaimed_bytes_total 6.0" in metrics
    assert 'arkvory_worker_tasks_total{kind="cleanup",outcome="completed"} 1.0' in metrics


# -- arkvory dev -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_arkvory_dev_runs_a_worker_and_stops_it_with_the_cluster(tmp_path):
    from .harness import free_port_run
    from .test_dev import Dev, remove_state

    dev = Dev(tmp_path / ".arkvory-dev", free_port_run(1), "--gateways", "0")
    try:
        token = dev.wait_running()
        worker_url = re.search(r"worker\s+(http://127\.0\.0\.1:\d+)", dev.output).group(1)
        assert httpx.get(f"{worker_url}/health/status", timeout=5).json() == {"status": "active"}
        writer_url = f"http://127.0.0.1:{dev.port}"
        with httpx.Client(base_url=writer_url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
            answer = client.post("/api/v1/tasks", json={"kind": "verify"})
            assert answer.status_code == 202, answer.text
            location = answer.headers["Location"]
            wait_for(lambda: client.get(location).json()["status"] == "completed", "verify completed")
    finally:
        status = dev.stop()
        remove_state(dev.state)
    assert status == 0, dev.output
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{worker_url}/health/live", timeout=2)


def test_a_running_task_is_heartbeated_with_its_usage(cluster, writer):
    start_worker(cluster).wait_active()
    task_id = dispatch(cluster.database_url, "steps", {"steps": 200, "step_seconds": 0.05, "checkpoint_every": 1000})
    first = wait_task(cluster.database_url, task_id, "running")
    beat = wait_for(
        lambda: (t := task(cluster.database_url, task_id))["heartbeat_at"] > first["heartbeat_at"] and t,
        "a heartbeat", timeout=10,
    )
    # No checkpoint and coalesced events, yet the usage in the row keeps up with the work
    # (written with each progress event, at most 0.5 s apart, and each heartbeat).
    assert beat["status"] == "running" and beat["checkpoint"] is None
    assert 0 < beat["usage"]["items"] <= len(steps_done(cluster.database_url, task_id))


def test_a_partition_from_the_database_stops_the_task_and_the_worker_comes_back(cluster, writer, db_proxy):
    url = cluster.database_url
    worker = start_worker(cluster, ARKVORY_DATABASE_URL=db_proxy.url_for(url)).wait_active()
    task_id = dispatch(url, "steps", {"steps": 60, "step_seconds": 0.05}, on_restart="retry")
    wait_checkpoint(url, task_id, 3)
    db_proxy.stall()  # a half-open lock connection: only the ping's timeout can tell
    stalled = time.monotonic()
    try:
        worker.wait_status("standby", timeout=15)
        assert time.monotonic() - stalled < 10.0  # ping every 2 s, 1.5 s timeout, and slack
    finally:
        db_proxy.resume()
    worker.wait_active(timeout=30)
    done = wait_task(url, task_id, "completed", timeout=30)
    assert done["attempts"] == 2 and done["result"] == {"steps": 60, "first": 0}
    assert "did not answer a ping" in worker.stderr
