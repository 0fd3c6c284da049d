"""The slot lease with real processes and the real timings: 10 s reservation, 2 s renewal,
8 s local trust, 15 s start-up wait (SPEC §4)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from arkvory.shared.cluster.lease import _RENEW, RESERVATION_S

from .harness import ADMIN_TOKEN, db_execute as execute, db_fetch as query, eventually, run_arkvory

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def lease_row(database_url: str, slot: int):
    rows = query(
        database_url,
        "SELECT holder_id, generation, pid, expires_at, expires_at > now() AS live,"
        " extract(epoch FROM expires_at - now()) AS remaining"
        " FROM arkvory_gateway_leases WHERE slot = $1",
        slot,
    )
    return rows[0] if rows else None


def upload(writer, repo: str, data: bytes) -> str:
    with writer.client() as client:
        created = client.post("/api/v1/repositories", json={"name": repo})
        assert created.status_code in (201, 409), created.text
        answer = client.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "blob.bin"}, content=data)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]


def test_second_process_on_a_live_slot_stops_with_busy(cluster):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    cluster.gateway(1, shared).wait_ready()
    started = time.monotonic()
    result = run_arkvory(
        cluster.base_env(ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", **shared), timeout=30
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert "busy" in result.stderr
    assert elapsed <= 15


def test_replacement_after_kill_waits_for_the_reservation(cluster):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    old = cluster.gateway(1, shared).wait_ready()
    before = lease_row(cluster.database_url, 1)
    old.proc.send_signal(signal.SIGKILL)
    old.proc.wait(5)
    killed_at = time.monotonic()
    remaining_at_kill = float(lease_row(cluster.database_url, 1)["remaining"])

    replacement = cluster.gateway(1, shared)
    replacement.wait_ready(timeout=20)
    waited = time.monotonic() - killed_at
    after = lease_row(cluster.database_url, 1)

    # It could not start before the old reservation ran out, and did not wait longer than 15 s.
    assert waited >= remaining_at_kill - 0.5
    assert waited <= 15
    assert after["generation"] == before["generation"] + 1
    assert after["holder_id"] != before["holder_id"]
    with replacement.client() as client:
        assert client.get("/health/ready").json()["sharedDownloads"]["generation"] == after["generation"]
    # The old holder's renewal is fenced off.
    assert execute(cluster.database_url, _RENEW, 1, before["holder_id"], before["generation"], RESERVATION_S) == "UPDATE 0"


def test_stalled_database_makes_the_gateway_unavailable_and_it_never_serves_again(cluster, db_proxy):
    shared = cluster.shared_env()
    cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url))
    gateway.wait_ready()

    db_proxy.stall()
    stalled_at = time.monotonic()
    seen_unavailable = None
    while time.monotonic() - stalled_at < 12:
        state = gateway.status()
        if state == (503, "unavailable"):
            seen_unavailable = time.monotonic() - stalled_at
            with gateway.client() as client:
                assert client.get("/health/ready").status_code == 503
            break
        time.sleep(0.1)
    assert seen_unavailable is not None, gateway.stderr
    assert seen_unavailable <= 9.5  # 8 s of trust, counted from the last renewal *sent*
    expires_at_loss = lease_row(cluster.database_url, 1)["expires_at"]

    db_proxy.resume()
    # It exits 75 for its service manager; while it still runs, it never reports ready.
    deadline = time.monotonic() + 10
    while gateway.proc.poll() is None and time.monotonic() < deadline:
        assert gateway.status() in (None, (503, "unavailable"))
        time.sleep(0.1)
    assert gateway.wait_exit(5) == 75
    assert "lease LOST" in gateway.stderr

    replacement = cluster.gateway(1, shared).wait_ready(timeout=20)
    started = query(
        cluster.database_url,
        "SELECT acquired_at FROM arkvory_gateway_leases WHERE slot = 1",
    )[0]["acquired_at"]
    assert started >= expires_at_loss  # only after the old reservation expired
    assert replacement.proc.poll() is None


@pytest.mark.soak  # 10 s or more of real time (the trust window stays proven by the stalled database case): .ci/run runs it (pytest -m soak)
def test_stopped_gateway_does_not_serve_after_sigcont(cluster):
    shared = cluster.shared_env()
    writer = cluster.writer(shared).wait_ready()
    artifact = upload(writer, "stopped", b"x" * 1000)
    gateway = cluster.gateway(1, shared).wait_ready()
    path = f"/api/v1/repositories/stopped/artifacts/{artifact}/content"
    with gateway.client() as client:
        assert client.get(path).status_code == 200

    gateway.signal(signal.SIGSTOP)
    time.sleep(RESERVATION_S + 1)
    gateway.signal(signal.SIGCONT)
    # The very first answers after waking must already refuse.
    with gateway.client() as client:
        try:
            answer = client.get(path)
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] == "unavailable"
        except httpx.TransportError:
            pass  # already gone: also not serving
    assert gateway.wait_exit(10) == 75


def test_sigterm_drains_in_flight_download_then_exits_zero_keeping_the_reservation(cluster):
    # 3 slots sharing 768 KiB/s: 256 KiB/s for the gateway, so 1 MiB takes about 4 s.
    shared = cluster.shared_env(slots=3, total=3 * 256 * 1024)
    writer = cluster.writer(shared).wait_ready()
    data = bytes(range(256)) * 4096
    artifact = upload(writer, "drain", data)
    gateway = cluster.gateway(1, shared).wait_ready()
    received: dict[str, object] = {}

    def download():
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            answer = client.get(f"{gateway.url}/api/v1/repositories/drain/artifacts/{artifact}/content")
            received["status"], received["body"] = answer.status_code, answer.content

    thread = threading.Thread(target=download)
    thread.start()
    with gateway.client() as client:
        eventually(
            lambda: client.get("/health/ready").json()["transfers"]["downloads"]["admission"]["active"] == 1,
            "the download under way",
        )
    gateway.signal(signal.SIGTERM)
    eventually(lambda: gateway.status() == (503, "draining"), "draining after SIGTERM", timeout=5)
    with gateway.client() as client:
        refused = client.get(f"/api/v1/repositories/drain/artifacts/{artifact}/content")
    assert refused.status_code == 503 and refused.json()["code"] == "busy"
    assert "Retry-After" in refused.headers
    thread.join(30)
    assert received["status"] == 200 and received["body"] == data
    assert gateway.wait_exit(20) == 0
    row = lease_row(cluster.database_url, 1)
    assert row is not None and row["live"], "the reservation must be kept after a graceful stop"


@pytest.mark.soak  # 10 s or more of real time (the trust window stays proven by the stalled database case): .ci/run runs it (pytest -m soak)
def test_writer_that_lost_its_lease_refuses_changes_too(cluster, db_proxy):
    shared = cluster.shared_env()
    writer = cluster.writer(shared, ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url))
    writer.wait_ready()
    db_proxy.stall()
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline and writer.status() != (503, "unavailable"):
        time.sleep(0.1)
    with writer.client() as client:
        try:
            answer = client.post("/api/v1/repositories", json={"name": "late"})
            assert answer.status_code == 503 and answer.json()["code"] == "unavailable"
            assert answer.headers["Retry-After"] == "2"
        except httpx.TransportError:
            pass  # already exited
    assert writer.wait_exit(10) == 75
