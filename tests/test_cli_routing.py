"""The CLI as a newcomer meets it (issue 14 §4): pointed at a read gateway, or at a gateway and
the writer; a mistyped port or option; the messages of a missing repository, an identical re-put
and a resumed get. The real CLI in a subprocess against a real writer and gateway."""

from __future__ import annotations

import hashlib
import os
import pathlib
import time
import uuid

import pytest

from .harness import ADMIN_TOKEN, Cluster
from .test_cli import arkvory, assert_exit, cli_env, json_of, unique_file

pytestmark = pytest.mark.timeout(180)

REPO = "builds"


class Stack:
    def __init__(self, writer, gateway) -> None:
        self.writer, self.gateway = writer, gateway

    def upload(self, name: str, data: bytes) -> dict:
        with self.writer.client(ADMIN_TOKEN) as client:
            answer = client.post(f"/api/v1/repositories/{REPO}/artifacts", params={"name": name}, content=data)
        assert answer.status_code == 201, answer.text
        return answer.json()


@pytest.fixture(scope="module")
def stack(postgres, module_tmp_path):
    """A writer and one read gateway (what `arkvory dev` runs), with a private `builds`."""
    group = Cluster(postgres.create_database(f"t_{uuid.uuid4().hex[:16]}"), module_tmp_path)
    try:
        shared = group.shared_env()
        writer = group.writer(shared).wait_ready()
        gateway = group.gateway(1, shared).wait_ready()
        with writer.client() as client:
            assert client.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        yield Stack(writer, gateway)
    finally:
        group.close()


@pytest.fixture
def home(tmp_path) -> pathlib.Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def work(tmp_path) -> pathlib.Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


# a gateway, alone or first ------------------------------------------------------------------------


def test_get_from_a_gateway_alone_names_the_file_from_the_content_route(stack, home, work):
    data = os.urandom(50_000)
    artifact = stack.upload("from-gateway.bin", data)
    run = arkvory(cli_env(home, stack.gateway.url), work, "get", REPO, artifact["id"])
    assert_exit(run, 0)
    assert (work / "from-gateway.bin").read_bytes() == data
    (work / "into").mkdir()
    assert_exit(arkvory(cli_env(home, stack.gateway.url), work, "get", REPO, artifact["id"], "-o", "into"), 0)
    assert (work / "into" / "from-gateway.bin").read_bytes() == data


