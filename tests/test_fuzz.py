"""Random paths, query strings, headers and small bodies, per route family (and hostile
`Authorization` values, Basic above all), to a live writer and a live gateway: never a 5xx
except a documented 503 with Retry-After, and every error is JSON with a `code` (SPEC §6:
"never 500").

Reproducible in CI: `derandomize=True` fixes the examples; `max_examples` bounds the time per
family (a few seconds each on a quiet machine). The processes start once for the module.
"""

from __future__ import annotations

import base64
import functools
import json
import urllib.parse
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from arkvory.writer.request_inputs import declared_query_parameters

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, Cluster
from .test_openapi import built_app

pytestmark = pytest.mark.timeout(240)

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def site(postgres, module_tmp_path):
    database_url = postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")
    cluster = Cluster(database_url, module_tmp_path)
    try:
        shared = cluster.shared_env(slots=2)
        writer = cluster.writer(shared).wait_ready()
        with writer.client() as client:
            assert client.post("/api/v1/repositories", json={"name": "pub", "public": True}).status_code == 201
            assert client.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
            artifact = client.post(
                "/api/v1/repositories/priv/artifacts", params={"name": "a.bin"}, content=b"0123456789" * 100
            ).json()
            client.put(
                "/api/v1/repositories/priv/packages",
                json={"group": "g", "name": "n", "version": "1", "artifactId": artifact["id"]},
            )
            client.put("/api/v1/repositories/priv/assets", params={"path": "p"}, json={"artifactId": artifact["id"]})
            # An account's token, so that the credential routes get past "personal tokens belong to accounts".
            account = {"name": "fuzzer", "password": "fuzzer's password"}
            assert client.post("/api/v1/accounts", json=account).status_code == 201
            session = client.post("/api/v1/login", json=account).json()["token"]
            pat = client.post("/api/v1/tokens", json={"access": "read-write"},
                              headers={"Authorization": f"Bearer {session}"}).json()["token"]
            # What the account routes reset and delete, so that the fuzzer's own token lives on.
            assert client.post("/api/v1/accounts", json={"name": "victim", "password": "victim's password"}).status_code == 201
            assert client.put("/api/v1/repositories/priv/members/victim", json={"level": "read"}).status_code == 200
        gateway = cluster.gateway(1, shared).wait_ready()
        clients = [httpx.Client(base_url=p.url, timeout=20) for p in (writer, gateway)]
        yield {"artifact": artifact["id"], "clients": clients, "pat": pat}
        for client in clients:
            client.close()
    finally:
        cluster.close()


# -- strategies ---------------------------------------------------------------------------------

NASTY = ["\x00", "\x01", "\n", "\r", "\x7f", "\u0436", "\ud800", "/", "\\", "..", ".", "%", "%00", "?", "#", " ", "'", '"', "[", "{"]
texts = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(NASTY + ["a", "pub", "priv", "1", "g", "n", "p"]), max_size=6).map("".join),
    st.integers(min_value=0).map(str).map(lambda s: s * 300),  # very long numbers
)
segments = st.one_of(texts, st.sampled_from(["pub", "priv", "missing", str(uuid.uuid4())]))


def encode(value: str) -> str:
    return urllib.parse.quote(value.encode("utf-8", "surrogatepass"), safe="")


visible = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
header_values = st.one_of(
    visible,
    st.integers(min_value=0).map(lambda n: f"bytes={n}-{'9' * 40}"),
    st.sampled_from(["bytes=0-0", "bytes=-1", "bytes=5-1", "bytes=0-1,2-3", "bytes=" + "9" * 5000 + "-", "*", '"x"']),
)
headers = st.dictionaries(
    st.sampled_from(
        ["Range", "If-Range", "If-None-Match", "Content-Type", "X-Request-Id", "Accept", "Idempotency-Key", "Authorization"]
    ),
    header_values,
    max_size=4,
)
tokens = st.sampled_from([None, ADMIN_TOKEN, READER_TOKEN, OTHER_TOKEN, "garbage", ""])
methods = st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
bodies = st.one_of(
    st.just(b""),
    st.binary(max_size=200),
    st.recursive(
        st.none() | st.booleans() | st.integers() | texts,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=8,
    ).map(lambda doc: __import__("json").dumps(doc).encode()),
    st.sampled_from([1, 32, 33, 2_000, 200_000]).map(lambda n: b"[" * n + b"]" * n),
)
queries = st.dictionaries(
    st.sampled_from(["path", "group", "name", "version", "mediaType", "after", "order", "prefix", "sha256", "limit",
                     "x"]) | texts,
    texts,
    max_size=4,
)


