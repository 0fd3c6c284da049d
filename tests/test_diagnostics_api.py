"""`GET /api/v1/storage/diagnostics` on a live writer: administrators only, by digest, filtered
by problem, keyset pages that cover every entry once, the artifacts that use each blob (bounded),
and hostile queries never a 5xx (hypothesis, derandomized, bounded)."""

from __future__ import annotations

import urllib.parse
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arkvory.writer.blobs.diagnostics import ARTIFACTS_SHOWN

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN, Cluster, db_execute

pytestmark = pytest.mark.timeout(180)

PATH = "/api/v1/storage/diagnostics"


@pytest.fixture(scope="module")
def site(postgres, module_tmp_path):
    database_url = postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")
    cluster = Cluster(database_url, module_tmp_path)
    try:
        shared = cluster.shared_env(slots=2)
        writer = cluster.writer(shared).wait_ready()
        with writer.client() as admin:
            assert admin.post("/api/v1/repositories", json={"name": "r"}).status_code == 201
            assert admin.post("/api/v1/repositories", json={"name": "s"}).status_code == 201
            shared_content = [
                admin.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": f"{i}.bin"}, content=b"same")
                .json()
                for i, repo in enumerate(["r"] * (ARTIFACTS_SHOWN + 1) + ["s"])
            ]
            lone = admin.post("/api/v1/repositories/s/artifacts", params={"name": "x"}, content=b"lone").json()
        task_id = uuid.uuid4()
        # What verify would have recorded; plus blobs that no artifact uses any more.
        entries = {
            shared_content[0]["sha256"]: "corrupt",
            lone["sha256"]: "missing",
            **{f"{n:064x}": ("missing" if n % 2 else "corrupt") for n in range(1, 6)},
        }
        for sha256, problem in entries.items():
            db_execute(
                database_url,
                "INSERT INTO arkvory_storage_diagnostics (sha256, problem, detail, task_id) VALUES ($1, $2, $3, $4)",
                sha256, problem, f"{problem} on disk", task_id,
            )
        gateway = cluster.gateway(1, shared).wait_ready()
        yield {
            "writer": writer, "gateway": gateway, "entries": entries, "task_id": task_id,
            "shared": shared_content, "lone": lone,
        }
    finally:
        cluster.close()


def get(site, token=ADMIN_TOKEN, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(site["writer"].url + PATH, params=params, headers=headers, timeout=10)


def test_only_administrators_see_them(site):
    assert get(site, token=None).status_code == 401
    assert get(site, token=READER_TOKEN).status_code == 403
    assert get(site, token=OTHER_TOKEN).status_code == 403
    assert get(site).status_code == 200


def test_entries_by_digest_with_the_artifacts_that_use_them(site):
    body = get(site).json()
    assert body["nextCursor"] is None
    items = body["items"]
    assert [i["sha256"] for i in items] == sorted(site["entries"])
    by_digest = {i["sha256"]: i for i in items}
    for sha256, problem in site["entries"].items():
        item = by_digest[sha256]
        assert item["problem"] == problem and item["detail"] == f"{problem} on disk"
        assert item["taskId"] == str(site["task_id"]) and item["detectedAt"]
    shared = by_digest[site["shared"][0]["sha256"]]
    assert len(shared["artifacts"]) == ARTIFACTS_SHOWN and shared["moreArtifacts"] is True
    assert shared["artifacts"][0] == {"repository": "r", "id": site["shared"][0]["id"]}
    assert shared["size"] == 4
    lone = by_digest[site["lone"]["sha256"]]
    assert lone["artifacts"] == [{"repository": "s", "id": site["lone"]["id"]}] and lone["moreArtifacts"] is False
    orphan = by_digest[f"{1:064x}"]
    assert orphan["artifacts"] == [] and orphan["size"] is None


def test_filter_by_problem(site):
    for problem in ("missing", "corrupt"):
        items = get(site, problem=problem).json()["items"]
        assert sorted(i["sha256"] for i in items) == sorted(s for s, p in site["entries"].items() if p == problem)
    bad = get(site, problem="broken")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_input"


def test_pages_cover_every_entry_once(site):
    seen, cursor = [], None
    for _ in range(20):
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        body = get(site, **params).json()
        assert len(body["items"]) <= 2
        seen += [i["sha256"] for i in body["items"]]
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert seen == sorted(site["entries"])
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"cursor": "nope"}, {"cursor": "W10"}):
        answer = get(site, **bad)
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_input"


def test_a_gateway_does_not_serve_the_list(site):
    answer = httpx.get(site["gateway"].url + PATH, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert answer.status_code in (404, 405) and answer.json()["code"] in ("not_found", "read_only")


FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NASTY = ["\x00", "\n", "\u0436", "\ud800", "%", "=", "&", "-1", "0", "999999999999", "missing", "corrupt", "W10", "WyJ4Il0"]
values = st.one_of(
    st.text(max_size=50),
    st.lists(st.sampled_from(NASTY), max_size=5).map("".join),
    st.integers().map(str),
    st.just("9" * 5000),
)
queries = st.dictionaries(st.sampled_from(["problem", "limit", "cursor", "x"]), values, max_size=4)


def encode(value: str) -> str:
    return urllib.parse.quote(value.encode("utf-8", "surrogatepass"), safe="")


@FUZZ
@given(
    query=queries,
    token=st.sampled_from([None, ADMIN_TOKEN, READER_TOKEN, "garbage", ""]),
    method=st.sampled_from(["GET", "HEAD", "POST", "DELETE"]),
    tail=st.sampled_from(["", "", "/", "/x"]),
)
def test_fuzz_the_diagnostics_route(site, query, token, method, tail):
    url = PATH + tail + ("?" + "&".join(f"{encode(k)}={encode(v)}" for k, v in query.items()) if query else "")
    headers = {"Authorization": f"Bearer {token}".strip()} if token is not None else {}
    for process in (site["writer"], site["gateway"]):
        answer = httpx.request(method, process.url + url, headers=headers, timeout=20)
        status = answer.status_code
        if status >= 500:
            assert status == 503 and "Retry-After" in answer.headers, (status, answer.text)
        if status >= 400 and method != "HEAD":
            assert answer.headers["content-type"].startswith("application/json"), answer.text
            assert isinstance(answer.json().get("code"), str)
        if status == 200 and method == "GET":
            body = answer.json()
            assert set(body) == {"items", "nextCursor"} and len(body["items"]) <= 1000
