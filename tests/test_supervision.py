"""Background connections and loops are supervised (issue 6 §5): the control connection comes
back with its lock and its LISTEN after its backend is killed or goes silent, read pins that
cannot be written stop the payload, a planned stop is no warning, and a failing loop neither
takes its siblings down silently nor goes unnoticed."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time

import anyio
import httpx
import pytest

from arkvory.shared import db
from arkvory.shared.cluster.supervision import DatabaseReachability, supervised
from arkvory.shared.logs import QuietPoolRetries

from .harness import db_execute, db_fetch, run_arkvory

pytestmark = pytest.mark.timeout(120)

_ADVISORY_HOLDERS = """
SELECT l.pid, l.mode, a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = $1::bigint::oid
"""


def backend_pids(database_url: str, application_name: str) -> list[int]:
    rows = db_fetch(
        database_url, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", application_name
    )
    return [row["pid"] for row in rows]


def lock_holders(database_url: str, key: int) -> list[tuple[int, str, str]]:
    return [tuple(row) for row in db_fetch(database_url, _ADVISORY_HOLDERS, key)]


def eventually(check, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(every)


def metric(process, name: str) -> float:
    with process.client() as client:
        for line in client.get("/health/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


HITS = 'arkvory_catalog_lookups_total{result="hit"}'


def public_artifact(writer, repo: str = "pub") -> str:
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": repo, "public": True}).status_code == 201
        answer = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "a"}, content=b"payload")
        assert answer.status_code == 201, answer.text
        return f"/api/v1/repositories/{repo}/artifacts/{answer.json()['id']}/content"


def test_writer_whose_control_backend_is_killed_takes_its_lock_again_and_caches_again(cluster):
    writer = cluster.writer().wait_ready()
    path = public_artifact(writer)
    with writer.client(token=None) as anonymous:
        assert anonymous.get(path).content == b"payload"
    [old] = backend_pids(cluster.database_url, "arkvory-api-control")

    db_execute(cluster.database_url, "SELECT pg_terminate_backend($1)", old)

    def relocked():
        holders = lock_holders(cluster.database_url, db.WRITER_LOCK)
        return len(holders) == 1 and holders[0][0] != old and holders[0][2] == "arkvory-api-control"

    assert eventually(relocked, timeout=10), writer.stderr
    # The lock is really ours again: a second writer refuses as it would at start-up.
    second = run_arkvory(cluster.base_env(ARKVORY_ROLE="api"), timeout=30)
    assert second.returncode == 78, second.stderr
    assert "another Arkvory writer is already running" in second.stderr
    assert writer.status() == (200, "ready")

    # LISTEN is back: lookups are cached again ...
    hits = metric(writer, HITS)
    with writer.client(token=None) as anonymous:

        def cached_again():
            assert anonymous.get(path).status_code == 200
            return metric(writer, HITS) > hits

        assert eventually(cached_again, timeout=5, every=0.2), writer.stderr
        # ... and a change made behind our back still reaches the next request.
        db_execute(cluster.database_url, "UPDATE arkvory_repositories SET public = false WHERE name = 'pub'")
        assert eventually(lambda: anonymous.get(path).status_code == 401, timeout=1.0)
    assert "control connection lost" in writer.stderr


def test_gateway_whose_control_backend_is_killed_takes_its_shared_maintenance_lock_again(cluster):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    [old] = backend_pids(cluster.database_url, "arkvory-reader-control")

    db_execute(cluster.database_url, "SELECT pg_terminate_backend($1)", old)

    def relocked():
        return [
            (pid, mode)
            for pid, mode, name in lock_holders(cluster.database_url, db.MAINTENANCE_LOCK)
            if name == "arkvory-reader-control" and pid != old
        ]

    found = eventually(relocked, timeout=10)
    assert len(found) == 1 and found[0][1] == "ShareLock", gateway.stderr
    # Only now may we probe: an offline repair tool cannot take the lock exclusively.
    got = db_fetch(cluster.database_url, "SELECT pg_try_advisory_lock($1) AS got", db.MAINTENANCE_LOCK)
    assert got[0]["got"] is False
    assert gateway.status() == (200, "ready")


def test_a_silent_control_connection_is_noticed_and_replaced(cluster, db_proxy):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url))
    gateway.wait_ready()
    [old] = backend_pids(cluster.database_url, "arkvory-reader-control")

    # A half-open connection: the server still sees the backend, we get no answer. 3.5 s is
    # well inside the lease's 8 s of trust, and longer than a ping interval plus its timeout.
    db_proxy.stall()
    time.sleep(3.5)
    db_proxy.resume()

    def replaced():
        return [pid for pid in backend_pids(cluster.database_url, "arkvory-reader-control") if pid != old]

    assert eventually(replaced, timeout=10), gateway.stderr
    assert "ping failed" in gateway.stderr
    assert eventually(lambda: gateway.status() == (200, "ready"), timeout=5)


def test_a_planned_stop_is_not_a_warning(cluster):
    writer = cluster.writer().wait_ready()
    writer.signal(signal.SIGTERM)
    assert writer.wait_exit(20) == 0
    stderr = writer.stderr
    assert "listener lost" not in stderr and "control connection lost" not in stderr
    assert " WARNING " not in stderr, stderr


def test_pins_that_cannot_be_written_stop_the_payload_until_they_can(cluster, database_url):
    writer = cluster.writer().wait_ready()
    path = public_artifact(writer)
    assert httpx.get(writer.url + path).status_code == 200
    locked = threading.Event()
    release = threading.Event()

    def hold_the_pins_table():
        async def run():
            import asyncpg

            conn = await asyncpg.connect(database_url)
            try:
                async with conn.transaction():
                    await conn.execute("LOCK TABLE arkvory_read_pins IN ACCESS EXCLUSIVE MODE")
                    locked.set()
                    while not release.is_set():
                        await asyncio.sleep(0.05)
            finally:
                await conn.close()

        asyncio.run(run())

    holder = threading.Thread(target=hold_the_pins_table)
    holder.start()
    try:
        assert locked.wait(10)
        since = time.monotonic()
        # Pins hang on the lock (no timeout would mean forever); 8 s after the last write that
        # succeeded the process must stop serving payload. Until then it still serves.
        assert eventually(lambda: writer.status() == (503, "unavailable"), timeout=12, every=0.05)
        unavailable_after = time.monotonic() - since
        assert 8 - 2.5 <= unavailable_after <= 8 + 1.0, unavailable_after
        answer = httpx.get(writer.url + path)
        assert answer.status_code == 503 and answer.json()["code"] == "unavailable"
        assert eventually(lambda: "read pins could not be written" in writer.stderr, timeout=2.5)
    finally:
        release.set()
        holder.join(10)
    # Pins are written again: the process serves again (no restart needed).
    assert eventually(lambda: writer.status() == (200, "ready"), timeout=6), writer.stderr
    assert httpx.get(writer.url + path).status_code == 200
    assert writer.proc.poll() is None


def test_a_failing_loop_is_logged_once_and_leaves_its_siblings_running(caplog):
    failures: list[tuple[str, str]] = []
    ticks = 0

    async def ticking(*, task_status):
        nonlocal ticks
        task_status.started()
        while True:
            ticks += 1
            await anyio.sleep(0.01)

    async def failing(*, task_status):
        task_status.started()
        await anyio.sleep(0.05)
        raise ValueError("boom")

    async def never_starts(*, task_status):
        raise RuntimeError("no connection")

    async def on_failure(name: str, exc: BaseException) -> None:
        failures.append((name, str(exc)))

    async def scenario():
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, "ticking", ticking, on_failure)
            await tg.start(supervised, "failing", failing, on_failure)
            with pytest.raises(RuntimeError, match="no connection"):
                await tg.start(supervised, "never starts", never_starts, on_failure)
            await anyio.sleep(0.2)
            before = ticks
            await anyio.sleep(0.1)
            assert ticks > before  # the sibling outlived the failure
            tg.cancel_scope.cancel()

    with caplog.at_level(logging.ERROR, logger="arkvory.supervision"):
        anyio.run(scenario)
    assert failures == [("failing", "boom")]
    records = [r for r in caplog.records if "failing" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is not None


def test_writer_whose_lock_another_writer_took_meanwhile_stops_with_78(cluster):
    writer = cluster.writer().wait_ready()
    [old] = backend_pids(cluster.database_url, "arkvory-api-control")

    async def take_the_lock_in_the_gap() -> None:
        import asyncpg

        rival = await asyncpg.connect(cluster.database_url)
        # The writer is stopped while its lock changes hands: running, it reconnects and takes
        # the lock again at once, and under load it won that race for the whole 5 s (a flake).
        writer.signal(signal.SIGSTOP)
        try:
            await rival.execute("SELECT pg_terminate_backend($1)", old)
            async with asyncio.timeout(10):  # free once the terminated backend has gone
                while not await rival.fetchval("SELECT pg_try_advisory_lock($1)", db.WRITER_LOCK):
                    await asyncio.sleep(0.05)
            writer.signal(signal.SIGCONT)
            # The writer must notice and stop (78) while we hold it.
            async with asyncio.timeout(20):
                while writer.proc.poll() is None:
                    await asyncio.sleep(0.1)
        finally:
            writer.signal(signal.SIGCONT)
            await rival.close()

    asyncio.run(take_the_lock_in_the_gap())
    assert writer.wait_exit(5) == 78, writer.stderr
    assert "another Arkvory writer" in writer.stderr


def test_an_outage_seen_by_several_loops_is_one_line_down_and_one_back(caplog):
    reachability = DatabaseReachability(logging.getLogger("test.database"))
    with caplog.at_level(logging.DEBUG, logger="test.database"):
        for attempt in range(5):
            reachability.failed("read pins", TimeoutError())
            reachability.failed("control connection", ConnectionRefusedError(111, "refused"))
        reachability.succeeded("read pins")
        assert not reachability.reachable  # the control connection still fails
        reachability.succeeded("control connection")
        reachability.succeeded("control connection")
    assert reachability.reachable
    above_debug = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]
    assert above_debug == [
        ("WARNING", "database unreachable: TimeoutError: no answer in time (read pins)"),
        ("INFO", "database reachable again"),
    ]
    attempts = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(attempts) == 10 and all(r.exc_info for r in attempts)  # tracebacks at debug only


def test_asyncpg_pool_retries_go_to_debug(caplog):
    pool_log = logging.getLogger("asyncpg.pool")
    pool_log.addFilter(quiet := QuietPoolRetries())
    try:
        with caplog.at_level(logging.INFO):
            try:
                raise TimeoutError
            except TimeoutError:
                pool_log.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
            pool_log.warning("something else")
        assert [r.getMessage() for r in caplog.records] == ["something else"]
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            pool_log.warning("Failed to restore the pool connection floor; retrying")
        assert [r.levelname for r in caplog.records] == ["DEBUG"]
    finally:
        pool_log.removeFilter(quiet)
