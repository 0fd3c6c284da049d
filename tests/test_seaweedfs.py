"""shared/cli/seaweedfs.py against the real `weed` it starts: credentials required, no blob, listing
or write through its filer, volume or master HTTP ports without a signed token (what a local user
or a web page could send), no gRPC without the store's certificate, data kept across a kill and a
restart on the same ports, nothing left running. No S3 mock anywhere.

Requests are signed by curl (--aws-sigv4), independent of the client library under test elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pathlib
import re
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import tomllib
import urllib.error
import urllib.request

import pytest

from arkvory.shared.cli import seaweedfs as seaweedfs_module
from arkvory.shared.cli.seaweedfs import SeaweedFS, SeaweedFSError, start_seaweedfs
from arkvory.shared.storage.s3 import blob_key

from .s3store import weed_or_skip
from .tools import require_tool

@pytest.fixture(autouse=True)
def _curl():
    """curl signs the requests here (--aws-sigv4)."""
    require_tool("curl", apt="curl")


def curl(store: SeaweedFS, *args: str, credentials=None) -> tuple[int, bytes]:
    creds = credentials or store.credentials
    sign = [
        "--aws-sigv4", f"aws:amz:{store.region}:s3",
        "--user", f"{creds.access_key_id}:{creds.secret_access_key}",
        # curl 7.x signs a body wrongly otherwise; S3 accepts an unsigned payload.
        "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
    ]
    result = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}", *sign, *args],
        capture_output=True, timeout=30,
    )
    body, _, status = result.stdout.rpartition(b"\n")
    return int(status or 0), body


def unsigned(*args: str) -> int:
    """The status of a request with no S3 signature: what any local user or web page can send."""
    result = subprocess.run(
        ["curl", "-sS", "--noproxy", "*", "--max-time", "20", "-o", "/dev/null",
         "-w", "%{http_code}", *args],
        capture_output=True, text=True, timeout=30,
    )
    return int(result.stdout or 0)


def weed_shell(store: SeaweedFS, command: str, *, as_owner: bool = True, timeout: float = 60) -> str:
    """`command`'s output from `weed shell`, which speaks gRPC to the master and filer. As the
    store's owner it runs in the store's directory, where it reads security.toml (the gRPC
    certificate); as anyone else, elsewhere, it has none. TimeoutExpired if it hangs."""
    p = store.ports
    # weed shell leaves a glog file at every run, -logtostderr or not: in the store's directory.
    log_dir = f"-logdir={store.home}"
    result = subprocess.run(
        [str(store.weed), "-logtostderr", log_dir, "shell", f"-master=127.0.0.1:{p.master}.{p.master_grpc}"],
        input=f"{command}\nexit\n", capture_output=True, text=True, timeout=timeout,
        cwd=store.home if as_owner else "/",
        env={"PATH": "/usr/bin:/bin", "HOME": str(store.home if as_owner else store.home.parent)},
    )
    if as_owner:
        assert result.returncode == 0, result.stderr
    return result.stdout


def file_id_of(store: SeaweedFS, path: str) -> str:
    """The volume file id holding `path`'s (one-chunk) content, from the filer's metadata (as the
    owner: nobody else reaches it; the tests below attack with it)."""
    match = re.search(r'"fileId":\s*"(\d+,[0-9a-f]+)"', weed_shell(store, f"fs.meta.cat {path}"))
    assert match, f"no chunk for {path}"
    return match.group(1)


def hs256_jwt(key: str, claims: dict) -> str:
    """A JWT signed with HMAC-SHA256 as weed checks them: with a key of ours, a forgery."""

    def encode(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")

    def compact(value: dict) -> str:
        return encode(json.dumps(value, separators=(",", ":")).encode())

    signing_input = compact({"alg": "HS256", "typ": "JWT"}) + "." + compact(claims)
    signature = hmac.new(key.encode(), signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + encode(signature)


NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
HTTP2_SERVER_SETTINGS = b"\x00\x00"  # a frame header's length, then type 4: SETTINGS


def plain_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A GET with no S3 signature (status, headers, the first MiB of the body): what any local
    user, or a web page's fetch, can send."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with NO_PROXY.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(1 << 20)


def anonymous_status(url: str) -> int:
    try:
        with NO_PROXY.open(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def is_gone(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


@pytest.fixture
def store(tmp_path: pathlib.Path):
    weed_or_skip()
    server = start_seaweedfs(tmp_path, buckets=["arkvory-test"])
    yield server
    server.destroy()


@pytest.mark.timeout(180)
def test_signed_requests_work_anonymous_ones_are_refused(store: SeaweedFS, tmp_path) -> None:
    url = f"{store.endpoint_url}/arkvory-test"
    assert anonymous_status(f"{store.endpoint_url}/") == 403
    assert anonymous_status(f"{url}?list-type=2") == 403

    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(100_000))
    status, _ = curl(store, "-X", "PUT", "--data-binary", f"@{payload}", f"{url}/a/b.bin")
    assert status == 200
    status, body = curl(store, f"{url}/a/b.bin")
    assert (status, body) == (200, payload.read_bytes())
    assert anonymous_status(f"{url}/a/b.bin") == 403

    status, body = curl(store, f"{url}?list-type=2")
    assert status == 200 and b"<Key>a/b.bin</Key>" in body

    wrong = seaweedfs_module.Credentials(store.credentials.access_key_id, "not-the-secret")
    assert curl(store, f"{url}/a/b.bin", credentials=wrong)[0] == 403


@pytest.mark.timeout(180)
def test_the_arkvory_identity_cannot_create_buckets_and_a_missing_bucket_stays_missing(
    store: SeaweedFS,
) -> None:
    # Not even by writing into it: SeaweedFS would auto-create it for an admin identity.
    missing = f"{store.endpoint_url}/nothere/k"
    assert curl(store, "-X", "PUT", "--data-binary", "x", missing)[0] == 404
    assert curl(store, "-X", "PUT", f"{store.endpoint_url}/newbucket")[0] == 403
    status, body = curl(store, f"{store.endpoint_url}/")
    assert status == 200 and b"<Name>nothere</Name>" not in body
    # The admin identity can; and the bucket helpers are idempotent.
    admin = store.admin_credentials
    assert curl(store, "-X", "PUT", f"{store.endpoint_url}/adminmade", credentials=admin)[0] == 200
    store.create_bucket("arkvory-test")
    store.delete_bucket("adminmade")
    store.delete_bucket("adminmade")
    assert curl(store, f"{store.endpoint_url}/adminmade?list-type=2")[0] == 404


@pytest.mark.timeout(180)
def test_the_filer_volume_and_master_ports_refuse_writes_without_a_signed_token(
    store: SeaweedFS, tmp_path
) -> None:
    url = f"{store.endpoint_url}/arkvory-test/blob"
    original = tmp_path / "original"
    original.write_bytes(os.urandom(50_000))
    assert curl(store, "-X", "PUT", "--data-binary", f"@{original}", url)[0] == 200
    forged = tmp_path / "forged"
    forged.write_bytes(b"other bytes")
    other_key = hs256_jwt("not-the-key", {"exp": int(time.time()) + 10})
    bearer = f"Authorization: Bearer {other_key}"

    # The filer has no HTTP API at all (404 for every path), the reported attack included: a
    # multipart form, which a web page may POST without a CORS preflight.
    filer = f"http://127.0.0.1:{store.ports.filer}/buckets/arkvory-test"
    assert unsigned("-X", "POST", "-F", f"file=@{forged}", f"{filer}/blob") == 404
    assert unsigned("-X", "POST", "-F", f"file=@{forged}", f"{filer}/pwned.txt") == 404
    assert unsigned("-X", "PUT", "--data-binary", f"@{forged}", f"{filer}/blob") == 404
    assert unsigned("-X", "DELETE", f"{filer}/blob") == 404
    assert unsigned("-X", "DELETE", f"{filer}/?recursive=true") == 404
    assert unsigned("-X", "POST", f"http://127.0.0.1:{store.ports.filer}/buckets/anyones/") == 404
    assert unsigned("-H", bearer, "-X", "POST", "-F", f"file=@{forged}", f"{filer}/blob") == 404

    # The volume server holds the bytes; a token signed with another key is no better than none.
    file_id = file_id_of(store, "/buckets/arkvory-test/blob")
    needle = f"http://127.0.0.1:{store.ports.volume}/{file_id}"
    assert unsigned("-X", "POST", "-F", f"file=@{forged}", needle) == 401
    assert unsigned("-X", "PUT", "--data-binary", f"@{forged}", needle) == 401
    assert unsigned("-X", "DELETE", needle) == 401
    assert unsigned("-H", bearer, "-X", "POST", "-F", f"file=@{forged}", needle) == 401

    # The master hands out no write token (/dir/assign, /dir/lookup) and drops no volume.
    master = f"http://127.0.0.1:{store.ports.master}"
    for path in (f"/dir/lookup?fileId={file_id}", "/dir/assign", "/dir/assign?collection=arkvory-test"):
        status, headers, _ = plain_get(master + path)
        assert (status, headers.get("Authorization")) == (404, None), path
    for path in ("/col/delete?collection=arkvory-test", "/vol/grow?collection=arkvory-test&count=1",
                 "/vol/vacuum", f"/{file_id}", "/submit"):
        assert unsigned("-X", "POST", master + path) == 404, path

    assert curl(store, url) == (200, original.read_bytes())
    status, listing = curl(store, f"{store.endpoint_url}/arkvory-test?list-type=2")
    assert status == 200 and b"pwned" not in listing
    assert b"<Name>anyones</Name>" not in curl(store, f"{store.endpoint_url}/")[1]


@pytest.mark.timeout(180)
def test_the_signing_keys_are_new_at_each_start_in_a_private_file_and_nowhere_else(
    store: SeaweedFS,
) -> None:
    config = store.home / "security.toml"
    private_files = [config, store.home / "grpc.key", store.home / "grpc.crt"]

    def keys() -> list[str]:
        jwt = tomllib.loads(config.read_text())["jwt"]
        # The volume server's and the filer's, each for writes and for reads; the gRPC key.
        found = [jwt["signing"]["key"], jwt["signing"]["read"]["key"],
                 jwt["filer_signing"]["key"], jwt["filer_signing"]["read"]["key"]]
        assert len(set(found)) == 4 and all(len(key) >= 40 for key in found)
        grpc_key = (store.home / "grpc.key").read_text()
        assert grpc_key.startswith("-----BEGIN PRIVATE KEY-----\n")
        return [*found, "".join(grpc_key.splitlines()[1:-1])]

    first = keys()
    for path in private_files:
        path.chmod(0o644)  # as a copy or an older version might have left it
    store.restart()
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in private_files)
    second = keys()
    assert not set(first) & set(second)
    process = pathlib.Path(f"/proc/{store.pid}")
    seen = [
        (process / "cmdline").read_bytes().decode(errors="replace"),
        (process / "environ").read_bytes().decode(errors="replace"),
        store.log_path.read_text(errors="replace"),
    ]
    for key in first + second:
        assert not any(key in text for text in seen)
    # The store works with the new keys: a bucket is made and dropped, an object written and read.
    store.create_bucket("after-restart")
    assert curl(store, f"{store.endpoint_url}/after-restart?list-type=2")[0] == 200
    object_url = f"{store.endpoint_url}/after-restart/o"
    assert curl(store, "-X", "PUT", "--data-binary", "new keys", object_url)[0] == 200
    assert curl(store, object_url) == (200, b"new keys")
    store.delete_bucket("after-restart")
    assert curl(store, f"{store.endpoint_url}/after-restart?list-type=2")[0] == 404


@pytest.mark.timeout(180)
def test_a_plain_get_reads_no_blob_and_no_listing_while_arkvory_serves_it_through_s3(
    s3_cluster,
) -> None:
    """The issue's attack: a blob of a repository, read from the filer's path, a directory
    listing, a needle by its file id, from any local user (a plain GET) or a web page (its
    Origin), past Arkvory's permissions and budget."""
    writer = s3_cluster.writer().wait_ready()
    data = os.urandom(120_000)
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "private"}).status_code == 201
        made = client.post("/api/v1/repositories/private/artifacts", params={"name": "a.bin"}, content=data)
        assert made.status_code == 201, made.text
    content = f"/api/v1/repositories/private/artifacts/{made.json()['id']}/content"
    store, bucket = s3_cluster.bucket.store, s3_cluster.bucket.name
    blob = f"/buckets/{bucket}/{s3_cluster.prefix}/{blob_key(made.json()['sha256'])}"
    file_id = file_id_of(store, blob)  # the path is right: the filer has it

    web_page = {"Origin": "http://evil.example"}
    filer = f"http://127.0.0.1:{store.ports.filer}"
    listings = (f"/buckets/{bucket}/", f"/buckets/{bucket}/{s3_cluster.prefix}/", "/buckets/", "/",
                f"/buckets/{bucket}/?pretty=y&limit=1000")
    for path in (blob, f"{blob}?metadata=true", *listings):
        for headers in ({}, web_page):
            status, answer_headers, body = plain_get(filer + path, headers)
            assert status == 404 and data[:4096] not in body and bucket.encode() not in body, path
            assert "Access-Control-Allow-Origin" not in answer_headers, path
    other_key = hs256_jwt("not-the-key", {"exp": int(time.time()) + 10, "fid": file_id})
    forged = {"Authorization": f"Bearer {other_key}"}
    # (The volume server answers every Origin, weed 4.48 has no setting for it: with a refusal.)
    for headers in ({}, web_page, forged):
        status, _, body = plain_get(f"http://127.0.0.1:{store.ports.volume}/{file_id}", headers)
        assert status == 401 and data[:4096] not in body
    master = f"http://127.0.0.1:{store.ports.master}"
    for path in (f"/{file_id}", f"/dir/lookup?fileId={file_id}&read=yes"):
        status, answer_headers, body = plain_get(master + path, web_page)
        assert status == 404 and "Authorization" not in answer_headers and data[:4096] not in body
    # The S3 port: signed requests only, and no web page reads even its refusals.
    status, answer_headers, _ = plain_get(f"{store.endpoint_url}/{bucket}/{blob.split('/', 3)[3]}", web_page)
    assert status == 403 and "Access-Control-Allow-Origin" not in answer_headers

    with writer.client() as client:
        served = client.get(content)
    assert served.status_code == 200 and served.content == data


