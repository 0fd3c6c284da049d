"""Content routes on a gateway: ranges, conditionals, HEAD, permissions, exact reads (SPEC §6)."""

from __future__ import annotations

import hashlib
import os
import socket
import time

import httpx
import pytest

from .harness import ADMIN_TOKEN, OTHER_TOKEN, READER_TOKEN

pytestmark = pytest.mark.timeout(120)

SIZE = 300_000


@pytest.fixture(scope="module")
def blob() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture(scope="module")
def site(module_cluster, blob):
    """Shared by the tests that only read (and one upload that must leave nothing)."""
    return make_site(module_cluster, blob)


@pytest.fixture
def fresh_site(cluster, blob):
    """For a test that damages the blob or reads a gateway's counters from zero."""
    return make_site(cluster, blob)


def make_site(cluster, blob) -> dict:
    """A writer and a gateway; private repo `priv` with an artifact, a package and an asset."""
    shared = cluster.shared_env()
    writer = cluster.writer(shared).wait_ready()
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
        assert client.post("/api/v1/repositories", json={"name": "pub", "public": True}).status_code == 201
        uploaded = client.post(
            "/api/v1/repositories/priv/artifacts", params={"name": "räksmörgås v1.tar.gz"}, content=blob
        )
        assert uploaded.status_code == 201, uploaded.text
        artifact = uploaded.json()
        public = client.post("/api/v1/repositories/pub/artifacts", params={"name": "p.bin"}, content=b"public bytes")
        package = client.put(
            "/api/v1/repositories/priv/packages",
            json={"group": "org.demo", "name": "tool", "version": "1.0.0", "artifactId": artifact["id"]},
        )
        assert package.status_code == 201, package.text
        asset = client.put(
            "/api/v1/repositories/priv/assets", params={"path": "latest/tool.tgz"}, json={"artifactId": artifact["id"]}
        )
        assert asset.status_code == 200, asset.text
    gateway = cluster.gateway(1, shared).wait_ready()
    return {
        "writer": writer,
        "gateway": gateway,
        "artifact": artifact,
        "path": f"/api/v1/repositories/priv/artifacts/{artifact['id']}/content",
        "public_path": f"/api/v1/repositories/pub/artifacts/{public.json()['id']}/content",
        "cluster": cluster,
    }


def test_upload_answer_describes_the_artifact(site, blob):
    artifact = site["artifact"]
    assert artifact["sha256"] == hashlib.sha256(blob).hexdigest()
    assert artifact["size"] == SIZE


def test_full_download_headers_and_bytes(site, blob):
    with site["gateway"].client() as client:
        answer = client.get(site["path"])
    assert answer.status_code == 200
    assert answer.content == blob
    digest = hashlib.sha256(blob).hexdigest()
    assert answer.headers["ETag"] == f'"sha256:{digest}"'
    assert answer.headers["Content-Length"] == str(SIZE)
    assert answer.headers["Accept-Ranges"] == "bytes"
    assert answer.headers["Content-Type"] == "application/octet-stream"
    disposition = answer.headers["Content-Disposition"]
    assert disposition.startswith("attachment;")
    assert "filename*=UTF-8''r%C3%A4ksm%C3%B6rg%C3%A5s%20v1.tar.gz" in disposition
    assert "X-Request-Id" in answer.headers


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-99", 0, 99),
        ("bytes=1000-1999", 1000, 1999),
        ("bytes=-500", SIZE - 500, SIZE - 1),
        ("bytes=299000-", 299000, SIZE - 1),
        ("bytes=299990-400000", 299990, SIZE - 1),
        ("bytes=0-0", 0, 0),
    ],
)
def test_single_ranges_are_byte_exact(site, blob, header, start, end):
    with site["gateway"].client() as client:
        answer = client.get(site["path"], headers={"Range": header})
    assert answer.status_code == 206
    assert answer.content == blob[start : end + 1]
    assert answer.headers["Content-Range"] == f"bytes {start}-{end}/{SIZE}"
    assert answer.headers["Content-Length"] == str(end - start + 1)


