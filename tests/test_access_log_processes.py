"""The access log of real processes (ARKVORY_ACCESS_LOG=text|json, issue 24 item 4): a line with
every field for a 200, a 206 with its Range, a 304, a 401, a 404, a refused head and a download
cut by a lost lease; the client's address through a trusted balancer; no token, cookie or
password in any line whatever credential a request carries; the writer, a gateway and the
worker's health port alike. The edge's side in one process: tests/test_access_log.py."""

from __future__ import annotations

import base64
import json
import re
import socket
import uuid

import httpx
import pytest

from arkvory.shared.http.refusals import MAX_HEAD_BYTES

from .harness import ADMIN_TOKEN, READER_TOKEN, eventually
from .test_access_log import parse
from .test_accounts import PASSWORD, make_account, session_of
from .test_lease_loss_downloads import SHARED, SIZE, ending, lose_lease, read_head, send_request
from .test_lease_processes import upload
from .worker_harness import start_worker

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

CONTENT = "/api/v1/repositories/{repo}/artifacts/{id}/content"
def access_lines(stderr: str) -> list[dict]:
    """The access lines of a process's stderr, text or JSON, as dicts of their fields."""
    return [
        parse(line) for line in stderr.splitlines()
        if " INFO arkvory.access: " in line or line.startswith('{"time"') and '"logger": "arkvory.access"' in line
    ]


def lines_by_request_id(process, count: int) -> dict[str, dict]:
    """Once the process has written at least `count` lines: by request id."""
    found = eventually(lambda: len(access_lines(process.stderr)) >= count and access_lines(process.stderr), f"{count} access lines")
    return {line["request_id"]: line for line in found}


def normal(line: dict) -> dict:
    """A line's fields but its duration."""
    return {k: v for k, v in line.items() if k != "duration_ms"}


def head_too_large(process) -> bytes:
    with socket.create_connection(("127.0.0.1", process.port), timeout=10) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: t\r\nX-Padding: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_line_for_every_kind_of_answer_with_every_field(cluster, log_format):
    """On a gateway behind a balancer it trusts (127.0.0.1: the client's address is the
    balancer's X-Forwarded-For), throttled so that a 4 MiB download is still sending when the
    gateway's lease is lost."""
    shared = cluster.shared_env(**SHARED)
    writer = cluster.writer(shared).wait_ready()
    artifact = upload(writer, "logged", b"0123456789" * 1000)
    large = upload(writer, "logged", bytes(SIZE))
    gateway = cluster.gateway(
        1, shared, ARKVORY_ACCESS_LOG=log_format, ARKVORY_TRUSTED_PROXIES="127.0.0.1"
    ).wait_ready()
    path = CONTENT.format(repo="logged", id=artifact)
    balancer = {"X-Forwarded-For": "198.51.100.9, 203.0.113.7"}  # the client's own hop, then the balancer's
    with httpx.Client(base_url=gateway.url, timeout=10, headers=balancer) as client:
        def get(rid: str, token: str | None = READER_TOKEN, url: str = path, **headers: str) -> httpx.Response:
            if token:
                headers["Authorization"] = f"Bearer {token}"
            return client.get(url, headers={"X-Request-Id": rid, **headers})

        whole = get("t-200")
        partial = get("t-206", Range="bytes=10-19")
        unchanged = get("t-304", **{"If-None-Match": whole.headers["etag"]})
        refused = get("t-401", token="not-a-token")
        missing = get("t-404", url="/no/such/route")
    assert [r.status_code for r in (whole, partial, unchanged, refused, missing)] == [200, 206, 304, 401, 404]
    too_large = head_too_large(gateway)
    assert too_large.startswith(b"HTTP/1.1 431 ")
    refusal_id = json.loads(too_large.partition(b"\r\n\r\n")[2])["requestId"]
    cut = send_request(gateway, f"GET {CONTENT.format(repo='logged', id=large)} HTTP/1.1")
    assert read_head(cut).startswith(b"HTTP/1.1 200")
    lines = lines_by_request_id(gateway, 6)  # the 6 answered before the loss
    lose_lease(cluster.database_url, 1)
    assert ending(cut) == "reset"
    assert gateway.wait_exit(20) == 75

    lines = {line["request_id"]: line for line in access_lines(gateway.stderr)}
    route = "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content"
    common = {"client": "203.0.113.7", "method": "GET", "route": route, "path": path, "bytes_received": 0, "end": "complete"}
    expected = {
        "t-200": {**common, "principal": "key:reader", "status": 200, "bytes_sent": 10000, "range": None},
        "t-206": {**common, "principal": "key:reader", "status": 206, "bytes_sent": 10, "range": "bytes=10-19"},
        "t-304": {**common, "principal": "key:reader", "status": 304, "bytes_sent": 0, "range": None},
        "t-401": {**common, "principal": "anonymous", "status": 401, "range": None},
        "t-404": {
            **common, "principal": "anonymous", "status": 404, "route": "unmatched", "path": "/no/such/route",
            "range": None,
        },
        # The edge's own answer: no app saw the request (its head was never parsed whole).
        refusal_id: {
            "client": "127.0.0.1", "principal": "anonymous", "method": None, "route": None, "path": None,
            "status": 431, "bytes_received": 0, "range": None, "end": "complete",
        },
    }
    every_field = {
        "client", "principal", "method", "route", "path", "status", "bytes_sent", "bytes_received",
        "duration_ms", "request_id", "range", "end",
    }
    for rid, fields in expected.items():
        assert every_field <= set(lines[rid]), lines[rid]
        got = normal(lines[rid])
        if "bytes_sent" not in fields:  # an error's JSON
            assert got.pop("bytes_sent") > 0, got
        assert {k: v for k, v in got.items() if k != "request_id"} == fields, rid
        assert 0 <= float(lines[rid]["duration_ms"]) < 10_000
    (cut_line,) = [line for line in lines.values() if (line["path"] or "").endswith(f"/{large}/content")]
    assert (cut_line["status"], cut_line["end"], cut_line["client"]) == (200, "cut", "127.0.0.1")  # (no balancer)
    assert 0 < cut_line["bytes_sent"] < SIZE
    # One line per request: the rest are the harness's polls of /health/status.
    assert len([line for line in lines.values() if line["path"] != "/health/status"]) == 7
    if log_format == "json":
        assert all(json.loads(line)["level"] == "info" for line in gateway.stderr.splitlines() if '"arkvory.access"' in line)
    else:
        assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO arkvory.access: client=", line)
                   for line in gateway.stderr.splitlines() if "arkvory.access" in line)