@pytest.mark.timeout(180)
def test_no_local_user_reaches_the_grpc_ports_without_the_store_s_certificate(store: SeaweedFS) -> None:
    """Issue 22's last open door: any local user's `weed shell` read (and wrote) every blob
    through the gRPC ports. Now each asks for the certificate made at this start."""
    url = f"{store.endpoint_url}/arkvory-test/blob"
    assert curl(store, "-X", "PUT", "--data-binary", "the private blob", url)[0] == 200
    path = "/buckets/arkvory-test/blob"
    # Each gRPC port: a TLS handshake without a client certificate ends in the server's alert,
    # a plain-text HTTP/2 (gRPC) preface gets no HTTP/2 answer.
    grpc_ports = (store.ports.master_grpc, store.ports.volume_grpc, store.ports.filer_grpc, store.ports.s3_grpc)
    for port in grpc_ports:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
                with context.wrap_socket(raw) as tls:
                    tls.sendall(HTTP2_PREFACE)
                    tls.recv(1)  # TLS 1.3: the refusal of our (missing) certificate comes here
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(HTTP2_PREFACE + HTTP2_EMPTY_SETTINGS)
            answer = raw.recv(64)
            assert not answer.startswith(HTTP2_SERVER_SETTINGS), port  # a TLS alert, or closed
    # The attacker's tool: `weed shell` without the store's directory keeps failing to connect.
    try:
        output = weed_shell(store, f"fs.cat {path}", as_owner=False, timeout=8)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
    assert "the private blob" not in output
    # The store's owner, with its certificate, reaches it: the ports above are the right ones.
    assert weed_shell(store, f"fs.cat {path}") == "the private blob"


