"""The client's downloads against real processes (SPEC §10): resume after a cut with Range +
If-Range on another backend, restart cleanly on a 200, never splice two ETags, continue a .part
left by an interrupted run, and verify the SHA-256 before the file is moved into place.

Faults come from killing a real gateway behind the real HAProxy configuration of deploy/, and
from tests/clientproxy.py between the client and a writer (cuts after N bytes, a backend that
ignores Range).
"""

from __future__ import annotations

import hashlib
import os
import threading

import httpx
import pytest

from arkvory.shared.client import Client, RetryPolicy, errors

from .balancers import start_haproxy
from .clientproxy import Cut, HttpFaultProxy
from .harness import ADMIN_TOKEN, eventually

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
QUICK = RetryPolicy(max_attempts=8, max_total_seconds=60, backoff_initial=0.2, backoff_max=1.0)


def create_repo(process, name: str = "builds") -> None:
    with process.client() as http:
        assert http.post("/api/v1/repositories", json={"name": name}).status_code == 201


def put_artifact(process, data: bytes, name: str = "big.bin", repo: str = "builds") -> dict:
    with process.client(timeout=60) as http:
        answer = http.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": name}, content=data)
    assert answer.status_code == 201, answer.text
    return answer.json()


def point_asset(process, path: str, artifact_id: str, repo: str = "builds") -> None:
    with process.client() as http:
        answer = http.put(f"/api/v1/repositories/{repo}/assets", params={"path": path}, json={"artifactId": artifact_id})
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def writer(module_cluster):
    """One writer for the module: each test downloads artifacts of its own (random bytes) and
    names its assets apart from the others'."""
    process = module_cluster.writer().wait_ready()
    create_repo(process)
    return process


@pytest.fixture
def proxy(writer):
    with HttpFaultProxy(writer.port) as running:
        yield running


# -- through HAProxy: a gateway killed mid-stream ------------------------------------------------


@pytest.fixture
def haproxy_front(tmp_path):
    """Starts deploy/haproxy/haproxy.cfg in front of the given ports; returns its URL once it
    forwards to a ready writer."""
    running = []

    def start(ports: dict[str, int]) -> str:
        front = start_haproxy(tmp_path, ports)
        running.append(front)
        front.wait_answering()
        eventually(lambda: httpx.get(front.url + "/health/status", timeout=2).status_code == 200,
                   "haproxy forwards", timeout=15)
        return front.url

    yield start
    for front in running:
        front.stop()


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_a_gateway_killed_mid_download_behind_haproxy_costs_only_the_missing_bytes(cluster, haproxy_front):
    # 1 MiB/s for each of the three processes: a 5 MiB download takes about five seconds.
    shared = cluster.shared_env(slots=3, total=3 * MiB)
    writer = cluster.writer(shared).wait_ready()
    gateways = [cluster.gateway(slot, shared).wait_ready() for slot in (1, 2)]
    create_repo(writer)
    data = os.urandom(5 * MiB)
    artifact = put_artifact(writer, data)
    front = haproxy_front({
        "127.0.0.1:8080": writer.port, "127.0.0.1:8081": gateways[0].port, "127.0.0.1:8082": gateways[1].port,
    })

    # Three downloads started one after another: HAProxy's leastconn puts them on three different
    # backends, so exactly one of them streams from the gateway we kill.
    results, failures, received = [None] * 3, [], [0] * 3

    def progress(i: int, done: int) -> None:
        received[i] = done

    def download(i: int) -> None:
        try:
            with Client(front, ADMIN_TOKEN, retry=QUICK) as client:
                results[i] = client.download(
                    "builds", cluster.workdir / f"out{i}.bin", artifact_id=artifact["id"],
                    progress=lambda done, total: progress(i, done),
                )
        except Exception as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=download, args=(i,)) for i in range(3)]
    for i, thread in enumerate(threads):
        thread.start()
        eventually(lambda i=i: failures or received[i], f"download {i} under way", timeout=20)
    # Well into every download (about 1 s of 5 at 1 MiB/s each), far from its end.
    eventually(lambda: failures or min(received) >= MiB, "a MiB of every download", timeout=20)
    assert not failures, failures
    gateways[0].kill()  # SIGKILL, mid-stream
    for thread in threads:
        thread.join(90)
    assert not failures, failures

    digest = hashlib.sha256(data).hexdigest()
    for i, result in enumerate(results):
        assert result.sha256 == digest and result.size == len(data)
        assert (cluster.workdir / f"out{i}.bin").read_bytes() == data
        assert result.restarts == 0
        # Every byte crossed once: resumed downloads asked only for what they were missing.
        assert result.received_bytes == len(data), result
    resumed = [r for r in results if r.resumed_bytes]
    assert len(resumed) == 1, results
    assert 0 < resumed[0].resumed_bytes < len(data)
    assert resumed[0].attempts >= 2
    assert not list(cluster.workdir.glob("out*.part*"))