def test_no_credential_in_any_line_whatever_the_request_carries(cluster):
    """Every credential kind, on the writer (API, console with its cookie, login with a
    password, a token as HTTP Basic's password), a gateway and the worker's health port: the lines name each principal by its
    id and hold no token, cookie or password. The writer trusts no balancer: a forwarded
    address is not believed, and said once."""
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared, ARKVORY_ACCESS_LOG="text").wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_ACCESS_LOG="json").wait_ready()
    worker = start_worker(cluster, real=True, ARKVORY_ACCESS_LOG="json").wait_active()
    account = f"bob-{uuid.uuid4().hex[:8]}"
    make_account(writer, account)
    session = session_of(writer, account)
    with writer.client(session) as client:
        pat = client.post("/api/v1/tokens", json={"access": "read"}).json()["token"]
    with writer.client(ADMIN_TOKEN) as admin:
        key = admin.post("/api/v1/keys", json={"scopes": ["read:*"], "label": "ci"}).json()["token"]
    secrets = [ADMIN_TOKEN, READER_TOKEN, session, pat, key, PASSWORD]
    # The secret half of each database token too, alone (a line might cut a token at its dot).
    secrets += [token.split(".", 1)[1] for token in (session, pat, key)]

    basic = {token: base64.b64encode(f"anyone:{token}".encode()).decode() for token in (ADMIN_TOKEN, pat, key)}
    secrets += list(basic.values())
    for process in (writer, gateway):
        for token in (ADMIN_TOKEN, READER_TOKEN, session, pat, key):
            with process.client(token) as client:
                assert client.get("/health/ready", headers={"X-Forwarded-For": "192.0.2.1"}).status_code == 200
        # HTTP Basic with a token as the password: the same principals, the header in no line.
        for encoded in basic.values():
            with httpx.Client(base_url=process.url, timeout=10) as client:
                answer = client.get("/health/ready", headers={"Authorization": f"Basic {encoded}", "X-Request-Id": "t-basic"})
                assert answer.status_code == 200
    with httpx.Client(base_url=writer.url, timeout=10) as browser:
        browser.cookies.set("arkvory_session", session)
        assert browser.get("/console/repositories").status_code == 200  # (an account's landing page)
        assert browser.post("/api/v1/login", json={"name": account, "password": PASSWORD}).status_code == 200
    with httpx.Client(base_url=worker.url, timeout=10, headers={"Authorization": f"Bearer {key}"}) as client:
        assert client.get("/health/ready").status_code == 200

    # Lines are written in order: the last request's line is the last one.
    eventually(lambda: [line["path"] for line in access_lines(writer.stderr)].count("/api/v1/login") == 2, "the writer's lines")
    eventually(lambda: len(access_lines(gateway.stderr)) >= 8, "the gateway's lines")
    # (The harness's own readiness probes have lines too: wait for this request's.)
    eventually(lambda: any(line["path"] == "/health/ready" and line["principal"].startswith("service:")
                           for line in access_lines(worker.stderr)), "the worker's line")
    principals = {line["principal"] for line in access_lines(writer.stderr) if line["path"] == "/health/ready"}
    assert "key:admin" in principals and "key:reader" in principals
    assert sum(p.startswith("account:") for p in principals) == 1 and sum(p.startswith("service:") for p in principals) == 1
    for process in (writer, gateway):
        by_basic = sorted(line["principal"] for line in access_lines(process.stderr) if line["request_id"] == "t-basic")
        assert len(by_basic) == 3 and "key:admin" in by_basic, by_basic
        assert sum(p.startswith("account:") for p in by_basic) == 1 and sum(p.startswith("service:") for p in by_basic) == 1
    console = [line for line in access_lines(writer.stderr) if line["path"] == "/console/repositories"]
    assert console and console[0]["principal"].startswith("account:"), console
    assert {line["client"] for line in access_lines(writer.stderr)} == {"127.0.0.1"}
    assert writer.stderr.count("carried X-Forwarded-For, which is ignored") == 1
    (worker_line,) = [line for line in access_lines(worker.stderr)
                      if line["path"] == "/health/ready" and line["principal"].startswith("service:")]
    assert worker_line["status"] == 200
    for process in (writer, gateway, worker):
        log = process.stderr
        for secret in secrets:
            assert secret not in log, (process.name, secret)
