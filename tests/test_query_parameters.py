"""A query parameter a route does not declare is 400 naming it, on every /api/v1 route of the writer
and on the content routes of a gateway, before anything else (issue 25: `?sha256=` was ignored and
answered the whole list); so is one given twice. The declarations are the OpenAPI document's (the
content routes': shared/download/content.py's, which the document repeats), and each route is
called with each parameter it declares: none is refused as unknown, none reads one it does not
declare (shared/http/query.py's `query_value` would answer 500)."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import pytest

from arkvory.shared.download.content import QUERY_PARAMETERS
from arkvory.writer.request_inputs import declared_query_parameters

from .harness import ADMIN_TOKEN, db_fetch
from .test_openapi import built_app

pytestmark = pytest.mark.timeout(180)

UNKNOWN = "zz_unknown"


@pytest.fixture(scope="module")
def site(module_cluster, module_database_url):
    shared = module_cluster.shared_env(slots=2)
    writer = module_cluster.writer(shared).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "walk"}).status_code == 201
        artifact = client.post("/api/v1/repositories/walk/artifacts", params={"name": "a.bin"}, content=b"abc").json()
        client.put("/api/v1/repositories/walk/packages",
                   json={"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"]})
        client.put("/api/v1/repositories/walk/assets", params={"path": "p"}, json={"artifactId": artifact["id"]})
    gateway = module_cluster.gateway(1, shared).wait_ready()
    return {"writer": writer, "gateway": gateway, "artifact": artifact, "database_url": module_database_url}


def operations() -> list[tuple[str, str, frozenset[str]]]:
    """(method, path, declared query parameters) of every /api/v1 route of the writer app."""
    app = built_app()
    document = json.loads(app.state.openapi_json)
    found = []
    for route in app.routes:
        if route.path.startswith("/api/v1/"):
            for method in sorted(route.methods or ()):
                found.append((method, route.path, declared_query_parameters(document, route.path, method.lower())))
    return found


OPERATIONS = operations()
CHANGES = ("POST", "PUT", "PATCH", "DELETE")
# A value for each parameter a route declares, that gets the request past its own checks.
VALUES = {"limit": "2", "order": "newest", "prefix": "a", "name": "n", "group": "g", "version": "1", "path": "p",
          "sha256": "0" * 64, "historyLimit": "1", "kind": "cleanup", "status": "queued", "problem": "missing",
          "force": "false", "after": "0", "mediaType": "application/octet-stream", "cursor": "WyJ4Il0"}


def url_of(site, method: str, path: str) -> str:
    """The route with its path filled: things that exist for a read, a missing repository for a
    change (so the walk changes nothing)."""
    values = {"repo": "walk" if method in ("GET", "HEAD") else "nosuch", "artifact_id": site["artifact"]["id"],
              "name": "nobody", "account": "nobody", "index": "1"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), str(uuid.UUID(int=5))), path)


def test_the_content_routes_declare_in_the_document_what_every_process_checks():
    document_declared = {path: declared for method, path, declared in OPERATIONS if path in QUERY_PARAMETERS}
    assert document_declared == QUERY_PARAMETERS
    assert "sha256" in dict(((m, p), d) for m, p, d in OPERATIONS)[("GET", "/api/v1/repositories/{repo}/artifacts")]


def test_every_route_refuses_an_unknown_parameter_and_takes_each_declared_one(site):
    problems = []
    with httpx.Client(base_url=site["writer"].url, timeout=20, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        for method, path, declared in OPERATIONS:
            url = url_of(site, method, path)
            try:
                answer = client.request(method, url, params={UNKNOWN: "1"}, content=b"{}" if method in CHANGES else None)
            except httpx.TransportError as exc:
                problems.append(f"{method} {path} ?{UNKNOWN}: {exc!r}")
                continue
            if answer.status_code != 400 or (method != "HEAD" and UNKNOWN not in answer.json()["message"]):
                problems.append(f"{method} {path} ?{UNKNOWN}: {answer.status_code} {answer.text[:200]}")
            # Every declared parameter at once (but a cursor, which fits only its own list), then each
            # alone: never "unknown", never a 500.
            together = {name: VALUES.get(name, "1") for name in declared if name != "cursor"}
            for params in [together, *({name: VALUES.get(name, "1")} for name in sorted(declared))]:
                try:
                    answer = client.request(method, url, params=params, content=b"{}" if method in CHANGES else None)
                except httpx.TransportError as exc:  # a 500 may close the connection
                    problems.append(f"{method} {path} {params}: {exc!r}")
                    continue
                # (A 400's message, not any text: the OpenAPI document itself says "unknown query parameter".)
                text = answer.text if method != "HEAD" and answer.status_code == 400 else ""
                if answer.status_code >= 500 or "unknown query parameter" in text:
                    problems.append(f"{method} {path} {params}: {answer.status_code} {text[:200]}")
    assert not problems, "\n".join(problems)
    assert len(OPERATIONS) >= 50  # every route, HEAD beside GET


def test_a_sample_of_every_family_names_the_parameter_and_what_the_route_takes(site):
    writer, gateway, artifact = site["writer"], site["gateway"], site["artifact"]
    with writer.client() as client:
        # The case: a filter the route does not have is refused, not ignored.
        answer = client.get("/api/v1/repositories/walk/artifacts", params={"sha25": "0" * 64})
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_input"
        assert answer.json()["message"] == (
            "unknown query parameter 'sha25' for GET /api/v1/repositories/{repo}/artifacts"
            " (it takes: cursor, limit, name, order, prefix, sha256)"
        )
        twice = client.get("/api/v1/repositories/walk/artifacts?limit=1&limit=2")
        assert twice.status_code == 400 and twice.json()["message"] == "query parameter 'limit' is given more than once"
        long_name = client.get("/api/v1/tasks", params={"x" * 5000: "1"})
        assert long_name.status_code == 400 and len(long_name.json()["message"]) < 300
        controls = client.get("/api/v1/accounts", params={"a\nb\x00": "1"})
        assert controls.status_code == 400 and "\n" not in controls.json()["message"]
        # Refused before anything is done: the body is not read, nothing is created.
        made = client.post("/api/v1/repositories", params={"public": "true"}, json={"name": "never"},
                           headers={"Idempotency-Key": "refused-1"})
        assert made.status_code == 400 and "'public'" in made.json()["message"]
        assert client.get("/api/v1/repositories/never").status_code == 404
        # A route that takes no parameter says so.
        none = client.get(f"/api/v1/repositories/walk/artifacts/{artifact['id']}", params={"x": "1"})
        assert none.status_code == 400 and none.json()["message"].endswith("(it takes: none)")
    with writer.client(None) as anonymous:  # before authentication too: it tells nothing
        assert anonymous.get("/api/v1/keys", params={"x": "1"}).status_code == 400
    for process in (writer, gateway):
        with process.client() as client:
            content = f"/api/v1/repositories/walk/artifacts/{artifact['id']}/content"
            assert client.get(content).content == b"abc"
            for method in ("GET", "HEAD"):
                refused = client.request(method, content, params={"download": "1"})
                assert refused.status_code == 400, (process.url, method)
            refused = client.get(content, params={"download": "1"})
            assert "unknown query parameter 'download'" in refused.json()["message"]
            package = {"group": "g", "name": "n", "version": "1"}
            assert client.get("/api/v1/repositories/walk/packages/content", params=package).content == b"abc"
            refused = client.get("/api/v1/repositories/walk/packages/content", params={**package, "sha256": "0" * 64})
            assert refused.status_code == 400 and "'sha256'" in refused.json()["message"]
            twice = client.get("/api/v1/repositories/walk/asset/content?path=p&path=q")
            assert twice.status_code == 400 and "more than once" in twice.json()["message"]
            assert client.get("/api/v1/repositories/walk/asset/content", params={"path": "p"}).content == b"abc"
    rows = db_fetch(site["database_url"], "SELECT count(*) AS n FROM arkvory_idempotency_keys WHERE key = 'refused-1'")
    assert rows[0]["n"] == 0  # the refused change recorded nothing
