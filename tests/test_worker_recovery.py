"""Restart recovery (SPEC §7): kill -9 of a real worker while its tasks are queued, loading,
running and cancelling, for each policy, and the next worker applies exactly the table:

    found        fail                 retry                resume
    queued       failed               queued (no event)    queued (no event)
    loading      failed               queued               queued
    running      failed               queued               running, from its last checkpoint
    cancelling   cancelled            cancelled            cancelled

`running` is a real task killed mid-run; `queued` is real too (a second task of a kind already
running waits); `cancelling` is a real running task cancelled while its worker was frozen
(SIGSTOP) and then killed; `loading` is made with the store (a claim cut between its two
transactions), with the worker frozen, just before the kill.
"""

from __future__ import annotations

import asyncio
import signal
import time

import asyncpg
import pytest

from .harness import ADMIN_TOKEN
from .worker_harness import (
    dispatch,
    events,
    freeze_between_transactions,
    insert_test_task,
    start_worker,
    steps_done,
    task,
    transition,
    wait_checkpoint,
    wait_for,
    wait_task,
)

pytestmark = pytest.mark.timeout(180)

EXPECTED = {
    # policy: {found: (first event after the kill, status it leads to)}
    "fail": {"queued": "task.failed", "loading": "task.failed", "running": "task.failed", "cancelling": "task.cancelled"},
    "retry": {"queued": "task.loading", "loading": "task.queued", "running": "task.queued", "cancelling": "task.cancelled"},
    "resume": {"queued": "task.loading", "loading": "task.queued", "running": "task.running", "cancelling": "task.cancelled"},
}


@pytest.fixture
def writer(cluster):
    # No scheduled cleanup: the tests decide which tasks the worker sees.
    return cluster.writer(ARKVORY_CLEANUP_INTERVAL="off").wait_ready()


def _after(url, task_id, seq):
    return [e for e in events(url, task_id) if e["seq"] > seq]


@pytest.mark.parametrize("policy", ["fail", "retry", "resume"])
def test_kill_9_applies_the_restart_table(cluster, writer, policy):
    url = cluster.database_url
    first = start_worker(cluster, "first").wait_active()
    tasks = {}
    tasks["running"] = dispatch(url, "steps", {"steps": 30, "step_seconds": 0.2}, on_restart=policy)
    wait_checkpoint(url, tasks["running"], 2)
    tasks["queued"] = dispatch(url, "steps", {"steps": 3}, on_restart=policy)  # its kind is busy
    tasks["cancelling"] = dispatch(url, "steps_b", {"steps": 300, "step_seconds": 0.1}, on_restart=policy)
    wait_checkpoint(url, tasks["cancelling"], 1)
    freeze_between_transactions(first, url)  # from here on the worker acts on nothing
    transition(url, tasks["cancelling"], ["running"], "cancelling", "task.cancelling")
    tasks["loading"] = dispatch(url, "steps", {"steps": 3}, on_restart=policy)
    transition(url, tasks["loading"], ["queued"], "loading", "task.loading", worker="a-worker-now-dead", attempts=1)
    first.kill()
    at_kill = {found: task(url, task_id) for found, task_id in tasks.items()}
    assert {found: t["status"] for found, t in at_kill.items()} == {found: found for found in tasks}
    checkpoint_at_kill = at_kill["running"]["checkpoint"]["next"]

    second = start_worker(cluster, "second").wait_active()
    for found, task_id in tasks.items():
        wanted = EXPECTED[policy][found]
        seen = wait_for(lambda: _after(url, task_id, at_kill[found]["last_event"]), f"an event of the {found} task")
        assert seen[0]["type"] == wanted, (found, [e["type"] for e in seen])
        if wanted == "task.failed":
            failed = task(url, task_id)
            assert (failed["status"], failed["error_code"]) == ("failed", "server_restarted")
            assert seen[0]["data"]["error_code"] == "server_restarted"
        if wanted == "task.cancelled":
            assert task(url, task_id)["status"] == "cancelled"
    if policy == "fail":
        # Nothing more happens to them; a task dispatched now is not left over and just runs.
        fresh = dispatch(url, "steps", {"steps": 2}, on_restart="fail")
        assert wait_task(url, fresh, "completed")["attempts"] == 1
        for found, task_id in tasks.items():
            assert len(_after(url, task_id, at_kill[found]["last_event"])) == 1, found
        return

    for found in ("queued", "loading", "running"):
        done = wait_task(url, tasks[found], "completed", timeout=60)
        assert done["attempts"] == at_kill[found]["attempts"] + 1
    ran = task(url, tasks["running"])
    steps = steps_done(url, tasks["running"])
    assert sorted(set(steps)) == list(range(30))
    if policy == "resume":
        # Continued from the checkpoint it had when killed: nothing before it was done again.
        resumed = _after(url, tasks["running"], at_kill["running"]["last_event"])[0]
        assert resumed["data"]["resumed"] is True
        assert ran["result"] == {"steps": 30, "first": checkpoint_at_kill}
        assert all(steps.count(step) == 1 for step in range(checkpoint_at_kill)), steps
        # Continued from the checkpoint's usage: the steps done again after it count once.
        assert ran["usage"]["items"] == 30
    else:
        assert ran["result"] == {"steps": 30, "first": 0}
        assert all(steps.count(step) == 2 for step in range(checkpoint_at_kill)), steps
        # The usage is the task's: the new run adds to what the killed one had recorded.
        assert ran["usage"]["items"] == at_kill["running"]["usage"]["items"] + 30
    assert second.status() == "active"


