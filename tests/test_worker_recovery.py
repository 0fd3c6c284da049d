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

import signal

import pytest

from .harness import ADMIN_TOKEN
from .worker_harness import (
    dispatch,
    events,
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
    first.signal(signal.SIGSTOP)  # from here on the worker acts on nothing
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
        assert ran["usage"]["items"] >= 30  # the usage of one run, continued
    else:
        assert ran["result"] == {"steps": 30, "first": 0}
        assert all(steps.count(step) == 2 for step in range(checkpoint_at_kill)), steps
        assert ran["usage"]["items"] == 30  # a fresh run counts afresh
    assert second.status() == "active"


def test_a_killed_verify_resumes_from_its_checkpoint_without_hashing_again(cluster, writer):
    url = cluster.database_url
    blob = 64 * 1024
    with writer.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
        for n in range(10):
            body = bytes([n]) * blob
            assert client.post(f"/api/v1/repositories/r/artifacts?name=b{n}", content=body).status_code == 201
    first = start_worker(cluster, "first", real=True).wait_active()
    task_id = dispatch(url, "verify", {"bytes_per_second": blob}, on_restart="resume")
    checkpointed = wait_for(
        lambda: (t := task(url, task_id))["checkpoint"] and t, "a verify checkpoint", timeout=30
    )
    first.kill()
    at_kill = task(url, task_id)
    assert at_kill["status"] == "running"
    before = at_kill["checkpoint"]["checked"]
    assert before >= checkpointed["checkpoint"]["checked"] and 0 < before < 10
    second = start_worker(cluster, "second", real=True).wait_active()
    done = wait_task(url, task_id, "completed", timeout=60)
    assert done["result"]["checked"] == 10 and done["result"]["missing"] == done["result"]["corrupt"] == 0
    # The second worker hashed exactly the blobs after the checkpoint, none before it.
    metrics = second.get("/health/metrics").text
    assert f"arkvory_verify_hashed_bytes_total {float((10 - before) * blob)}" in metrics, metrics
    assert 'arkvory_worker_recovered_tasks_total{to="resumed"} 1.0' in metrics


def test_the_planned_moves_are_the_table():
    from writer.worker.recovery import planned_move

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
