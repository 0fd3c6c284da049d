"""The gateway is read-only on every path, before authentication (SPEC §6), and says so."""

from __future__ import annotations

import httpx
import pytest

from .harness import ADMIN_TOKEN, READER_TOKEN

pytestmark = pytest.mark.timeout(120)

PATHS = [
    "/api/v1/login",
    "/api/v1/register",
    "/api/v1/repositories",
    "/api/v1/repositories/demo/artifacts",
    "/api/v1/repositories/demo/artifacts/00000000-0000-0000-0000-000000000000/content",
    "/api/v1/tasks",
    "/console/",
    "/health/status",
    "/no/such/route",
]


@pytest.fixture(scope="module")
def gateway(module_cluster):
    """One writer and gateway for the module: its tests only read and are refused."""
    shared = module_cluster.shared_env()
    module_cluster.writer(shared).wait_ready()
    return module_cluster.gateway(1, shared).wait_ready()


@pytest.mark.parametrize("token", [None, ADMIN_TOKEN, "not-a-valid-token"])
def test_every_change_is_refused_with_405_read_only(gateway, token):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            for path in PATHS:
                answer = client.request(method, path, content=b'{"name": "x"}')
                assert answer.status_code == 405, (method, path, answer.text)
                assert answer.headers["Allow"] == "GET, HEAD"
                body = answer.json()
                assert body["code"] == "read_only"
                assert body["requestId"] == answer.headers["X-Request-Id"]


def test_console_is_absent_on_a_gateway(gateway):
    with gateway.client() as client:
        assert client.get("/console/").status_code == 404


def test_readiness_shows_a_read_only_gateway(gateway):
    with gateway.client(READER_TOKEN) as client:
        ready = client.get("/health/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["role"] == "reader"
    assert body["writable"] is False
    assert body["status"] == "ready"
    shared = body["sharedDownloads"]
    assert shared["slot"] == 1 and shared["slots"] == 3 and shared["active"] is True
    assert 0 < shared["leaseSeconds"] <= 8
    assert body["schemaVersion"] >= 2


def test_readiness_and_metrics_need_a_key_but_status_and_live_do_not(gateway):
    with httpx.Client(base_url=gateway.url, timeout=10) as anonymous:
        assert anonymous.get("/health/ready").status_code == 401
        assert anonymous.get("/health/metrics").status_code == 401
        assert anonymous.get("/health/status").json() == {"status": "ready"}
        assert anonymous.get("/health/live").json() == {"status": "ok"}
    with gateway.client() as client:
        metrics = client.get("/health/metrics").text
    assert "arkvory_lease_renewals_total" in metrics
    assert "arkvory_lease_trust_remaining_seconds" in metrics
    assert "arkvory_http_requests_total" in metrics


def test_standalone_writer_reports_no_shared_downloads(cluster):
    writer = cluster.writer().wait_ready()
    with writer.client() as client:
        body = client.get("/health/ready").json()
    assert body["role"] == "api" and body["writable"] is True
    assert body["sharedDownloads"] is None