def test_a_killed_verify_resumes_from_its_checkpoint_without_hashing_or_counting_again(cluster, writer):
    url = cluster.database_url
    blob = 64 * 1024
    with writer.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for n in range(10):
            body = bytes([n]) * blob
            assert client.post(f"/api/v1/repositories/r/artifacts?name=b{n}", content=body).status_code == 201
    first = start_worker(cluster, "first", real=True).wait_active()
    # A budget the job fits exactly: work counted twice would exceed it.
    budget = {"max_items": 10, "max_bytes": 10 * blob}
    task_id = dispatch(url, "verify", {"bytes_per_second": blob}, on_restart="resume", budget=budget)
    # Killed once progress past the checkpoint is recorded: work the next run does again.
    checkpointed = wait_for(
        lambda: (t := task(url, task_id))["checkpoint"] and t["usage"]["items"] > t["checkpoint"]["checked"] and t,
        "progress recorded after a verify checkpoint", timeout=30,
    )
    first.kill()
    at_kill = task(url, task_id)
    assert at_kill["status"] == "running"
    before = at_kill["checkpoint"]["checked"]
    assert before >= checkpointed["checkpoint"]["checked"] and 0 < before < at_kill["usage"]["items"] < 10
    second = start_worker(cluster, "second", real=True).wait_active()
    done = wait_task(url, task_id, ("completed", "failed"), timeout=60)
    assert done["status"] == "completed", done["error_message"]
    assert done["result"]["checked"] == 10 and done["result"]["missing"] == done["result"]["corrupt"] == 0
    assert (done["usage"]["items"], done["usage"]["bytes"]) == (10, 10 * blob)
    # The second worker hashed exactly the blobs after the checkpoint, none before it.
    metrics = second.get("/health/metrics").text
    assert f"arkvory_verify_hashed_bytes_total {float((10 - before) * blob)}" in metrics, metrics
    assert 'arkvory_worker_recovered_tasks_total{to="resumed"} 1.0' in metrics


