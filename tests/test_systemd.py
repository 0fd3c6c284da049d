"""systemd knows the truth (issue 15 §3): real processes talk to a fake notify socket
(tests/notify_socket.py) as they would to systemd with `Type=notify` and `WatchdogSec=`.

READY=1 comes only after the lease is held and the port listens; the watchdog pings stop
within the trust window (8 s) when PostgreSQL stalls (tests/tcpproxy.py between the process
and the database); STOPPING=1 on SIGTERM; the worker is ready when active or standing by.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time

import httpx
import pytest

from arkvory.shared.process import systemd
from arkvory.shared.process.systemd import ServiceManager, keep_informed

from .harness import db_execute, db_fetch, eventually
from .notify_socket import Message, NotifySocket
from .worker_harness import start_worker

pytestmark = pytest.mark.timeout(90)

TRUST_S = 8.0
WATCHDOG_S = 1.0  # pings every 0.25 s: a stop of the pings is seen at once


@pytest.fixture
def notify():
    sock = NotifySocket()
    yield sock
    sock.close()
    for problem in sock.problems:
        raise problem


def watchdog_pings(sock: NotifySocket, after: float = 0.0) -> list[float]:
    return [m.at for m in sock.with_key("WATCHDOG") if m.at > after]


# -- the protocol itself -------------------------------------------------------------------


def test_without_notify_socket_nothing_is_sent_and_nothing_fails():
    manager = ServiceManager.from_environ({})
    assert not manager.enabled
    assert manager.ready("x") is False and manager.watchdog() is False and manager.stopping("x") is False


def test_a_filesystem_socket_and_the_watchdog_variables():
    directory = tempfile.mkdtemp(prefix="ark-", dir="/tmp")  # short: sun_path holds 108 bytes
    sock = NotifySocket(path=os.path.join(directory, "notify"))
    manager = ServiceManager.from_environ(sock.env(watchdog_s=2.5))
    try:
        assert manager.watchdog_s == 2.5
        assert manager.ready("up") and manager.watchdog() and manager.status("still up")
        assert manager.stopping("bye") and not manager.stopping("again")  # once
        sock.wait_for("STOPPING")
        sent = [m.fields for m in sock.messages]
        assert sent == [
            {"READY": "1", "STATUS": "up", "MAINPID": str(os.getpid())},
            {"WATCHDOG": "1"},
            {"STATUS": "still up"},
            {"STOPPING": "1", "STATUS": "bye"},
        ]
    finally:
        manager.close()
        sock.close()
        os.rmdir(directory)
    # WATCHDOG_PID names the process the watchdog is meant for; another one's is not ours.
    assert ServiceManager.from_environ({**sock.env(2.0), "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 2.0
    assert ServiceManager.from_environ({**sock.env(2.0), "WATCHDOG_PID": "1"}).watchdog_s is None
    assert ServiceManager.from_environ({**sock.env(), "WATCHDOG_USEC": "soon"}).watchdog_s is None


def test_pings_need_a_healthy_process_and_a_loop_that_answers_in_time(notify):
    """In-process, on a real event loop: pings stop while unhealthy and after the loop was
    blocked, and resume after; STOPPING once."""
    manager = ServiceManager.from_environ(notify.env(watchdog_s=0.4))  # a ping every 0.1 s
    state = {"healthy": True, "stopping": False}

    async def scenario() -> dict[str, float]:
        marks = {}
        task = asyncio.create_task(keep_informed(
            manager, ready=lambda: True, healthy=lambda: state["healthy"],
            status=lambda: "testing", stopping=lambda: state["stopping"],
        ))
        await asyncio.sleep(0.6)
        state["healthy"] = False
        marks["unhealthy"] = time.monotonic()
        await asyncio.sleep(0.8)
        state["healthy"] = True
        marks["healthy"] = time.monotonic()
        await asyncio.sleep(0.5)
        marks["blocking"] = time.monotonic()
        time.sleep(1.5)  # the loop is wedged: nothing runs, then the late tick must not ping
        marks["unblocked"] = time.monotonic()
        await asyncio.sleep(0.8)
        state["stopping"] = True
        await asyncio.sleep(0.4)
        task.cancel()
        return marks

    marks = asyncio.run(scenario())
    manager.close()
    pings = watchdog_pings(notify)
    assert notify.messages[0].fields["READY"] == "1"
    assert any(p < marks["unhealthy"] for p in pings)
    assert not [p for p in pings if marks["unhealthy"] + 0.15 < p < marks["healthy"]]
    assert any(marks["healthy"] < p < marks["blocking"] for p in pings)
    after_block = [p for p in pings if p > marks["blocking"]]
    # The first look after the block saw it late: that period pings nothing; the next one does.
    assert after_block and after_block[0] > marks["unblocked"] + systemd.TICK_S / 2
    assert len(notify.with_key("STOPPING")) == 1


# -- serve ---------------------------------------------------------------------------------


def test_ready_only_after_the_lease_is_held_and_the_port_answers_then_stopping_on_sigterm(cluster, notify):
    shared = cluster.shared_env()
    first = cluster.writer(shared).wait_ready()
    first.signal(signal.SIGTERM)
    assert first.wait_exit(30) == 0
    # The stopped writer keeps its reservation (SPEC §8); shorten it to ~3 s from now.
    db_execute(cluster.database_url, "UPDATE arkvory_gateway_leases SET expires_at = now() + interval '3 seconds'")
    seen_at_ready: dict[str, object] = {}
    env = {**cluster.base_env(), **shared}

    def at_ready(message: Message) -> None:
        if "READY" in message and not seen_at_ready:
            seen_at_ready["lease"] = db_fetch(
                cluster.database_url, "SELECT pid, expires_at > now() AS live FROM arkvory_gateway_leases WHERE slot = 0"
            )
            seen_at_ready["status"] = httpx.get(f"http://127.0.0.1:{env['ARKVORY_PORT']}/health/status", timeout=2).status_code

    notify.on_message = at_ready
    began = time.monotonic()
    writer = cluster.writer(shared, ARKVORY_PORT=env["ARKVORY_PORT"], **notify.env(watchdog_s=WATCHDOG_S))
    ready = notify.wait_for("READY")
    assert ready.at - began >= 2.0  # it waited for the old reservation to run out
    assert notify.messages[0] is ready  # nothing before READY, no watchdog ping either
    assert [dict(row) for row in seen_at_ready["lease"]] == [{"pid": writer.proc.pid, "live": True}]
    assert seen_at_ready["status"] == 200
    assert ready.fields["MAINPID"] == str(writer.proc.pid)
    assert ready.fields["STATUS"].startswith("writer, slot 0 of 3: ready; lease trusted ")
    status = notify.wait_for("STATUS", after=ready.at + 1.5)  # and again every 2 s
    assert "lease trusted" in status.fields["STATUS"]
    assert len(watchdog_pings(notify)) >= 4

    writer.signal(signal.SIGTERM)
    stopping = notify.wait_for("STOPPING", timeout=10)
    assert stopping.fields["STATUS"].startswith("draining")
    assert writer.wait_exit(30) == 0


@pytest.mark.slow
# The standalone case waits out the same trust window: 10 s or more of real time, .ci/run runs
# it (pytest -m soak); the lease case proves the window in the default tier.
@pytest.mark.parametrize(
    "shared", [True, pytest.param(False, marks=pytest.mark.soak)], ids=["lease", "standalone"]
)
def test_watchdog_pings_stop_within_the_trust_window_when_postgres_stalls(cluster, db_proxy, notify, shared):
    """A writer with a lease stops pinging when trust runs out (and exits 75); a standalone
    writer stops when its read pins can no longer be written, and pings again once they are."""
    proxied = db_proxy.url_for(cluster.database_url)
    writer = cluster.writer(
        cluster.shared_env() if shared else None, ARKVORY_DATABASE_URL=proxied, **notify.env(watchdog_s=WATCHDOG_S)
    )
    ready = notify.wait_for("READY")
    eventually(lambda: len(watchdog_pings(notify, after=ready.at)) >= 3, "three watchdog pings")
    db_proxy.stall()
    stalled = time.monotonic()
    try:
        deadline = stalled + TRUST_S + 3.0
        while time.monotonic() < deadline and writer.proc.poll() is None:
            time.sleep(0.2)
        pings = watchdog_pings(notify, after=stalled)
        assert pings, "pings went on right after the stall, while trust was left"
        assert pings[-1] - stalled <= TRUST_S + 0.3, pings[-1] - stalled
        # ... and none since: the gap to now is well past the watchdog period.
        assert time.monotonic() - pings[-1] >= 2.0
        if shared:
            assert writer.wait_exit(10) == 75
            assert "lease lost" in notify.with_key("STOPPING")[0].fields["STATUS"]
        else:
            assert writer.proc.poll() is None  # no lease to lose; systemd's watchdog acts
    finally:
        db_proxy.resume()
    if not shared:
        resumed = time.monotonic()
        notify.wait_for("WATCHDOG", after=resumed, timeout=10)
        writer.signal(signal.SIGTERM)
        assert writer.wait_exit(30) == 0


def test_a_gateway_says_its_slot(cluster, notify):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(2, shared, **notify.env(watchdog_s=WATCHDOG_S))
    ready = notify.wait_for("READY")
    assert ready.fields["STATUS"].startswith("gateway, slot 2 of 3: ready; lease trusted ")
    gateway.wait_ready()


# -- the worker ----------------------------------------------------------------------------


def test_the_worker_is_ready_when_active_or_standing_by(cluster):
    cluster.writer().wait_ready()
    first_socket, second_socket = NotifySocket(), NotifySocket()
    try:
        first = start_worker(cluster, "first", real=True, **first_socket.env(watchdog_s=WATCHDOG_S))
        ready = first_socket.wait_for("READY")
        assert ready.fields["STATUS"].startswith("worker: active")
        assert first.status() == "active"
        second = start_worker(cluster, "second", real=True, **second_socket.env(watchdog_s=WATCHDOG_S))
        standby = second_socket.wait_for("READY")
        assert standby.fields["STATUS"].startswith("worker: standby")
        for sock in (first_socket, second_socket):
            eventually(lambda sock=sock: len(watchdog_pings(sock)) >= 3, "three watchdog pings")
        first.signal(signal.SIGTERM)
        assert first_socket.wait_for("STOPPING", timeout=10).fields["STATUS"] == "worker: draining"
        assert first.wait_exit(30) == 0
        # The standby takes over; systemd hears of it from STATUS.
        taken = second_socket.wait_for("STATUS", after=time.monotonic(), timeout=15)
        while not taken.fields["STATUS"].startswith("worker: active"):
            taken = second_socket.wait_for("STATUS", after=taken.at, timeout=15)
        second.signal(signal.SIGTERM)
        second_socket.wait_for("STOPPING", timeout=10)
        assert second.wait_exit(30) == 0
    finally:
        first_socket.close()
        second_socket.close()
