"""Every answer of every process carries a real request id: `X-Request-Id`, and the same id as
`requestId` in an error's JSON (the writer, a gateway and the worker's health port alike)."""

from __future__ import annotations

import re
import socket

import httpx
import pytest

from .harness import ADMIN_TOKEN
from .worker_harness import start_worker

pytestmark = pytest.mark.timeout(90)

RID = re.compile(r"^[0-9a-f]{12}-[0-9a-f]+$")


def answers(base: str, paths: dict[str, str]) -> list[httpx.Response]:
    """A 200, a 401, a 404, a 405 and a 400 (two Authorization headers) from `base`."""
    got = []
    with httpx.Client(base_url=base, timeout=10) as client:
        got.append(client.get(paths["open"]))
        got.append(client.get(paths["needs_key"]))
        got.append(client.get("/no/such/route"))
        got.append(client.request("PATCH", paths["open"]))
        got.append(client.get(
            paths["needs_key"],
            headers=[("Authorization", f"Bearer {ADMIN_TOKEN}"), ("Authorization", "Bearer other")],
        ))
    return got


def check(responses: list[httpx.Response], statuses: list[int]) -> None:
    assert [r.status_code for r in responses] == statuses
    ids = [r.headers.get("x-request-id") for r in responses]
    assert all(rid and RID.match(rid) for rid in ids), ids
    assert len(set(ids)) == len(ids)
    for response in responses:
        if response.status_code >= 400:
            assert response.json()["requestId"] == response.headers["x-request-id"], response.text


def test_the_worker_health_port(cluster):
    cluster.writer().wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    responses = answers(worker.url, {"open": "/health/live", "needs_key": "/health/ready"})
    check(responses, [200, 401, 404, 405, 400])
    # An id the client chose (a balancer's) is kept.
    offered = httpx.get(f"{worker.url}/health/ready", headers={"X-Request-Id": "lb-1234"}, timeout=5)
    assert offered.headers["x-request-id"] == "lb-1234" and offered.json()["requestId"] == "lb-1234"


def test_the_writer_and_a_gateway(cluster):
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    paths = {"open": "/health/status", "needs_key": "/health/ready"}
    check(answers(writer.url, paths), [200, 401, 404, 405, 400])
    # A gateway answers every method but GET and HEAD with 405 read_only, before routing.
    check(answers(gateway.url, paths), [200, 401, 404, 405, 400])


@pytest.mark.parametrize("process", ["writer", "worker"])
def test_a_request_the_http_parser_refuses(cluster, process):
    """Not even a request line: the answer is still JSON with an id."""
    writer = cluster.writer().wait_ready()
    port = writer.port if process == "writer" else start_worker(cluster, real=True).wait_active().port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), raw
    rid = re.search(rb"(?im)^x-request-id: (\S+)\r?$", head)
    assert rid, raw
    assert httpx.Response(400, content=body).json()["requestId"] == rid.group(1).decode()