@pytest.mark.parametrize("header", [f"bytes={SIZE}-", f"bytes={SIZE + 10}-{SIZE + 20}", "bytes=-0"])
def test_unsatisfiable_range_is_416(site, header):
    with site["gateway"].client() as client:
        answer = client.get(site["path"], headers={"Range": header})
    assert answer.status_code == 416
    assert answer.headers["Content-Range"] == f"bytes */{SIZE}"
    assert answer.json()["code"] == "range_not_satisfiable"


@pytest.mark.parametrize("header", ["bytes=0-9,20-29", "pages=1-2", "bytes=abc", "bytes=10-5"])
def test_multi_or_malformed_ranges_get_the_whole_body(site, blob, header):
    with site["gateway"].client() as client:
        answer = client.get(site["path"], headers={"Range": header})
    assert answer.status_code == 200
    assert answer.content == blob


def test_if_range_match_and_mismatch(site, blob):
    etag = f'"sha256:{site["artifact"]["sha256"]}"'
    with site["gateway"].client() as client:
        matched = client.get(site["path"], headers={"Range": "bytes=10-19", "If-Range": etag})
        stale = client.get(site["path"], headers={"Range": "bytes=10-19", "If-Range": '"sha256:00"'})
        dated = client.get(
            site["path"], headers={"Range": "bytes=10-19", "If-Range": "Wed, 21 Oct 2015 07:28:00 GMT"}
        )
    assert matched.status_code == 206 and matched.content == blob[10:20]
    assert stale.status_code == 200 and stale.content == blob
    assert dated.status_code == 200 and dated.content == blob


def test_if_none_match_gives_304_without_body(site):
    etag = f'"sha256:{site["artifact"]["sha256"]}"'
    with site["gateway"].client() as client:
        answer = client.get(site["path"], headers={"If-None-Match": f'"other", {etag}'})
        weak = client.get(site["path"], headers={"If-None-Match": f"W/{etag}"})
        miss = client.get(site["path"], headers={"If-None-Match": '"sha256:00"'})
    assert answer.status_code == 304 and answer.content == b""
    assert answer.headers["ETag"] == etag
    assert weak.status_code == 304
    assert miss.status_code == 200


def test_head_has_headers_and_no_body_and_no_budget(fresh_site):
    with fresh_site["gateway"].client() as client:
        answer = client.head(fresh_site["path"])
        ready = client.get("/health/ready").json()
    assert answer.status_code == 200 and answer.content == b""
    assert answer.headers["Content-Length"] == str(SIZE)
    assert ready["transfers"]["downloads"]["bandwidth"]["grantedBytes"] == 0


@pytest.mark.parametrize("header", ["bytes=0-9", f"bytes={SIZE}-", "bytes=-0", "bytes=0-1,5-6"])
def test_head_with_range_answers_as_get_without_range(site, header):
    """RFC 9110 §14.2: Range is defined for GET only; HEAD never gives 206 or 416."""
    etag = '"sha256:' + site["artifact"]["sha256"] + '"'
    with site["gateway"].client() as client:
        plain = client.get(site["path"])
        ranged = client.head(site["path"], headers={"Range": header, "If-Range": etag})
    assert ranged.status_code == 200, ranged.headers
    assert ranged.content == b""
    assert ranged.headers["Content-Length"] == str(SIZE)
    assert "Content-Range" not in ranged.headers
    for name in ("ETag", "Content-Type", "Content-Disposition", "Accept-Ranges", "Digest"):
        assert ranged.headers[name] == plain.headers[name]