# -- through the fault proxy ------------------------------------------------------------------


def test_a_cut_download_resumes_with_a_range_and_gets_only_the_rest(writer, proxy, tmp_path):
    data = os.urandom(9 * MiB)
    artifact = put_artifact(writer, data)
    proxy.cuts.append(Cut(after_bytes=3 * MiB + 123, match="/content"))
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        result = client.download("builds", tmp_path / "out.bin", artifact_id=artifact["id"])
    assert (tmp_path / "out.bin").read_bytes() == data
    first, second = proxy.requests_to("/content")
    assert first.cut and first.status == 200 and "range" not in first.headers
    assert second.status == 206
    assert second.headers["range"] == f"bytes={first.response_body_bytes}-"
    assert second.headers["if-range"] == f'"sha256:{artifact["sha256"]}"'
    assert result.resumed_bytes == first.response_body_bytes
    assert result.received_bytes == len(data) and result.restarts == 0 and result.attempts == 2
    assert not (tmp_path / "out.bin.part").exists() and not (tmp_path / "out.bin.part.etag").exists()


def test_a_backend_that_answers_200_to_a_range_makes_the_client_start_over(writer, proxy, tmp_path):
    data = os.urandom(6 * MiB)
    artifact = put_artifact(writer, data)
    proxy.strip_request_headers |= {"range", "if-range"}  # this "backend" ignores Range
    proxy.cuts.append(Cut(after_bytes=2 * MiB, match="/content"))
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        result = client.download("builds", tmp_path / "out.bin", artifact_id=artifact["id"])
    assert (tmp_path / "out.bin").read_bytes() == data
    first, second = proxy.requests_to("/content")
    assert first.cut and "range" in second.headers and second.status == 200
    assert result.restarts == 1 and result.resumed_bytes == 0
    assert result.received_bytes == first.response_body_bytes + len(data)


def test_an_asset_re_pointed_between_cut_and_resume_restarts_and_never_splices(writer, proxy, tmp_path):
    old, new = os.urandom(6 * MiB), os.urandom(6 * MiB)
    old_artifact = put_artifact(writer, old, "old.bin")
    new_artifact = put_artifact(writer, new, "new.bin")
    point_asset(writer, "latest/app.bin", old_artifact["id"])
    proxy.cuts.append(
        Cut(after_bytes=2 * MiB, match="/asset/content", then=lambda: point_asset(writer, "latest/app.bin", new_artifact["id"]))
    )
    with Client(proxy.url, ADMIN_TOKEN, retry=QUICK) as client:
        result = client.download("builds", tmp_path / "app.bin", asset="latest/app.bin")
    assert (tmp_path / "app.bin").read_bytes() == new
    assert result.sha256 == new_artifact["sha256"] and result.etag == f'"sha256:{new_artifact["sha256"]}"'
    first, second = proxy.requests_to("/asset/content")
    assert second.headers["if-range"] == f'"sha256:{old_artifact["sha256"]}"' and second.status == 200
    assert result.restarts == 1 and result.resumed_bytes == 0