def check(answer: httpx.Response, method: str) -> None:
    status = answer.status_code
    if status >= 500:
        assert status == 503 and "Retry-After" in answer.headers, (status, answer.text)
    if status >= 400 and method != "HEAD":
        assert answer.headers.get("content-type", "").startswith("application/json"), (status, answer.text)
        assert isinstance(answer.json().get("code"), str), answer.text


def send(site, method: str, path: str, query: dict, header_map: dict, token, body: bytes) -> None:
    url = path + ("?" + "&".join(f"{encode(k)}={encode(v)}" for k, v in query.items()) if query else "")
    # A client library refuses values with surrounding whitespace; the server never sees them.
    sent = {name: value.strip() for name, value in header_map.items()}
    if token is not None and "Authorization" not in sent:
        sent["Authorization"] = f"Bearer {token}".strip()
    for client in site["clients"]:
        answer = client.request(method, url, headers=sent, content=body if method not in ("GET", "HEAD") else None)
        check(answer, method)


# -- one test per route family ------------------------------------------------------------------


# Mostly names that exist, so that the lookups get as far as the database and the ranges.
content_repos = st.one_of(st.sampled_from(["priv", "pub", "missing"]), segments)
lookup_values = st.one_of(st.sampled_from(["g", "n", "1", "p"]), texts)
content_queries = st.one_of(
    st.fixed_dictionaries({"group": lookup_values, "name": lookup_values, "version": lookup_values}),
    st.fixed_dictionaries({"path": lookup_values}),
    queries,
)


@FUZZ
@given(
    repo=content_repos, artifact=st.one_of(st.just("known"), segments),
    kind=st.sampled_from(["artifacts/{a}/content", "packages/content", "asset/content"]),
    query=content_queries, header_map=headers, token=st.one_of(st.just(ADMIN_TOKEN), tokens),
    method=st.sampled_from(["GET", "HEAD"]),
)
def test_content_routes(site, repo, artifact, kind, query, header_map, token, method):
    artifact = site["artifact"] if artifact == "known" else artifact
    path = f"/api/v1/repositories/{encode(repo)}/" + kind.replace("{a}", encode(artifact))
    send(site, method, path, query, header_map, token, b"")


@FUZZ
@given(repo=st.one_of(st.just(None), segments), method=methods, query=queries, header_map=headers, token=tokens,
       body=bodies, tail=st.sampled_from(["", "", "/"]))
@example(repo=None, method="POST", query={}, header_map={}, token=None, body=b"[" * 200_000, tail="")
@example(repo=None, method="POST", query={}, header_map={}, token=ADMIN_TOKEN, body=b'{"name": "x\\n"}', tail="")
def test_repository_routes(site, repo, method, query, header_map, token, body, tail):
    path = "/api/v1/repositories" + ("" if repo is None else f"/{encode(repo)}") + tail
    send(site, method, path, query, header_map, token, body)


@FUZZ
@given(repo=segments, artifact=segments, method=methods, query=queries, header_map=headers, token=tokens,
       body=bodies)
@example(repo="priv", artifact="", method="POST", query={"name": "a", "mediaType": "\u0436/x"}, header_map={},
         token=ADMIN_TOKEN, body=b"x")
def test_artifact_and_upload_routes(site, repo, artifact, method, query, header_map, token, body):
    suffix = "" if artifact == "" else f"/{encode(artifact)}"
    send(site, method, f"/api/v1/repositories/{encode(repo)}/artifacts{suffix}", query, header_map, token, body)


@FUZZ
@given(repo=segments, which=st.sampled_from(["packages", "assets"]), method=methods, query=queries,
       header_map=headers, token=tokens, body=bodies)
