"""A store outage behind the shipped balancers (SPEC §8, §11): a writer and two gateways with
read caches on a real SeaweedFS, the real deploy/haproxy and deploy/nginx configurations in front,
and the store killed. Every process reports `degraded` and stays in the pool, so through either
balancer a cached blob is still served; a blob no process has cached, and an upload, get the
process's own 503 `unavailable` with Retry-After and the JSON error (never the balancer's own
page); and once the store is back everything serves again, with no restart.

Before `degraded` every process reported `unavailable`: HAProxy took them all out and answered
every request itself (a bare 503, no Retry-After), and nginx, counting the processes' 503s as
failures, marked them all failed and answered 502 "no live upstreams", cached blobs included.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .balancers import running_balancer
from .harness import ADMIN_TOKEN, eventually

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

KiB, MiB = 1024, 1024 * 1024
REPO = "builds"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CACHE = str(64 * MiB)
# HAProxy's checks (deploy/haproxy/haproxy.cfg): `fall 2` at `inter 2s`. A server answering 503
# this many times in a row would be out of the pool; the writer is checked by both backends.
CHECKS_SEEN = {"writer": 5, "gateway": 3}


def health_checks_answered(process) -> float:
    """How many GET /health/status this process has answered with 200."""
    with process.client() as client:
        text = client.get("/health/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "arkvory_http_requests_total" and sample.labels == {
                "method": "GET", "route": "/health/status", "status": "200"
            }:
                return sample.value
    return 0.0


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_cache_files(process) -> int:
    return (process.ready().get("readCache") or {}).get("files", 0)


def assert_own_unavailable(answer: httpx.Response, what: str) -> None:
    """A 503 written by an Arkvory process: its JSON error, Retry-After and request id."""
    assert answer.status_code == 503, f"{what}: {answer.status_code} {answer.text[:200]}"
    assert answer.headers.get("content-type", "").startswith("application/json"), f"{what}: {answer.text[:200]}"
    body = answer.json()
    assert body["code"] == "unavailable" and body["requestId"] == answer.headers["X-Request-Id"], body
    assert int(answer.headers["Retry-After"]) >= 1, what


@pytest.mark.soak  # 10 s or more of real time (the store's restart): .ci/run runs it (pytest -m soak)
def test_a_store_outage_behind_haproxy_and_nginx_serves_cached_blobs_and_the_processes_own_503s(
    s3_cluster, seaweedfs, tmp_path
):
    shared = s3_cluster.shared_env(slots=3)
    writer = s3_cluster.writer(shared, ARKVORY_CACHE_MAX_BYTES=CACHE).wait_ready()
    gateways = [s3_cluster.gateway(slot, shared, ARKVORY_CACHE_MAX_BYTES=CACHE).wait_ready() for slot in (1, 2)]
    processes = [writer, *gateways]
    cached, cold = os.urandom(2 * MiB + 1), os.urandom(MiB + 2)
    with writer.client(timeout=60) as client:
        assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        made = {}
        for name, data in (("cached", cached), ("cold", cold)):
            answer = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": name}, content=data)
            assert answer.status_code == 201, answer.text
            made[name] = f"/api/v1/repositories/{REPO}/artifacts/{answer.json()['id']}/content"
    for process in processes:  # a whole read fills the cache of the process that serves it
        with process.client(timeout=60) as client:
            assert client.get(made["cached"]).content == cached
        eventually(lambda: read_cache_files(process) == 1, f"{process.name} caching the blob", timeout=30)

    ports = {"127.0.0.1:8080": writer.port, "127.0.0.1:8081": gateways[0].port, "127.0.0.1:8082": gateways[1].port}
    with (
        running_balancer("haproxy", tmp_path / "haproxy", ports, stats=True) as haproxy,
        running_balancer("nginx", tmp_path / "nginx", ports) as nginx,
    ):
        fronts = (haproxy, nginx)
        for front in fronts:
            with httpx.Client(base_url=front.url, headers=AUTH, timeout=30) as client:
                # A range of a blob is read from the store alone: it stays out of every cache.
                part = client.get(made["cold"], headers={"Range": "bytes=0-99"})
                assert part.status_code == 206 and part.content == cold[:100]
        assert [read_cache_files(process) for process in processes] == [1, 1, 1]

        seaweedfs.kill()
        for process in processes:
            with process.client() as client:
                # A failed read asks the probe to look at once; its verdict makes the process
                # degraded, and it stays in the pool (/health/status 200).
                assert_own_unavailable(client.get(made["cold"]), f"{process.name} directly")
            eventually(lambda: process.status() == (200, "degraded"), f"{process.name} degraded", timeout=15)
        ready = writer.ready()
        assert ready["status"] == "degraded" and ready["storage"] == "unavailable" and ready["writable"] is False
        assert ready["parts"] == {
            "database": "available", "lease": "trusted", "storage": "unavailable", "readCache": "available"
        }
        assert ready["readCache"]["files"] == 1 and ready["readCache"]["maxBytes"] == int(CACHE)

        # Long enough for HAProxy's checks to take every process out, were it to answer 503.
        seen = {process.name: health_checks_answered(process) for process in processes}
        for process in processes:
            wanted = seen[process.name] + CHECKS_SEEN["writer" if process is writer else "gateway"]
            eventually(lambda: health_checks_answered(process) >= wanted, f"HAProxy checking {process.name}",
                       timeout=30, every=0.5)
        servers = haproxy.servers()
        assert {key: (row["status"], row["check_code"]) for key, row in servers.items()} == {
            ("arkvory_writer", "writer"): ("UP", "200"),
            ("arkvory_content", "writer"): ("UP", "200"),
            ("arkvory_content", "gateway1"): ("UP", "200"),
            ("arkvory_content", "gateway2"): ("UP", "200"),
        }

        sessions = {}
        for front in fronts:
            with httpx.Client(base_url=front.url, headers=AUTH, timeout=30) as client:
                # Not cached anywhere: every process tried answers 503 (nginx counts each as a
                # failure and soon marks them all failed), and the last one's answer comes through.
                for _ in range(4):
                    assert_own_unavailable(client.get(made["cold"]), f"the cold blob through {front.kind}")
                for _ in range(6):  # cached on each process: served, whichever the balancer picks
                    answer = client.get(made["cached"])
                    assert answer.status_code == 200, f"{front.kind}: {answer.status_code} {answer.text[:200]}"
                    assert sha256(answer.content) == sha256(cached)
                assert client.head(made["cold"]).status_code == 200  # needs no blob
                assert client.get("/api/v1/repositories").status_code == 200  # the writer's, needs no store
                upload = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": "new"}, content=b"x" * KiB)
                assert_own_unavailable(upload, f"an upload through {front.kind}")
                # A resumable upload's parts go to the writer's disk: received; its complete
                # needs the store, and waits for it.
                sessions[front.kind] = session = client.post(
                    f"/api/v1/repositories/{REPO}/uploads", headers={"Idempotency-Key": uuid.uuid4().hex},
                    json={"name": f"resumed-{front.kind}", "size": len(cold), "sha256": sha256(cold)},
                ).json()
                part = client.put(f"/api/v1/repositories/{REPO}/uploads/{session['id']}/content", content=cold)
                assert part.status_code in (200, 201, 204), part.text
                completed = client.post(f"/api/v1/repositories/{REPO}/uploads/{session['id']}/complete")
                assert_own_unavailable(completed, f"a complete through {front.kind}")
        assert "no live upstreams" not in (tmp_path / "nginx" / "error.log").read_text()

        seaweedfs.start()
        for process in processes:
            process.wait_ready(timeout=60)  # by itself: the probe sees the store again
        for front in fronts:
            with httpx.Client(base_url=front.url, headers=AUTH, timeout=60) as client:
                for _ in range(3):
                    assert client.get(made["cold"]).content == cold
                answer = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": front.kind},
                                     content=cold)
                assert answer.status_code == 201, answer.text
                session = sessions[front.kind]
                completed = client.post(f"/api/v1/repositories/{REPO}/uploads/{session['id']}/complete")
                assert completed.status_code == 201 and completed.json()["sha256"] == sha256(cold), completed.text
    assert all(process.proc.poll() is None for process in processes)  # nothing restarted