class Interrupted(Exception):
    """Stands for the client process being killed mid-download."""


def test_a_part_file_left_by_an_interrupted_run_is_continued(writer, tmp_path):
    data = os.urandom(10 * MiB)
    artifact = put_artifact(writer, data)
    dest = tmp_path / "out.bin"

    def interrupt(done: int, total: int | None) -> None:
        if done >= 4 * MiB:
            raise Interrupted

    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(Interrupted):
            client.download("builds", dest, artifact_id=artifact["id"], progress=interrupt)
        left = (tmp_path / "out.bin.part").stat().st_size
        assert left >= 4 * MiB and not dest.exists()
        assert (tmp_path / "out.bin.part.etag").read_text().strip() == f'"sha256:{artifact["sha256"]}"'
        result = client.download("builds", dest, artifact_id=artifact["id"])
    assert dest.read_bytes() == data
    assert result.resumed_bytes == left and result.received_bytes == len(data) - left


def test_a_part_file_of_another_etag_is_not_continued(writer, tmp_path):
    old, new = os.urandom(5 * MiB), os.urandom(5 * MiB)
    old_artifact, new_artifact = put_artifact(writer, old, "old.bin"), put_artifact(writer, new, "new.bin")
    point_asset(writer, "app.bin", old_artifact["id"])
    dest = tmp_path / "app.bin"

    def interrupt(done: int, total: int | None) -> None:
        if done >= 4 * MiB:
            raise Interrupted

    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(Interrupted):
            client.download("builds", dest, asset="app.bin", progress=interrupt)
        point_asset(writer, "app.bin", new_artifact["id"])
        result = client.download("builds", dest, asset="app.bin")
    assert dest.read_bytes() == new
    assert result.restarts == 1 and result.resumed_bytes == 0


def test_a_digest_mismatch_raises_and_removes_the_part_file(writer, tmp_path):
    data = os.urandom(3 * MiB)
    artifact = put_artifact(writer, data)
    dest = tmp_path / "out.bin"
    # A .part whose first bytes were damaged on disk, under the right ETag: the resume is
    # accepted (206), but the whole file's SHA-256 cannot match.
    damaged = bytearray(data[: MiB])
    damaged[10] ^= 0x01
    (tmp_path / "out.bin.part").write_bytes(bytes(damaged))
    (tmp_path / "out.bin.part.etag").write_text(f'"sha256:{artifact["sha256"]}"\n')
    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(errors.IntegrityError) as raised:
            client.download("builds", dest, artifact_id=artifact["id"])
    assert raised.value.exit_code == 5
    assert not dest.exists() and not (tmp_path / "out.bin.part").exists()
    assert not (tmp_path / "out.bin.part.etag").exists()


def test_package_download_and_argument_checks(writer, tmp_path):
    data = os.urandom(MiB + 17)
    artifact = put_artifact(writer, data)
    with writer.client() as http:
        answer = http.put(
            "/api/v1/repositories/builds/packages",
            json={"group": "org.example", "name": "tool", "version": "1.0", "artifactId": artifact["id"]},
        )
        assert answer.status_code == 201, answer.text
    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        result = client.download("builds", tmp_path / "tool.bin", package=("org.example", "tool", "1.0"))
        assert (tmp_path / "tool.bin").read_bytes() == data and result.attempts == 1
        with pytest.raises(errors.UsageError):
            client.download("builds", tmp_path / "x", artifact_id=artifact["id"], asset="a")
        with pytest.raises(errors.NotFoundError):
            client.download("builds", tmp_path / "y", package=("org.example", "tool", "9.9"))