@example(repo="priv", which="assets", method="PUT", query={"path": "a"}, header_map={}, token=ADMIN_TOKEN,
         body=b"[" * 200_000)
@example(repo="priv", which="packages", method="PUT", query={}, header_map={}, token=ADMIN_TOKEN,
         body=b'{"group": "g\\u0000", "name": "n", "version": "1", "artifactId": "00000000-0000-0000-0000-000000000000"}')
def test_package_and_asset_routes(site, repo, which, method, query, header_map, token, body):
    send(site, method, f"/api/v1/repositories/{encode(repo)}/{which}", query, header_map, token, body)


# The pages of a list: `limit` and `cursor`, with cursors that decode (wrong shapes, wrong values).
cursors = st.one_of(
    texts,
    st.lists(st.one_of(texts, st.integers(), st.none()), max_size=3).map(
        lambda key: urllib.parse.quote(__import__("base64").urlsafe_b64encode(__import__("json").dumps(key).encode()).decode().rstrip("="))
    ),
    st.sampled_from(["WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgIngiXQ",  # ["2026-01-01T00:00:00+00:00", "x"]
                     "WyI5OTk5OS0wMS0wMSIsICIwMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDAiXQ"]),  # year 99999
)
page_queries = st.fixed_dictionaries({}, optional={"limit": st.one_of(texts, st.integers().map(str)), "cursor": cursors})