def test_package_and_asset_routes(site, blob):
    with site["gateway"].client() as client:
        package = client.get(
            "/api/v1/repositories/priv/packages/content",
            params={"group": "org.demo", "name": "tool", "version": "1.0.0"},
        )
        asset = client.get("/api/v1/repositories/priv/asset/content", params={"path": "latest/tool.tgz"})
        missing = client.get(
            "/api/v1/repositories/priv/packages/content",
            params={"group": "org.demo", "name": "tool", "version": "9"},
        )
        no_params = client.get("/api/v1/repositories/priv/packages/content", params={"group": "g"})
    assert package.status_code == 200 and package.content == blob
    assert asset.status_code == 200 and asset.content == blob
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert no_params.status_code == 400 and no_params.json()["code"] == "invalid_input"


def test_permissions_on_the_gateway(site, blob):
    gateway = site["gateway"]
    with httpx.Client(base_url=gateway.url, timeout=10) as anonymous:
        assert anonymous.get(site["path"]).status_code == 401
        assert anonymous.get(site["path"]).json()["code"] == "unauthorized"
        public = anonymous.get(site["public_path"])
        assert public.status_code == 200 and public.content == b"public bytes"
        bad = anonymous.get(site["path"], headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401
        basic = anonymous.get(site["path"], headers={"Authorization": "Basic eDp5"})
        assert basic.status_code == 401
    with gateway.client(OTHER_TOKEN) as other:
        # A principal without read rights cannot tell a private repository from a missing one.
        foreign = other.get(site["path"])
        nowhere = other.get(site["path"].replace("/priv/", "/nowhere/"))
        assert foreign.status_code == nowhere.status_code == 404
        assert foreign.json()["code"] == "not_found"
    with gateway.client(READER_TOKEN) as reader:
        assert reader.get(site["path"]).content == blob


def test_malformed_ids_are_400_not_500(site):
    with site["gateway"].client() as client:
        assert client.get("/api/v1/repositories/priv/artifacts/not-a-uuid/content").status_code == 400
        assert client.get("/api/v1/repositories/bad%20name/artifacts/x/content").status_code == 400
        unknown = client.get("/api/v1/repositories/priv/artifacts/00000000-0000-0000-0000-000000000000/content")
        assert unknown.status_code == 404


def test_truncated_blob_aborts_instead_of_sending_wrong_bytes(fresh_site):
    sha = fresh_site["artifact"]["sha256"]
    blob_path = fresh_site["cluster"].data_dir / "blobs" / "sha256" / sha[:2] / sha[2:4] / sha
    with open(blob_path, "r+b") as handle:
        handle.truncate(SIZE // 2)
    gateway = fresh_site["gateway"]
    with gateway.client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(fresh_site["path"])
        metrics = client.get("/health/metrics").text
    assert "arkvory_download_short_reads_total 1.0" in metrics
    assert "shorter on disk than its metadata" in gateway.stderr
    assert gateway.proc.poll() is None


def test_interrupted_upload_leaves_no_artifact_and_no_file(site):
    writer = site["writer"]
    with socket.create_connection(("127.0.0.1", writer.port)) as sock:
        sock.sendall(
            b"POST /api/v1/repositories/priv/artifacts?name=cut.bin HTTP/1.1\r\n"
            b"Host: x\r\nAuthorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
            b"Content-Length: 1000000\r\n\r\n" + b"x" * 50_000
        )
    with writer.client() as client:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any((site["cluster"].data_dir / "tmp").iterdir()):
            time.sleep(0.1)
        names = [a["name"] for a in client.get("/api/v1/repositories/priv/artifacts").json()["items"]]
    assert "cut.bin" not in names
    assert list((site["cluster"].data_dir / "tmp").iterdir()) == []


def test_a_stalled_database_gives_503_not_500(cluster, db_proxy):
    # A standalone writer has no lease to lose: the request itself must fail cleanly.
    writer = cluster.writer(ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url)).wait_ready()
    db_proxy.stall()
    with writer.client(timeout=30) as client:
        started = time.monotonic()
        answer = client.get("/api/v1/repositories/priv/artifacts/00000000-0000-0000-0000-000000000000/content")
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] in ("busy", "unavailable")
    assert "Retry-After" in answer.headers
    assert time.monotonic() - started < 12
    db_proxy.resume()