def test_a_download_moves_on_to_the_next_base_url_when_one_does_not_answer(writer, tmp_path, refused_url):
    data = os.urandom(2 * MiB)
    artifact = put_artifact(writer, data)
    dead = refused_url()
    seen = []
    with Client([dead, writer.url], ADMIN_TOKEN, retry=QUICK) as client:
        result = client.download(
            "builds", tmp_path / "out.bin", artifact_id=artifact["id"], progress=lambda d, t: seen.append((d, t))
        )
    assert (tmp_path / "out.bin").read_bytes() == data
    assert result.attempts == 2 and result.received_bytes == len(data)
    assert seen[0] == (0, len(data)) and seen[-1] == (len(data), len(data))


# -- durability, the output directory, no litter --------------------------------------------------


def test_durability_is_opt_in_like_curl_and_wget(writer, tmp_path, monkeypatch):
    """By default the verified file is renamed into place without any fsync or early-flush
    thread; `durable=True` flushes early, fsyncs the file, then its directory."""
    data = os.urandom(40 * MiB)  # more than partfile.FLUSH_EVERY: an early flush would show
    artifact = put_artifact(writer, data)
    out = tmp_path / "out"  # a directory that holds nothing else
    out.mkdir()
    synced: list[str] = []

    def recording(real):
        def call(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        return call

    monkeypatch.setattr(os, "fsync", recording(os.fsync))
    monkeypatch.setattr(os, "fdatasync", recording(os.fdatasync))
    flushers: list[str] = []

    def watch(done: int, total: int | None) -> None:
        if done == total:  # the part file's threads are still running
            flushers.extend(t.name for t in threading.enumerate() if t.name.startswith("arkvory-part-flush"))

    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        plain = client.download("builds", out / "plain.bin", artifact_id=artifact["id"], progress=watch)
        assert plain.sha256 == artifact["sha256"] and (out / "plain.bin").read_bytes() == data
        assert synced == [] and flushers == []
        assert [p.name for p in out.iterdir()] == ["plain.bin"]

        durable = client.download(
            "builds", out / "durable.bin", artifact_id=artifact["id"], progress=watch, durable=True
        )
    assert durable.sha256 == artifact["sha256"] and (out / "durable.bin").read_bytes() == data
    assert flushers, "no early flush thread ran"
    part, directory = str(out / "durable.bin.part"), str(out)
    assert part in synced and synced[-1] == directory, synced
    assert synced.index(part) < synced.index(directory)


def test_the_output_directory_must_exist(writer, tmp_path):
    """Like curl without --create-dirs: a missing directory is a LocalIOError naming it."""
    artifact = put_artifact(writer, os.urandom(1000))
    missing = tmp_path / "missing" / "dir"
    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(errors.LocalIOError) as raised:
            client.download("builds", missing / "out.bin", artifact_id=artifact["id"])
    assert raised.value.exit_code == 8 and str(missing) in str(raised.value)
    assert not (tmp_path / "missing").exists()


def test_a_download_refused_before_its_first_byte_leaves_no_part_file(writer, tmp_path):
    """Nothing arrived, nothing to resume: no empty NAME.part (or .part.etag) is left. A .part
    with bytes from an earlier run is kept for the next one."""
    artifact = put_artifact(writer, os.urandom(1000))
    out = tmp_path / "out"  # a directory that holds nothing else
    out.mkdir()
    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(errors.NotFoundError):
            client.download("builds", out / "a.bin", artifact_id="00000000-0000-4000-8000-000000000000")
    with Client(writer.url, "arkvory_key_wrong", retry=QUICK) as client:
        with pytest.raises(errors.AuthError):
            client.download("builds", out / "b.bin", artifact_id=artifact["id"])
    assert list(out.iterdir()) == []

    (out / "c.bin.part").write_bytes(b"earlier bytes")
    (out / "c.bin.part.etag").write_text('"sha256:earlier"\n')
    with Client(writer.url, ADMIN_TOKEN, retry=QUICK) as client:
        with pytest.raises(errors.NotFoundError):
            client.download("builds", out / "c.bin", artifact_id="00000000-0000-4000-8000-000000000000")
    assert (out / "c.bin.part").read_bytes() == b"earlier bytes"
    assert (out / "c.bin.part.etag").exists()
