"""The writer's task schedule (issue 8 item 7) and its task metrics, with real writer processes:
one task per period by the database clock, none again after a restart within the period, racing
dispatchers make one task, a database outage is survived; metrics come from the database."""

from __future__ import annotations

import asyncio
import re
import time

import asyncpg
import pytest

from arkvory.writer.maintenance.kinds import KINDS
from arkvory.writer.tasks.schedule import dispatch_due

from .harness import db_fetch

pytestmark = pytest.mark.timeout(120)


def scheduled(database_url):
    return db_fetch(
        database_url,
        "SELECT kind, idempotency_key, created_by, on_restart, status FROM arkvory_tasks ORDER BY created_at",
    )


def database_period(database_url, interval_s: int) -> int:
    return int(db_fetch(database_url, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0] // interval_s)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not {what} after {timeout} s")


def test_one_cleanup_per_period(cluster, database_url):
    writer = cluster.writer(ARKVORY_CLEANUP_INTERVAL="2s").wait_ready()
    first = database_period(database_url, 2)
    wait_for(lambda: database_period(database_url, 2) >= first + 3, 15, "three periods later")
    last = database_period(database_url, 2)
    # The writer dispatches a period's task just after the period begins: wait for it (a fixed
    # 0.5 s was too short on a loaded machine), then look at everything dispatched.
    wait_for(
        lambda: any(row["idempotency_key"] == f"schedule:cleanup:{last}" for row in scheduled(database_url)),
        10, f"the task of period {last} dispatched",
    )
    rows = scheduled(database_url)
    keys = [row["idempotency_key"] for row in rows]
    periods = sorted(int(key.rsplit(":", 1)[1]) for key in keys)
    # One task per period the writer ran in, none twice, no gap.
    assert periods == list(range(periods[0], periods[0] + len(periods))), keys
    assert periods[0] <= first and periods[-1] >= last, (first, last, keys)
    assert all(row["kind"] == "cleanup" and row["created_by"] == "schedule" and row["on_restart"] == "retry" for row in rows)
    assert all(key.startswith("schedule:cleanup:") for key in keys)
    assert writer.status() == (200, "ready")


def test_a_restart_within_the_period_dispatches_nothing_again(cluster, database_url):
    env = {"ARKVORY_CLEANUP_INTERVAL": "1h", "ARKVORY_VERIFY_INTERVAL": "1h"}
    before = database_period(database_url, 3600)
    writer = cluster.writer(**env).wait_ready()
    wait_for(lambda: len(scheduled(database_url)) >= 2, 10, "dispatched")
    for _ in range(2):
        writer.kill()
        writer = cluster.writer(**env).wait_ready()
        time.sleep(1.5)
    after = database_period(database_url, 3600)
    rows = scheduled(database_url)
    expected = {f"schedule:{kind}:{period}" for kind in ("cleanup", "verify") for period in range(before, after + 1)}
    assert {row["idempotency_key"] for row in rows} == expected
    assert len(rows) == len(expected)  # (an hour boundary during the test adds one per kind)
    policies = {row["kind"]: row["on_restart"] for row in rows}
    assert policies == {"cleanup": "retry", "verify": "resume"}


def test_racing_dispatchers_make_one_task_per_period(cluster, database_url):
    cluster.writer().wait_ready()  # the schema; its own schedule is off

    async def race():
        conns = [await asyncpg.connect(database_url) for _ in range(8)]
        try:
            return await asyncio.gather(*(dispatch_due(c, "verify", 3600, KINDS) for c in conns))
        finally:
            for c in conns:
                await c.close()

    outcomes = asyncio.run(race())
    assert sum(created for _, _, created in outcomes) == 1
    assert len({period for period, _, _ in outcomes}) == 1
    assert all(0 < left <= 3600 for _, left, _ in outcomes)
    assert len(scheduled(database_url)) == 1


def test_the_schedule_survives_a_database_outage(cluster, database_url, db_proxy):
    writer = cluster.writer(
        ARKVORY_CLEANUP_INTERVAL="2s", ARKVORY_DATABASE_URL=db_proxy.url_for(database_url)
    ).wait_ready()
    wait_for(lambda: scheduled(database_url), 10, "dispatched")
    db_proxy.stall()
    # Until a statement has failed for it (a query timeout later), not a fixed 7 s.
    wait_for(lambda: "database unreachable: " in writer.stderr, 20, "the outage noticed")
    db_proxy.resume()
    db_proxy.cut()  # connections that hung in the stall start afresh
    resumed = database_period(database_url, 2)
    wait_for(
        lambda: any(int(r["idempotency_key"].rsplit(":", 1)[1]) > resumed for r in scheduled(database_url)),
        20, "dispatching again after the outage",
    )
    assert writer.proc.poll() is None, writer.stderr
    # The process says so once per outage (shared.supervision.DATABASE), not once per retry.
    assert 1 <= len(re.findall(r"database unreachable: ", writer.stderr)) <= 2


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)"
    match = re.search("^" + pattern + "$", text, re.MULTILINE)
    return None if match is None else float(match.group(1))


def test_task_metrics_come_from_the_database(cluster, database_url):
    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        for _ in range(3):
            assert client.post("/api/v1/tasks", json={"kind": "verify"}).status_code == 202
        assert client.post("/api/v1/tasks", json={"kind": "cleanup"}).status_code == 202
        cancelled = client.post("/api/v1/tasks", json={"kind": "cleanup"}).json()["id"]
        assert client.post(f"/api/v1/tasks/{cancelled}/cancel").status_code == 200

        def counted():
            text = client.get("/health/metrics").text
            return text if metric(text, "arkvory_tasks", kind="verify", status="queued") == 3 else None

        text = wait_for(counted, 15, "counted")
    assert metric(text, "arkvory_tasks", kind="cleanup", status="queued") == 1
    assert metric(text, "arkvory_tasks", kind="cleanup", status="cancelled") == 1
    assert metric(text, "arkvory_tasks", kind="verify", status="running") == 0
    assert metric(text, "arkvory_task_oldest_queued_seconds") > 0
    assert metric(text, "arkvory_task_event_streams") == 0
