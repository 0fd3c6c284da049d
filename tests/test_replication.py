"""Whether the database replicates synchronously (SPEC §11), as the processes and `arkvory admin
status` report it, and connections that find the primary among several hosts: a primary with a
real streaming standby (tests/pgreplica.py), made in about a second on tmpfs. The failover
itself, under load, is tests/test_failover.py (soak tier)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from arkvory.shared import db
from arkvory.shared.cluster.replication import judge

from .harness import eventually, run_arkvory
from .pgreplica import APP_ROLE, ReplicatedPostgres, beside
from .tcpproxy import TcpProxy
from .worker_harness import start_worker

pytestmark = [pytest.mark.timeout(120)]

ASYNC_WARNING = "none replicates synchronously"


@pytest.fixture(scope="module")
def replicated(postgres):
    pair = ReplicatedPostgres.start(beside(postgres))
    yield pair
    pair.destroy()


@pytest.fixture
def database(replicated):
    """A fresh database on the pair, and its application URL on the primary."""
    name = replicated.create_database()
    yield replicated.primary_url(name)
    replicated.drop_database(name)


@pytest.fixture
def synchronous(replicated, database):
    replicated.make_synchronous()
    yield replicated
    replicated.superuser(f"GRANT pg_read_all_stats TO {APP_ROLE}")  # a test may have revoked it


@pytest.fixture
def asynchronous(replicated, database):
    replicated.make_asynchronous()
    return replicated


def readiness_database(process) -> dict:
    with process.client() as client:
        return client.get("/health/ready").json()["database"]


# -- judging what pg_stat_replication says ----------------------------------------------------


@pytest.mark.parametrize(
    ("names", "commit", "states", "replication", "problem"),
    [
        ("", "on", [], "none", None),
        ("FIRST 1 (s1)", "on", [], "none", "no standby is connected"),
        ("", "on", ["async"], "asynchronous", "synchronous_standby_names is empty"),
        ("", "on", [None, None], "asynchronous", "synchronous_standby_names is empty"),  # no privilege needed
        ("FIRST 1 (s1)", "on", ["sync", "potential"], "synchronous", None),
        ("ANY 1 (s1, s2)", "remote_write", ["quorum", "quorum"], "synchronous", None),
        ("FIRST 1 (s1)", "on", ["potential"], "asynchronous", "no standby is in sync"),
        ("FIRST 1 (s1)", "local", ["sync"], "asynchronous", "synchronous_commit is 'local'"),
        ("*", "on", [None], "unknown", "GRANT pg_read_all_stats TO arkvory"),
    ],
)
def test_what_the_standbys_states_mean(names, commit, states, replication, problem):
    state = judge(names, commit, states, "arkvory")
    assert state.replication == replication
    assert state.synchronous_standby == {"synchronous": True, "unknown": None}.get(replication, False)
    assert (problem is None) == (state.problem is None) and (problem or "") in (state.problem or "")


def test_a_role_name_that_needs_quoting_is_quoted_in_the_grant():
    assert 'TO "Ark""vory"' in judge("*", "on", [None], 'Ark"vory').problem


# -- what the processes and admin status say ------------------------------------------------------


def test_readiness_says_whether_the_standby_is_synchronous_and_notices_a_change(synchronous, database, cluster):
    writer = cluster.writer(ARKVORY_DATABASE_URL=database).wait_ready()
    assert readiness_database(writer) == {
        "synchronousStandby": True, "replication": "synchronous", "standbys": 1, "synchronousStandbys": 1,
        "problem": None,
    }
    assert ASYNC_WARNING not in writer.stderr

    synchronous.make_asynchronous()
    database = eventually(
        lambda: (body := readiness_database(writer))["replication"] == "asynchronous" and body,
        "readiness saying asynchronous",
    )
    assert database["synchronousStandby"] is False and database["standbys"] == 1
    eventually(lambda: "no longer replicates synchronously" in writer.stderr, "the change logged")

    synchronous.superuser(f"REVOKE pg_read_all_stats FROM {APP_ROLE}")
    synchronous.make_synchronous()
    database = eventually(
        lambda: (body := readiness_database(writer))["replication"] == "unknown" and body,
        "readiness saying unknown",
    )
    assert database["synchronousStandby"] is None
    assert f"GRANT pg_read_all_stats TO {APP_ROLE}" in database["problem"]
    assert writer.stderr.count("no longer replicates synchronously") == 1


def test_every_process_warns_once_at_start_when_the_standbys_are_asynchronous(asynchronous, database, cluster):
    url = database
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared, ARKVORY_DATABASE_URL=url).wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_DATABASE_URL=url).wait_ready()
    worker = start_worker(cluster, real=True, ARKVORY_DATABASE_URL=url).wait_active()
    assert readiness_database(gateway)["replication"] == "asynchronous"
    time.sleep(4.5)  # two rounds of the control connection's pings, which read it again
    for process in (writer, gateway, worker):
        assert process.stderr.count(ASYNC_WARNING) == 1, f"{process.name}:\n{process.stderr}"
        assert "a slot twice" in process.stderr


def test_admin_status_says_whether_a_failover_keeps_every_renewal(synchronous, database, tmp_path):
    env = {"ARKVORY_DATABASE_URL": database, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    answer = run_arkvory(env, "admin", "status", "--json")
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["database"]["replication"] == "synchronous"
    table = run_arkvory(env, "admin", "status")
    assert "database         1 synchronous standby(s) of 1: a failover keeps every renewal" in table.stdout

    synchronous.make_asynchronous()
    table = run_arkvory(env, "admin", "status")
    assert "1 standby(s), none synchronous: a failover may grant a slot twice" in table.stdout


# -- finding the primary among several hosts ------------------------------------------------------


def test_a_primary_listed_after_a_vanished_host_is_found_within_one_timeout_per_host(database_url):
    """A host powered off answers nothing: asyncpg alone would spend its whole timeout there and
    never try the next host (MagicStack/asyncpg#1155)."""
    with TcpProxy.for_url(database_url) as vanished:
        vanished.stall()
        real = database_url.split("@", 1)[1].split("/", 1)[0]
        url = database_url.replace(real, f"127.0.0.1:{vanished.port},{real}", 1)

        async def connect_twice():
            timings = []
            for _ in range(2):
                started = time.monotonic()
                conn = await db.open_connection(url, timeout=1.0)
                timings.append(time.monotonic() - started)
                assert await conn.fetchval("SELECT 1") == 1
                await conn.close()
            return timings

        async def given_up_then_again():
            """A caller's own deadline (a lease renewal's) ends the attempt at the vanished
            host: the next attempt starts with the host after it."""
            other = url + "?application_name=given-up"  # a URL of its own: nothing remembered
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(db.open_connection(other, timeout=5.0), 0.5)
            started = time.monotonic()
            conn = await db.open_connection(other, timeout=5.0)
            await conn.close()
            return time.monotonic() - started

        first, second = asyncio.run(connect_twice())
        again = asyncio.run(given_up_then_again())
    assert 1.0 <= first < 4.0  # the vanished host's own timeout, then the primary
    assert second < 0.9  # the host that answered is tried first from then on
    assert again < 0.9


def test_a_standby_alone_is_an_unreachable_database_not_a_crash(replicated, cluster):
    """With target_session_attrs=read-write, a URL naming only a standby: exit 69 (restarted until
    a primary answers), one line naming why, no traceback."""
    url = replicated.app_url(replicated.standby_port, target_session_attrs="read-write")
    answer = run_arkvory(cluster.base_env(ARKVORY_DATABASE_URL=url, ARKVORY_ROLE="api"), "serve")
    assert answer.returncode == 69, answer.stderr
    assert "not the server target_session_attrs asks for" in answer.stderr
    assert "Traceback" not in answer.stderr
    assert replicated.app_password not in answer.stderr


def test_every_host_refusing_us_is_a_refusal_and_one_that_may_yet_answer_is_not(database_url, cluster, refused_url):
    """A wrong password on every host: exit 78, as with one host (restarting cannot cure it).
    With another host that may yet come up (here: nothing listens), 69: the units keep trying."""
    real = database_url.split("@", 1)[1].split("/", 1)[0]
    wrong = database_url.replace(database_url.split("@", 1)[0].rsplit(":", 1)[1], "wrong-password", 1)
    with TcpProxy.for_url(database_url) as same_server:
        both = wrong.replace(real, f"{real},127.0.0.1:{same_server.port}", 1)
        refused = run_arkvory(cluster.base_env(ARKVORY_DATABASE_URL=both), "serve")
    nothing_there = refused_url().removeprefix("http://")
    one = wrong.replace(real, f"{real},{nothing_there}", 1)
    unavailable = run_arkvory(cluster.base_env(ARKVORY_DATABASE_URL=one), "serve")
    assert refused.returncode == 78, refused.stderr
    assert "refuses us" in refused.stderr and "wrong-password" not in refused.stderr
    assert unavailable.returncode == 69, unavailable.stderr
    assert "InvalidPasswordError" in unavailable.stderr and "ConnectionRefusedError" in unavailable.stderr