@pytest.mark.timeout(240)
def test_killed_the_store_refuses_connections_restarted_it_still_has_the_object(
    store: SeaweedFS,
) -> None:
    url = f"{store.endpoint_url}/arkvory-test/kept"
    assert curl(store, "-X", "PUT", "--data-binary", "still here", url)[0] == 200
    pid, ports = store.pid, store.ports
    store.kill()
    assert not store.running and is_gone(pid)
    status, _ = curl(store, url)
    assert status == 0  # curl: connection refused, no HTTP answer
    with pytest.raises(urllib.error.URLError) as refused:
        anonymous_status(store.endpoint_url)
    assert isinstance(refused.value.reason, ConnectionRefusedError)

    store.restart()
    assert store.ports == ports and store.pid != pid
    assert curl(store, url) == (200, b"still here")
    # Writes work again too (the volume server is back with the master).
    assert curl(store, "-X", "PUT", "--data-binary", "new", f"{url}-2")[0] == 200


@pytest.mark.timeout(180)
def test_stop_leaves_no_process_and_no_socket_behind(store: SeaweedFS) -> None:
    pid, ports = store.pid, store.ports
    started = time.monotonic()
    store.stop()
    assert time.monotonic() - started < seaweedfs_module.STOP_GRACE + seaweedfs_module.KILL_WAIT
    assert is_gone(pid) and store.pid is None
    for port in (ports.master_grpc, ports.volume_grpc, ports.filer_grpc, ports.s3_grpc):
        assert not any(pathlib.Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"))
    store.stop()  # twice is fine


@pytest.mark.timeout(180)
def test_the_store_dies_with_the_process_that_started_it(tmp_path: pathlib.Path) -> None:
    weed_or_skip()
    script = textwrap.dedent(f"""
        import pathlib, sys
        sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parent.parent)!r})
        from arkvory.shared.cli.seaweedfs import start_seaweedfs
        store = start_seaweedfs(pathlib.Path({str(tmp_path)!r}))
        print(store.pid, *store.ports.all(), flush=True)
        sys.stdin.read()
    """)
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        try:
            weed_pid, *ports = map(int, parent.stdout.readline().split())
            assert not is_gone(weed_pid)
        finally:
            parent.kill()  # SIGKILL: no clean-up of its own, only the death signal acts
            parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not is_gone(weed_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert is_gone(weed_pid)
    for port in ports:  # what its stop would have removed
        for socket_file in pathlib.Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"):
            socket_file.unlink(missing_ok=True)


def test_without_weed_the_error_says_what_to_install(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SeaweedFSError, match=r"ARKVORY_WEED"):
        start_seaweedfs(tmp_path, environ={"ARKVORY_WEED": str(tmp_path / "missing-weed")})


def test_credentials_are_masked_in_reprs(tmp_path: pathlib.Path) -> None:
    creds = seaweedfs_module.Credentials.generate()
    assert creds.secret_access_key not in repr(creds)
    assert creds.access_key_id in repr(creds)