# Every list with its order and filters (issue 25): the orders each list has and others, prefixes
# at the edges of the code points (U+10FFFF has no successor; U+D7FF's is past the surrogates),
# `%` and `_`, digests of every shape, cursors of each list's key shapes.
LISTS = {  # a list of the fuzz site -> its route
    "/api/v1/repositories": "/api/v1/repositories",
    "/api/v1/repositories/priv/artifacts": "/api/v1/repositories/{repo}/artifacts",
    "/api/v1/repositories/pub/artifacts": "/api/v1/repositories/{repo}/artifacts",
    "/api/v1/repositories/priv/packages": "/api/v1/repositories/{repo}/packages",
    "/api/v1/repositories/priv/assets": "/api/v1/repositories/{repo}/assets",
    "/api/v1/repositories/priv/asset": "/api/v1/repositories/{repo}/asset",
    "/api/v1/accounts": "/api/v1/accounts", "/api/v1/tokens": "/api/v1/tokens", "/api/v1/keys": "/api/v1/keys",
    "/api/v1/tasks": "/api/v1/tasks", "/api/v1/storage/diagnostics": "/api/v1/storage/diagnostics",
}
prefixes = st.one_of(texts, st.sampled_from(["a", "a.", "%", "_", "a%", "\U0010ffff", "a\U0010ffff", "a\ud7ff", "p", "n"]))
list_cursors = st.one_of(cursors, st.lists(
    st.sampled_from(["2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00", str(uuid.uuid4()), "g", "n", "1", "\U0010ffff",
                     "9" * 30, "-1", ""]), min_size=1, max_size=4,
).map(lambda key: base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")))
list_queries = st.fixed_dictionaries({}, optional={
    "order": st.one_of(st.sampled_from(["newest", "oldest", "name", "sha256", "NEWEST", ""]), texts),
    "prefix": prefixes,
    "sha256": st.one_of(st.sampled_from(["0" * 64, "A" * 64, "0" * 63, "g" * 64, ""]), texts),
    "name": st.one_of(st.sampled_from(["a.bin", "n"]), texts),
    "group": st.one_of(st.just("g"), texts),
    "path": st.one_of(st.just("p"), texts),
    "problem": st.sampled_from(["missing", "corrupt", "x"]),
    "kind": st.sampled_from(["cleanup", "verify", "x"]),
    "limit": st.sampled_from(["1", "2", "1000", "0", "x"]),
    "cursor": list_cursors,
})


@functools.cache
def declared(route: str) -> frozenset[str]:
    return declared_query_parameters(json.loads(built_app().state.openapi_json), route, "get")


@st.composite
def list_requests(draw):
    """A list and a query of mostly the parameters it declares (an undeclared one is refused at once)."""
    path = draw(st.sampled_from(sorted(LISTS)))
    query = draw(list_queries)
    if draw(st.integers(0, 9)):
        query = {name: value for name, value in query.items() if name in declared(LISTS[path])}
    return path, query


@FUZZ
@given(request=list_requests(), token=st.one_of(st.just("pat"), tokens), method=st.sampled_from(["GET", "HEAD"]))
@example(request=("/api/v1/repositories/priv/artifacts", {"prefix": "\U0010ffff", "order": "newest"}), token=ADMIN_TOKEN,
         method="GET")
@example(request=("/api/v1/repositories/priv/packages", {"prefix": "a\ud7ff", "order": "oldest"}), token=ADMIN_TOKEN,
         method="GET")
def test_list_orders_and_filters(site, request, token, method):
    path, query = request
    token = site["pat"] if token == "pat" else token
    send(site, method, path, query, {}, token, b"")


@FUZZ
@given(which=st.sampled_from(["tokens", "keys", "accounts", "login", "logout", "register", "account/password"]),
       rest=st.one_of(st.just(""), segments.map(lambda s: "/" + encode(s)),
                      st.sampled_from(["/x/disable", "/nobody/enable", "/victim/password", "/victim", "/victim/disable"])),
       method=methods, query=st.one_of(page_queries, queries), header_map=headers,
       token=st.one_of(st.just("pat"), tokens), body=bodies)
@example(which="tokens", rest="", method="GET", query={"limit": "1", "cursor": "WyJ4Il0"}, header_map={}, token="pat", body=b"")
@example(which="tokens", rest="", method="GET", query={"cursor": "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgIngiXQ"},
         header_map={}, token="pat", body=b"")
@example(which="keys", rest="", method="GET", query={"cursor": "WyI5OTk5OS0wMS0wMSIsICIwMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDAiXQ"},
         header_map={}, token=ADMIN_TOKEN, body=b"")
def test_credential_and_account_routes(site, which, rest, method, query, header_map, token, body):
    token = site["pat"] if token == "pat" else token
    send(site, method, f"/api/v1/{which}{rest}", query, header_map, token, body)


# Retention rules (issue 25): limits that parse, limits out of range, and everything else.
rule_numbers = st.one_of(st.none(), st.integers(), st.sampled_from([0, 1, 59, 60, 100_000, 100_001, 10**40]),
                         texts, st.booleans(), st.floats(allow_nan=False))
rule_bodies = st.fixed_dictionaries({}, optional={"keepNewest": rule_numbers, "keepYoungerThanSeconds": rule_numbers,
                                                  "enabled": st.one_of(st.booleans(), texts, st.none())}).map(
    lambda doc: __import__("json").dumps(doc).encode())
rule_queries = st.fixed_dictionaries({}, optional={
    "keepNewest": st.one_of(texts, st.integers().map(str)), "keepYoungerThanSeconds": st.one_of(texts, st.integers().map(str)),
    "limit": st.one_of(texts, st.integers().map(str)), "cursor": cursors})


@FUZZ
@given(repo=st.one_of(st.sampled_from(["priv", "pub", "missing"]), segments),
       tail=st.sampled_from(["", "", "/preview", "/preview", "/", "/preview/x"]), method=methods,
       query=st.one_of(rule_queries, queries), header_map=headers, token=tokens, body=st.one_of(rule_bodies, bodies))
@example(repo="priv", tail="", method="PUT", query={}, header_map={}, token=ADMIN_TOKEN,
         body=b'{"keepNewest": 100000000000000000000000000000000000000, "enabled": true}')
@example(repo="priv", tail="/preview", method="GET", query={"keepNewest": "1", "cursor": "WyI5OTk5OS0wMS0wMSIsICIwMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDAiXQ"},
         header_map={}, token=ADMIN_TOKEN, body=b"")
def test_retention_routes(site, repo, tail, method, query, header_map, token, body):
    send(site, method, f"/api/v1/repositories/{encode(repo)}/retention{tail}", query, header_map, token, body)


@FUZZ
@given(repo=st.one_of(st.sampled_from(["priv", "pub"]), segments), which=st.sampled_from(["members", "permissions"]),
       account=st.one_of(st.none(), st.sampled_from(["victim", "fuzzer", "VICTIM"]), segments), method=methods,
       query=st.one_of(page_queries, queries), header_map=headers, token=st.one_of(st.just("pat"), tokens), body=bodies)
@example(repo="priv", which="members", account=None, method="GET", query={"limit": "1", "cursor": "WyJ4Il0"},
         header_map={}, token=ADMIN_TOKEN, body=b"")
@example(repo="priv", which="members", account="victim", method="PUT", query={}, header_map={}, token=ADMIN_TOKEN,
         body=b'{"level": "owner"}')
def test_member_routes(site, repo, which, account, method, query, header_map, token, body):
    token = site["pat"] if token == "pat" else token
    tail = "" if account is None else f"/{encode(account)}"
    send(site, method, f"/api/v1/repositories/{encode(repo)}/{which}{tail}", query, header_map, token, body)


@FUZZ
@given(rest=st.lists(segments, max_size=3), which=st.sampled_from(["status", "live", "ready", "metrics", ""]),
       method=methods, query=queries, header_map=headers, token=tokens)
def test_health_and_unknown_routes(site, rest, which, method, query, header_map, token):
    path = f"/health/{which}" + "".join(f"/{encode(s)}" for s in rest)
    send(site, method, path, query, header_map, token, b"")


# Hostile `Authorization` values, Basic above all (issue 25 §9: a token as Basic's password): any
# bytes encoded, a token behind any user name, base64 that is not (padding dropped, the URL-safe
# alphabet, stray characters), oversized values, other schemes; with and without a browser's
# Sec-Fetch-* and Origin headers. Never a 500, and every 401 challenges for Basic and Bearer.
def _basic(raw: bytes) -> bytes:
    return b"Basic " + base64.b64encode(raw)


# What an HTTP client can send in a header value: no CR, LF or NUL (h11 refuses them itself).
header_bytes = st.binary(max_size=60).map(lambda raw: bytes(b for b in raw if b >= 0x20 or b == 0x09))
known_tokens = st.sampled_from([ADMIN_TOKEN, READER_TOKEN, OTHER_TOKEN, "pat", "fuzzer's password", "", "x"])
authorizations = st.one_of(
    st.binary(max_size=80).map(_basic),
    st.tuples(st.binary(max_size=24), known_tokens),
    header_bytes.map(lambda raw: b"Basic " + raw),
    st.binary(min_size=1, max_size=40).map(lambda raw: _basic(raw).rstrip(b"=")),
    st.binary(min_size=1, max_size=40).map(lambda raw: b"Basic " + base64.urlsafe_b64encode(raw)),
    st.tuples(st.sampled_from([b"Basic", b"basic", b"BASIC", b"Bearer", b"Digest", b"Negotiate", b""]),
              st.sampled_from([b"", b" ", b"  ", b"\t"]), header_bytes).map(b"".join),
    st.sampled_from([b"Basic " + b"A" * 5000, b"Basic " + b"QQ==" * 300, _basic(b":" * 700),
                     _basic(b"u:" + b"t" * 766), _basic(b"u:" + b"t" * 767), b"Basic ====", b"Basic =",
                     _basic("ж:ж".encode()), _basic("u:ж".encode("utf-8")), _basic(b"u:\xe9t\xe9"),
                     _basic(b"u:\x00"), _basic(b"\x00:" + ADMIN_TOKEN.encode())]),
)
browser_headers = st.fixed_dictionaries({}, optional={
    "Sec-Fetch-Site": st.sampled_from(["cross-site", "same-site", "same-origin", "none", "", "CROSS-SITE", "x"]),
    "Sec-Fetch-Mode": st.sampled_from(["navigate", "cors", "no-cors", "", "NAVIGATE"]),
    "Sec-Fetch-Dest": st.sampled_from(["document", "iframe", "empty", "", "DOCUMENT"]),
    "Origin": st.sampled_from(["http://elsewhere.example", "null", "", "http://127.0.0.1"]),
})
CHALLENGES = ['Basic realm="arkvory", charset="UTF-8"', 'Bearer realm="arkvory"']


@FUZZ
@given(authorization=authorizations, browser=browser_headers,
       which=st.sampled_from(["content", "/api/v1/repositories", "/api/v1/repositories/priv", "/api/v1/tokens",
                              "/health/ready", "/health/metrics"]),
       method=st.sampled_from(["GET", "HEAD", "POST", "DELETE"]))
@example(authorization=(b"anyone", ADMIN_TOKEN), browser={}, which="content", method="GET")
@example(authorization=(b"", "pat"), browser={"Sec-Fetch-Site": "cross-site"}, which="/api/v1/tokens", method="POST")
def test_authorization_header(site, authorization, browser, which, method):
    if isinstance(authorization, tuple):  # a known token (or password) behind a user name
        user, secret = authorization
        authorization = _basic(user.replace(b":", b"") + b":" + (site["pat"] if secret == "pat" else secret).encode())
    path = f"/api/v1/repositories/priv/artifacts/{site['artifact']}/content" if which == "content" else which
    sent = {"Authorization": authorization.strip(), **browser}
    for client in site["clients"]:
        answer = client.request(method, path, headers=sent)
        check(answer, method)
        if answer.status_code == 401:
            assert answer.headers.get_list("www-authenticate") == CHALLENGES, answer.headers


audit_values = st.one_of(
    texts,
    st.sampled_from(["repository", "repository.create", "account.sign-in", "key:admin", "admin", "ok", "refused",
                     "newest", "oldest", "2026-01-01T00:00:00Z", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                     "2026-13-01", "1" * 70]),
)
audit_queries = st.dictionaries(
    st.sampled_from(["principal", "action", "repository", "target", "outcome", "since", "until", "order", "limit",
                     "cursor"]) | texts,
    st.one_of(audit_values, cursors), max_size=5,
)


@FUZZ
@given(method=methods, query=audit_queries, header_map=headers, token=st.one_of(st.just("pat"), tokens), body=bodies)
@example(method="GET", query={"since": "0001-01-01T00:00:00+14:00"}, header_map={}, token=ADMIN_TOKEN, body=b"")
@example(method="GET", query={"cursor": "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzE0OjAwIiwgIjEiXQ"}, header_map={},
         token=ADMIN_TOKEN, body=b"")
@example(method="GET", query={"target": "\x00"}, header_map={}, token=ADMIN_TOKEN, body=b"")
def test_audit_route(site, method, query, header_map, token, body):
    token = site["pat"] if token == "pat" else token
    send(site, method, "/api/v1/audit", query, header_map, token, body)


# The root and the console's paths (issue 25 §7), with any Accept: the writer's `/` sends a
# browser (an Accept that names text/html) to /console/ and tells a program where the API is (JSON
# 404), and /console/ is its console (pages); a gateway tells a browser in a page (404) that the
# console is on the writer, and a program in JSON. Never a 500, whatever is sent.
accepts = st.one_of(
    visible,
    st.sampled_from(["text/html", "text/html;q=0", "TEXT/HTML; q=0.5", "text/html;q=nan", "text/html;q=1e999",
                     "text/html;q=-1", "application/json, text/html;q", ";;,,", "*/*", "text/*", "text/html" * 500]),
)
console_paths = st.one_of(
    st.sampled_from(["/", "/console", "/console/", "/console/sign-in", "/console/static/copy.js"]),
    st.lists(segments, min_size=1, max_size=3).map(lambda parts: "/console/" + "/".join(encode(p) for p in parts)),
)


@FUZZ
@given(path=console_paths, accept=accepts, method=methods, token=tokens, query=queries)
def test_the_root_and_the_console_paths(site, path, accept, method, token, query):
    url = path + ("?" + "&".join(f"{encode(k)}={encode(v)}" for k, v in query.items()) if query else "")
    sent = {"Accept": accept.strip()}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    writer, gateway = site["clients"]
    for client in (writer, gateway):
        answer = client.request(method, url, headers=sent)
        status = answer.status_code
        assert status < 500 or (status == 503 and "Retry-After" in answer.headers), (path, status, answer.text[:500])
        if client is gateway and answer.headers.get("content-type", "").startswith("text/html"):
            assert status == 404 and method in ("GET", "HEAD"), (path, status)
            assert method == "HEAD" or "The console is on the writer" in answer.text
        elif client is gateway or (path == "/" and status >= 400):
            check(answer, method)
