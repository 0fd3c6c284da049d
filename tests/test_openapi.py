"""The OpenAPI document (`GET /api/v1/openapi.json`): valid OpenAPI 3.1, one operation for every
route of the writer app and no operation without a route, served live; and requests generated from
the document (hypothesis, derandomized, bounded) never get a 5xx from a live writer, only
documented statuses, and 2xx JSON bodies that match their documented schema."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from hypothesis import strategies as st
from openapi_spec_validator import validate
from starlette.routing import Route

from arkvory.shared.auth.identity import KeyRing
from arkvory.shared.process.runtime import Runtime
from arkvory.shared.settings import Settings
from arkvory.writer.app import build_writer_app
from arkvory.writer.openapi import build_document

from .harness import ADMIN_TOKEN, READER_TOKEN

pytestmark = pytest.mark.timeout(120)

METHODS = ("get", "put", "post", "delete", "patch", "head")


def built_app():
    settings = Settings.from_env({"ARKVORY_DATABASE_URL": "postgresql://x@127.0.0.1/x", "ARKVORY_DATA_DIR": "/nonexistent"})
    return build_writer_app(Runtime(settings, KeyRing.empty()))


def served_operations(app) -> set[tuple[str, str]]:
    """(path, method) of every route; HEAD only where the route names it next to GET too."""
    served = set()
    for route in app.routes:
        assert isinstance(route, Route), f"unexpected route kind {route!r}"
        for method in route.methods or ():
            served.add((route.path, method.lower()))
    return served


def documented_operations(document) -> set[tuple[str, str]]:
    return {(path, method) for path, item in document["paths"].items() for method in item if method in METHODS}


def test_every_route_has_an_operation_and_every_operation_a_route():
    app = built_app()
    document = json.loads(app.state.openapi_json)
    served, documented = served_operations(app), documented_operations(document)
    # Starlette answers HEAD wherever it answers GET; the document lists HEAD where it matters.
    missing = {(p, m) for p, m in served - documented if m != "head"}
    assert not missing, f"routes without an operation: {sorted(missing)}"
    assert not documented - served, f"operations without a route: {sorted(documented - served)}"


def test_the_document_is_valid_openapi_3_1_and_complete():
    document = json.loads(built_app().state.openapi_json)
    validate(document)
    for path, item in document["paths"].items():
        templated = {part[1:-1] for part in path.split("/") if part.startswith("{")}
        for method, operation in item.items():
            where = f"{method.upper()} {path}"
            params = operation.get("parameters", [])
            in_path = {p["name"] for p in params if "$ref" not in p and p["in"] == "path"}
            assert in_path == templated, where
            assert operation["responses"], where
            if path.startswith("/api/v1/repositories"):
                assert any(r == {"$ref": "#/components/responses/Error"} for r in operation["responses"].values()), where
            if method in ("put", "post", "delete", "patch"):
                assert {"$ref": "#/components/parameters/IdempotencyKey"} in params, where
            assert operation["operationId"]
    ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    content = document["paths"]["/api/v1/repositories/{repo}/artifacts/{artifact_id}/content"]["get"]
    assert {p["name"] for p in content["parameters"]} >= {"Range", "If-Range", "If-None-Match"}
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    # A token as Basic's password, wherever a bearer token works (issue 25 §9).
    assert document["components"]["securitySchemes"]["basic"]["scheme"] == "basic"
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if {"bearer": []} in operation["security"]:
                assert {"basic": []} in operation["security"], (method, path)


# -- a live writer --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def live(postgres, module_tmp_path):
    from .harness import Cluster

    database_url = postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")
    cluster = Cluster(database_url, module_tmp_path)
    try:
        writer = cluster.writer().wait_ready()
        with writer.client() as client:
            assert client.post("/api/v1/repositories", json={"name": "builds", "public": True}).status_code == 201
            artifact = client.post("/api/v1/repositories/builds/artifacts", params={"name": "a"}, content=b"abc").json()
            client.put("/api/v1/repositories/builds/packages", json={"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"]})
            client.put("/api/v1/repositories/builds/assets", params={"path": "p"}, json={"artifactId": artifact["id"]})
        yield writer, artifact["id"]
    finally:
        cluster.close()


def test_the_live_document_is_the_built_one(live):
    writer, _ = live
    with writer.client(None) as anonymous:
        answer = anonymous.get("/api/v1/openapi.json")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    import arkvory.writer.app as writer_app

    assert answer.json() == build_document(writer_app.ROUTE_MODULES)


NASTY = ["", "\x00", "\n", "\u0436", "\ud800", "/", "..", "%", "?", "#", " ", '"', "{", "a" * 300, "-1", "9" * 30]


def value_for(schema: dict, known: list[str]) -> st.SearchStrategy:
    """A value that fits `schema` most of the time, or a nasty one."""
    kind = schema.get("type")
    if "enum" in schema:
        fitting = st.sampled_from(schema["enum"])
    elif kind == "integer":
        fitting = st.integers(min_value=-2, max_value=2**64)
    elif kind == "boolean":
        fitting = st.booleans()
    elif schema.get("format") == "uuid":
        fitting = st.sampled_from([*known, str(uuid.uuid4())])
    else:
        fitting = st.one_of(st.sampled_from(["builds", "g", "n", "1", "p", "x"]), st.text(max_size=20))
    return st.one_of(fitting, fitting, st.sampled_from(NASTY), st.integers().map(str))


def body_for(schema: dict, known: list[str]) -> st.SearchStrategy:
    properties = schema.get("properties", {})
    fields = st.fixed_dictionaries(
        {}, optional={name: st.one_of(value_for(s, known), st.none(), st.lists(st.integers(), max_size=2)) for name, s in properties.items()}
    )
    return st.one_of(fields, fields, st.sampled_from([[], "x", 1, None, {"a": {"b": [1]}}]))


def requests_from(document: dict, known: list[str]) -> st.SearchStrategy:
    operations = [
        (path, method, operation)
        for path, item in sorted(document["paths"].items())
        for method, operation in sorted(item.items())
        if method != "head"
    ]

    @st.composite
    def one(draw):
        path, method, operation = draw(st.sampled_from(operations))
        url, params, headers = path, {}, {}
        for param in operation.get("parameters", []):
            if "$ref" in param:
                if draw(st.booleans()):
                    headers["Idempotency-Key"] = draw(st.one_of(st.sampled_from(["k1", "k2", "K1"]), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=70))).strip() or "k"
                continue
            value = draw(value_for(param.get("schema", {}), known))
            if param["in"] == "path":
                segment = value if isinstance(value, str) else str(value)
                encoded = urllib.parse.quote(segment.encode("utf-8", "surrogatepass"), safe="")
                if encoded in (".", ".."):  # a client would remove the dot segment: send it escaped
                    encoded = encoded.replace(".", "%2E")
                url = url.replace("{" + param["name"] + "}", encoded)
            elif param["in"] == "query" and (param.get("required") or draw(st.booleans())):
                params[param["name"]] = str(value).encode("utf-8", "replace").decode() if isinstance(value, str) else json.dumps(value)
            elif param["in"] == "header" and draw(st.booleans()):
                # h11 refuses control characters and surrounding whitespace in header values.
                text = "".join(c if " " <= c <= "~" else "?" for c in str(value)).strip()
                headers[param["name"]] = text or "x"
        body = None
        media = operation.get("requestBody", {}).get("content", {})
        if "application/json" in media:
            body = draw(body_for(media["application/json"]["schema"], known))
        elif media:
            body = draw(st.binary(max_size=64))
        token = draw(st.sampled_from([ADMIN_TOKEN, ADMIN_TOKEN, READER_TOKEN, None]))
        return method, url, params, headers, body, token, operation

    return one()


@pytest.mark.soak  # 700 generated requests, ~10 s: .ci/run runs it (pytest -m soak)
def test_generated_requests_never_get_a_5xx(live):
    writer, artifact = live
    document = json.loads(built_app().state.openapi_json)
    clients = {
        token: httpx.Client(base_url=writer.url, timeout=20, headers={"Authorization": f"Bearer {token}"} if token else {})
        for token in (ADMIN_TOKEN, READER_TOKEN, None)
    }
    started = time.monotonic()
    problems: list[str] = []
    validated: list[str] = []

    @settings(max_examples=700, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(requests_from(document, [artifact]))
    def check(request):
        method, url, params, headers, body, token, operation = request
        content = body
        if body is not None and not isinstance(body, bytes):
            content = json.dumps(body, allow_nan=False).encode("utf-8", "surrogatepass")
            headers = {**headers, "Content-Type": "application/json"}
        answer = clients[token].request(method.upper(), url, params=params, headers=headers, content=content)
        if answer.status_code >= 500 and not (answer.status_code == 503 and "retry-after" in answer.headers):
            problems.append(f"{method.upper()} {url} {params} {body!r} -> {answer.status_code} {answer.text[:200]}")
        elif answer.status_code >= 400:
            assert answer.json()["code"], answer.text
        documented = operation["responses"].get(str(answer.status_code))
        if documented is None:
            problems.append(f"{method.upper()} {url} -> undocumented {answer.status_code} {answer.text[:200]}")
        schema = (documented or {}).get("content", {}).get("application/json", {}).get("schema")
        if 200 <= answer.status_code < 300 and schema is not None and method != "head":
            # Refs inside the schema resolve against the document's components.
            validated.append(f"{method} {operation['operationId']}")
            for error in Draft202012Validator({**schema, "components": document["components"]}).iter_errors(answer.json()):
                problems.append(f"{method.upper()} {url} -> {answer.status_code} body does not match: {error.message[:200]}")

    try:
        check()
    finally:
        for client in clients.values():
            client.close()
    assert not problems, "\n".join(problems[:20])
    # The run reaches real successes, not only refusals: bodies of several operations were checked.
    assert len(set(validated)) >= 8, sorted(set(validated))
    assert time.monotonic() - started < 60
    assert writer.status() == (200, "ready")  # still serving
