"""Task budgets in a real worker (SPEC §7): each limit trips on the very step that exceeds it, the
task ends `failed` with `budget_exceeded` at once, and it is never run again, not even by the
restart recovery of the next worker (the policy here is `retry`, the one that would re-run it).

The `steps` kind (tests/worker_kinds.py) records each step before reporting it, then reports
progress (one transition) and checkpoints (another), so the step that trips is the last
recorded one.
"""

from __future__ import annotations

import json
import time

import pytest

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