def test_the_planned_moves_are_the_table():
    from arkvory.writer.worker.recovery import planned_move

    table = {
        ("queued", "fail"): ("failed", "task.failed"),
        ("queued", "retry"): None,
        ("queued", "resume"): None,
        ("loading", "fail"): ("failed", "task.failed"),
        ("loading", "retry"): ("queued", "task.queued"),
        ("loading", "resume"): ("queued", "task.queued"),
        ("running", "fail"): ("failed", "task.failed"),
        ("running", "retry"): ("queued", "task.queued"),
        ("running", "resume"): ("running", "task.running"),
        ("cancelling", "fail"): ("cancelled", "task.cancelled"),
        ("cancelling", "retry"): ("cancelled", "task.cancelled"),
        ("cancelling", "resume"): ("cancelled", "task.cancelled"),
    }
    assert {found: planned_move(*found) for found in table} == table
    # Attempts used up: what would run again fails instead; the rest is the table.
    exhausted = {
        found: ("failed", "task.failed") if move is not None and move[0] in ("queued", "running") else move
        for found, move in table.items()
    }
    assert {found: planned_move(*found, attempts_left=False) for found in table} == exhausted


# The worker's recovery read (writer/tasks/store.py `unfinished_tasks`), waiting for a lock.
_RECOVERY_WAITING = """
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%SELECT id, kind, status, on_restart FROM arkvory_tasks%'
"""


def test_a_task_dispatched_while_the_worker_activates_is_fresh_not_left_over(cluster, writer):
    """Its transaction began before the activation and committed after it: a fresh task, which
    runs, even with on_restart=fail. The interleaving is pinned: the dispatching transaction
    also holds the tasks table, so the new worker's recovery reads it only after the commit."""
    url = cluster.database_url

    async def scenario():
        conn = await asyncpg.connect(url)
        try:
            dispatching = conn.transaction()
            await dispatching.start()
            fresh = await insert_test_task(conn, "steps", {"steps": 2}, on_restart="fail")
            await conn.execute("LOCK TABLE arkvory_tasks IN ACCESS EXCLUSIVE MODE")
            worker = await asyncio.to_thread(lambda: start_worker(cluster).wait_active())
            deadline = time.monotonic() + 30
            while not await conn.fetchval(_RECOVERY_WAITING):
                assert time.monotonic() < deadline, "the worker's recovery never waited for the table"
                await asyncio.sleep(0.05)
            await dispatching.commit()
            return worker, fresh["id"]
        finally:
            await conn.close()

    worker, task_id = asyncio.run(scenario())
    ran = wait_task(url, task_id, ("completed", "failed"))
    assert (ran["status"], ran["error_code"], ran["attempts"]) == ("completed", None, 1), ran
    assert "task.failed" not in [e["type"] for e in events(url, task_id)]
    assert worker.status() == "active"


@pytest.mark.parametrize("policy", ["retry", "resume"])
def test_a_task_that_crashes_the_worker_is_run_at_most_max_attempts_times(cluster, writer, policy):
    url = cluster.database_url
    task_id = dispatch(url, "steps", {"steps": 3, "crash_at": 1}, on_restart=policy, max_attempts=2)
    for run in range(2):
        crashed = start_worker(cluster, f"run-{run}")
        assert crashed.wait_exit(30) == -signal.SIGKILL, crashed.stderr
    last = start_worker(cluster, "last").wait_active()
    failed = wait_task(url, task_id, ("failed", "completed"), timeout=15)
    assert (failed["status"], failed["error_code"], failed["attempts"]) == ("failed", "attempts_exhausted", 2)
    assert "max_attempts is 2" in failed["error_message"]
    last_event = events(url, task_id)[-1]
    assert last_event["type"] == "task.failed" and last_event["data"]["error_code"] == "attempts_exhausted"
    # Each run did step 0 (a resumed run continued after its checkpoint) and crashed at step 1.
    assert steps_done(url, task_id) == ([0, 0] if policy == "retry" else [0])
    time.sleep(1)
    assert last.status() == "active" and task(url, task_id)["last_event"] == last_event["seq"]
    assert 'arkvory_worker_recovered_tasks_total{to="failed"} 1.0' in last.get("/health/metrics").text