def test_every_command_works_with_the_gateway_listed_before_the_writer(stack, home, work, tmp_path):
    env = cli_env(home, f"{stack.gateway.url},{stack.writer.url}")
    source = unique_file(tmp_path, "gateway-first.bin")
    put = arkvory(env, tmp_path, "put", "--json", REPO, str(source), "--asset", "gateway/first")
    assert_exit(put, 0)
    artifact = json_of(put)

    listed = arkvory(env, work, "ls", REPO)
    assert_exit(listed, 0)
    assert artifact["id"] in listed.stdout
    shown = arkvory(env, work, "stat", "--json", REPO, artifact["id"])
    assert_exit(shown, 0)
    assert json_of(shown)["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert_exit(arkvory(env, work, "get", REPO, artifact["id"]), 0)
    assert (work / "gateway-first.bin").read_bytes() == source.read_bytes()
    assert_exit(arkvory(env, work, "get", REPO, "--asset", "gateway/first", "-o", "by-asset.bin"), 0)
    assert (work / "by-asset.bin").read_bytes() == source.read_bytes()
    assert_exit(arkvory(env, work, "rm", REPO, artifact["id"]), 6)  # the asset still points at it


@pytest.mark.parametrize("order", ["gateway-first", "writer-first"])
def test_a_missing_artifact_or_repository_is_still_not_found(stack, home, work, order):
    """The gateway's "no such route" and the writer's "no artifact" are both 404 not_found: the
    first moves on to the writer, the second is the answer (exit 4), in either order."""
    urls = [stack.gateway.url, stack.writer.url]
    env = cli_env(home, ",".join(urls if order == "gateway-first" else urls[::-1]))
    missing = str(uuid.uuid4())
    stat = arkvory(env, work, "stat", REPO, missing)
    assert_exit(stat, 4)
    assert f"no artifact {missing}" in stat.stderr and "no such route" not in stat.stderr
    listed = arkvory(env, work, "ls", "no-such-repository")
    assert_exit(listed, 4)
    assert "no repository 'no-such-repository'" in listed.stderr
    assert_exit(arkvory(env, work, "rm", REPO, missing), 4)
    assert_exit(arkvory(env, work, "get", REPO, missing), 4)
    assert not list(work.iterdir())


def test_a_writer_only_command_at_a_gateway_alone_asks_for_the_writer(stack, home, work, tmp_path):
    env = cli_env(home, stack.gateway.url)
    for args in (("ls", REPO), ("stat", REPO, str(uuid.uuid4())), ("put", REPO, str(unique_file(tmp_path, "x.bin")))):
        run = arkvory(env, tmp_path, *args)
        assert_exit(run, 2)
        assert f"{stack.gateway.url} is a read gateway" in run.stderr, run.stderr
        assert "writer" in run.stderr and "no such route" not in run.stderr


# a wrong address ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ls", "get", "put"])
def test_a_refused_port_fails_within_seconds_naming_the_url(home, work, tmp_path, command, refused_url):
    dead, other = refused_url(), refused_url()
    args = {
        "ls": ("ls", REPO),
        "get": ("get", REPO, str(uuid.uuid4()), "-o", "never.bin"),
        "put": ("put", REPO, str(unique_file(tmp_path, "never.bin", 1000))),
    }[command]
    for urls in ([dead], [dead, other]):
        started = time.monotonic()
        run = arkvory(cli_env(home, ",".join(urls)), work, *args)  # the default retry policy
        elapsed = time.monotonic() - started
        assert_exit(run, 7)
        assert elapsed < 5, f"{elapsed:.1f} s\n{run.stderr}"
        assert all(url in run.stderr for url in urls), run.stderr
        assert "connection refused" in run.stderr
    assert not list(work.iterdir())


# usage and messages -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, usage",
    [
        (("get", "--outptu", "x.bin", REPO, str(uuid.uuid4())), "usage: arkvory get "),
        (("put", REPO, "f.bin", "--asets", "a"), "usage: arkvory put "),
        (("token", "list", "--bogus"), "usage: arkvory token list "),
    ],
)
def test_a_mistyped_option_prints_the_usage_of_its_subcommand(home, work, args, usage):
    run = arkvory(cli_env(home, "http://127.0.0.1:1"), work, *args)
    assert_exit(run, 2)
    assert run.stderr.startswith(usage), run.stderr
    assert "error: unrecognized arguments: --" in run.stderr


def test_put_to_a_missing_repository_says_what_was_asked(stack, home, tmp_path):
    source = unique_file(tmp_path, "app.tar.gz", 1000)
    run = arkvory(cli_env(home, stack.writer.url), tmp_path, "put", "bulids", str(source))
    assert_exit(run, 4)
    assert "upload of app.tar.gz to bulids: no repository 'bulids'" in run.stderr
    assert "list artifacts" not in run.stderr
    assert not (tmp_path / "app.tar.gz.arkvory-upload").exists()


def test_a_re_put_of_an_identical_file_says_it_was_already_there(stack, home, tmp_path):
    env = cli_env(home, stack.writer.url)
    source = unique_file(tmp_path, "again.bin", 1000)
    first = arkvory(env, tmp_path, "put", REPO, str(source))
    assert_exit(first, 0)
    assert "uploaded again.bin" in first.stderr
    second = arkvory(env, tmp_path, "put", REPO, str(source))
    assert_exit(second, 0)
    assert second.stdout == first.stdout  # the same artifact id
    assert "uploaded" not in second.stderr
    assert f"again.bin is already in {REPO}" in second.stderr and "nothing was sent" in second.stderr


def test_a_resumed_get_says_how_many_bytes_were_already_there(stack, home, work):
    data = os.urandom(300_000)
    artifact = stack.upload("resumed.bin", data)
    # What an interrupted run leaves: the first bytes and the ETag they came from.
    (work / "resumed.bin.part").write_bytes(data[:120_000])
    (work / "resumed.bin.part.etag").write_text(f'"sha256:{artifact["sha256"]}"\n')
    env = cli_env(home, f"{stack.gateway.url},{stack.writer.url}")
    run = arkvory(env, work, "get", REPO, artifact["id"])
    assert_exit(run, 0)
    assert "resumed resumed.bin: 120000 bytes (117.2 KiB) were already there" in run.stderr, run.stderr
    assert (work / "resumed.bin").read_bytes() == data

    fresh = arkvory(env, work, "get", "--json", REPO, artifact["id"], "-o", "fresh.bin")
    assert_exit(fresh, 0)
    assert json_of(fresh)["continued_bytes"] == 0
