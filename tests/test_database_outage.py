"""Issue 13 item 17: while the database is down, each process (writer, gateway, worker) logs one
line when it goes down and one when it is back, never an asyncpg traceback per attempt.

The database goes away behind the TCP proxy (every connection closed, every new one closed at
once, as by a stopped server) for less than the lease's 8 s of trust minus a renewal period,
so that every process keeps its slot, survives, and says that the database is back.
"""

from __future__ import annotations

import time

import pytest

from .harness import ADMIN_TOKEN
from .worker_harness import start_worker

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

# A renewal fails at most twice in this time (every 2 s), and the third one, 6 s after the last
# success, succeeds: trust (8 s) never runs out.
MAX_OUTAGE_S = 3.5
DOWN = "database unreachable: "
BACK = "database reachable again"


def wait_until(check, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return result


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_a_database_outage_logs_one_line_down_and_one_back_per_process_and_no_traceback(cluster, db_proxy):
    via_proxy = db_proxy.url_for(cluster.database_url)
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared, ARKVORY_DATABASE_URL=via_proxy).wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_DATABASE_URL=via_proxy).wait_ready()
    worker = start_worker(cluster, real=True, ARKVORY_DATABASE_URL=via_proxy).wait_active()
    processes = (writer, gateway, worker)
    time.sleep(2.5)  # every loop (pins, lease, pings, metrics) has made a round

    db_proxy.refuse()
    # Every process notices (the worker after its 2 s pause before taking its lock again).
    wait_until(lambda: all(DOWN in p.stderr for p in processes), MAX_OUTAGE_S)
    db_proxy.resume()

    assert wait_until(lambda: all(BACK in p.stderr for p in processes), 20), [
        (p.name, p.stderr) for p in processes
    ]
    writer.wait_ready(10)
    gateway.wait_ready(10)
    worker.wait_active(10)
    with writer.client(ADMIN_TOKEN) as client:  # the writer makes changes again
        assert client.post("/api/v1/repositories", json={"name": "after"}).status_code == 201
    time.sleep(2.5)  # a line that would still come (a late retry) has come

    for process in processes:
        log = process.stderr
        assert "Traceback" not in log, f"{process.name}:\n{log}"
        # One line each way; two if a retry begun in the outage failed after the others came back.
        assert 1 <= log.count(DOWN) <= 2, f"{process.name}:\n{log}"
        assert log.count(BACK) == log.count(DOWN), f"{process.name}:\n{log}"
        assert process.proc.poll() is None, f"{process.name} exited:\n{log}"
