"""`arkvory get|put|ls|stat|rm` as a user runs them: the real CLI in a subprocess against a real
writer, every documented exit code from a real situation, --json, the config file's profiles and
its 0600 check, fallback URLs; plus the pure rules (safe file names, package coordinates, the
order in which URL and token are found)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import tomllib
import uuid

import pytest

from arkvory.shared.client.cli_config import ConfigError, config_path, resolve_connection
from arkvory.shared.client.cli_parsing import CommandUsageError
from arkvory.shared.client.commands import parse_package, safe_file_name
from arkvory.writer.console.downloads import FALLBACK_FILE_NAME
from arkvory.writer.console.downloads import file_name as console_file_name

from .harness import ADMIN_TOKEN, READER_TOKEN, ROOT, Cluster
from .tools import require_tool

pytestmark = pytest.mark.timeout(180)

ARKVORY = pathlib.Path(sys.executable).parent / "arkvory"
REPO = "builds"


def cli_env(home: pathlib.Path, url: str | None, token: str | None = ADMIN_TOKEN, **extra: str) -> dict[str, str]:
    """A clean environment: no ARKVORY_* of the caller, and a HOME without any config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARKVORY_", "XDG_"))}
    env["HOME"] = str(home)
    if url is not None:
        env["ARKVORY_URL"] = url
    if token is not None:
        env["ARKVORY_TOKEN"] = token
    env.update(extra)
    return env


def arkvory(env: dict[str, str], cwd: pathlib.Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ARKVORY), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def json_of(run: subprocess.CompletedProcess) -> dict:
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got {run.stdout!r} (stderr {run.stderr!r})"
    return json.loads(lines[0])


def assert_exit(run: subprocess.CompletedProcess, code: int) -> None:
    assert run.returncode == code, (
        f"exit {run.returncode}, expected {code}\nstdout: {run.stdout}\nstderr: {run.stderr}"
    )
    assert "Traceback" not in run.stderr, run.stderr


@pytest.fixture(scope="module")
def writer(postgres, module_tmp_path):
    """One standalone writer for the module, with a private repository `builds`; each test uses
    its own content so that they do not see each other's artifacts where it matters."""
    database_url = postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")
    group = Cluster(database_url, module_tmp_path)
    try:
        process = group.writer().wait_ready()
        with process.client() as client:
            for name in (REPO, "other"):
                created = client.post("/api/v1/repositories", json={"name": name})
                assert created.status_code == 201, created.text
        process.cluster = group
        yield process
    finally:
        group.close()


@pytest.fixture
def home(tmp_path) -> pathlib.Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def work(tmp_path) -> pathlib.Path:
    """The directory the CLI runs in (where default-named downloads land)."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def env(writer, home) -> dict[str, str]:
    return cli_env(home, writer.url)


def unique_file(directory: pathlib.Path, name: str, size: int = 100_000) -> pathlib.Path:
    path = directory / name
    path.write_bytes(os.urandom(size))
    return path


def put(env, cwd, *args: str) -> dict:
    run = arkvory(env, cwd, "put", "--json", REPO, *args)
    assert_exit(run, 0)
    return json_of(run)


def blob_file(writer, sha256: str) -> pathlib.Path:
    return writer.cluster.data_dir / "blobs" / "sha256" / sha256[:2] / sha256[2:4] / sha256


# exit 0 -------------------------------------------------------------------------------------------


def test_put_then_get_by_id_saves_the_artifact_under_its_name(env, work, tmp_path):
    source = unique_file(tmp_path, "app-1.0.tar.gz")
    run = arkvory(env, tmp_path, "put", REPO, str(source))
    assert_exit(run, 0)
    artifact_id = run.stdout.strip()
    assert uuid.UUID(artifact_id)  # the human result is the id alone, for `id=$(arkvory put ...)`

    got = arkvory(env, work, "get", REPO, artifact_id)
    assert_exit(got, 0)
    assert (work / "app-1.0.tar.gz").read_bytes() == source.read_bytes()
    assert "saved" in got.stderr and got.stdout == ""

    chosen = arkvory(env, work, "get", REPO, artifact_id, "-o", "renamed.bin", "--json")
    assert_exit(chosen, 0)
    result = json_of(chosen)
    assert result["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert result["size"] == source.stat().st_size
    assert pathlib.Path(result["path"]).resolve() == (work / "renamed.bin").resolve()
    assert (work / "renamed.bin").read_bytes() == source.read_bytes()

    (work / "into").mkdir()
    assert_exit(arkvory(env, work, "get", REPO, artifact_id, "-o", "into"), 0)  # a directory: name inside
    assert (work / "into" / "app-1.0.tar.gz").read_bytes() == source.read_bytes()


def test_get_by_asset_and_by_package_use_their_default_names(writer, env, work, tmp_path):
    source = unique_file(tmp_path, "bundle.zip")
    artifact = put(env, tmp_path, str(source), "--asset", "releases/latest/tool.zip")
    with writer.client() as client:
        registered = client.put(
            f"/api/v1/repositories/{REPO}/packages",
            json={"group": "org.example", "name": "tool", "version": "1.2", "artifactId": artifact["id"]},
        )
        assert registered.status_code == 201, registered.text

    by_asset = arkvory(env, work, "get", REPO, "--asset", "releases/latest/tool.zip")
    assert_exit(by_asset, 0)
    assert (work / "tool.zip").read_bytes() == source.read_bytes()

    by_package = arkvory(env, work, "get", REPO, "--package", "org.example/tool@1.2", "--json")
    assert_exit(by_package, 0)
    assert json_of(by_package)["sha256"] == artifact["sha256"]
    assert (work / "tool").read_bytes() == source.read_bytes()

    # A name that would leave the directory is cut to its last segment.
    put(env, tmp_path, str(unique_file(tmp_path, "other.zip")), "--asset", "../../escape.zip")
    assert_exit(arkvory(env, work, "get", REPO, "--asset", "../../escape.zip"), 0)
    assert (work / "escape.zip").exists() and not (tmp_path.parent / "escape.zip").exists()


def test_put_of_the_same_file_twice_makes_one_artifact(env, work, tmp_path):
    source = unique_file(tmp_path, "twice.bin")
    first = put(env, tmp_path, str(source))
    second = put(env, tmp_path, str(source))
    assert first["id"] == second["id"]

    listed = arkvory(env, work, "ls", "--json", REPO)
    assert_exit(listed, 0)
    named = [a for a in json_of(listed)["artifacts"] if a["name"] == "twice.bin"]
    assert [a["id"] for a in named] == [first["id"]]


def test_json_results_of_ls_stat_and_rm_parse(env, work, tmp_path):
    source = unique_file(tmp_path, "short-lived.txt", 1000)
    artifact = put(env, tmp_path, str(source), "--name", "renamed-on-put.txt")
    assert artifact["name"] == "renamed-on-put.txt"

    shown = arkvory(env, work, "stat", "--json", REPO, artifact["id"])
    assert_exit(shown, 0)
    assert json_of(shown)["id"] == artifact["id"] and json_of(shown)["size"] == 1000

    human = arkvory(env, work, "stat", REPO, artifact["id"])
    assert_exit(human, 0)
    assert artifact["sha256"] in human.stdout

    listed = arkvory(env, work, "ls", REPO)
    assert_exit(listed, 0)
    assert artifact["id"] in listed.stdout

    removed = arkvory(env, work, "rm", "--json", REPO, artifact["id"])
    assert_exit(removed, 0)
    assert json_of(removed) == {"deleted": artifact["id"], "repository": REPO}
    assert_exit(arkvory(env, work, "stat", REPO, artifact["id"]), 4)


# exit 2 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("put", REPO),  # FILE missing
        ("get", REPO, "--asset", "a", "--package", "g/n@1"),  # two targets
        ("get", REPO, "--package", "no-version"),
        ("get", REPO, "--package", "nogroup@1"),
        ("get", REPO),  # no target
        ("get", REPO, "not-a-uuid"),
        ("ls", REPO, "--retries", "-1"),
    ],
)
def test_bad_usage_exits_2(env, work, args):
    run = arkvory(env, work, *args)
    assert_exit(run, 2)
    assert run.stderr.strip()


def test_bad_usage_with_json_is_a_json_error(env, work):
    run = arkvory(env, work, "get", "--json", REPO, "--package", "g/n")
    assert_exit(run, 2)
    assert json_of(run) == {
        "error": {"code": "usage", "message": "--package: expected GROUP/NAME@VERSION, got 'g/n'", "exit_code": 2}
    }


def test_no_server_configured_exits_2(home, work):
    run = arkvory(cli_env(home, url=None), work, "ls", REPO)
    assert_exit(run, 2)
    assert "ARKVORY_URL" in run.stderr


# exit 3 -------------------------------------------------------------------------------------------


def test_no_token_on_a_private_repository_exits_3(writer, home, work, env, tmp_path):
    artifact = put(env, tmp_path, str(unique_file(tmp_path, "private.bin", 1000)))
    anonymous = cli_env(home, writer.url, token=None)
    run = arkvory(anonymous, work, "get", "--json", REPO, artifact["id"], "-o", "x")
    assert_exit(run, 3)
    assert json_of(run)["error"]["exit_code"] == 3
    assert "set ARKVORY_TOKEN" in run.stderr  # says what is missing, not only "unauthorized"
    assert not (work / "x").exists()


def test_a_read_token_putting_exits_3(writer, home, work, tmp_path):
    reader = cli_env(home, writer.url, token=READER_TOKEN)
    run = arkvory(reader, tmp_path, "put", REPO, str(unique_file(tmp_path, "denied.bin", 1000)))
    assert_exit(run, 3)
    assert "forbidden" in run.stderr


def test_a_read_token_putting_bytes_stored_already_exits_3(env, writer, home, work, tmp_path):
    """The artifact (same name, same SHA-256) exists: a reader is still refused, never told
    "uploaded"; the writer's own re-run is the no-op it was."""
    source = unique_file(tmp_path, "stored.bin", 1000)
    stored = put(env, tmp_path, str(source))
    reader = cli_env(home, writer.url, token=READER_TOKEN)
    run = arkvory(reader, tmp_path, "put", REPO, str(source))
    assert_exit(run, 3)
    assert "forbidden" in run.stderr and "uploaded" not in run.stderr and run.stdout == ""
    assert not (tmp_path / "stored.bin.arkvory-upload").exists()
    assert put(env, tmp_path, str(source))["id"] == stored["id"]


# exit 4 -------------------------------------------------------------------------------------------


def test_unknown_artifact_and_unknown_repository_exit_4(env, work):
    missing = str(uuid.uuid4())
    assert_exit(arkvory(env, work, "get", REPO, missing, "-o", "never"), 4)
    assert_exit(arkvory(env, work, "stat", REPO, missing), 4)
    assert_exit(arkvory(env, work, "rm", REPO, missing), 4)
    assert_exit(arkvory(env, work, "ls", "no-such-repository"), 4)
    assert_exit(arkvory(env, work, "get", REPO, "--asset", "no/such/asset"), 4)
    assert not list(work.iterdir())


# exit 5 -------------------------------------------------------------------------------------------


def test_a_blob_tampered_on_disk_exits_5_and_leaves_no_file(writer, env, work, tmp_path):
    """The server serves a stored blob whose bytes no longer match the recorded SHA-256 (one byte
    flipped in place under the writer's data directory): the client's final check catches it."""
    artifact = put(env, tmp_path, str(unique_file(tmp_path, "tampered.bin", 200_000)))
    blob = blob_file(writer, artifact["sha256"])
    with open(blob, "r+b") as handle:
        handle.seek(1234)
        byte = handle.read(1)
        handle.seek(1234)
        handle.write(bytes([byte[0] ^ 0xFF]))

    run = arkvory(env, work, "get", "--json", REPO, artifact["id"], "-o", "tampered.bin", "--retries", "1")
    assert_exit(run, 5)
    assert json_of(run)["error"]["exit_code"] == 5
    assert not (work / "tampered.bin").exists()


# exit 6 -------------------------------------------------------------------------------------------


def test_removing_an_artifact_an_asset_points_at_exits_6(env, work, tmp_path):
    artifact = put(env, tmp_path, str(unique_file(tmp_path, "pinned.bin", 1000)), "--asset", "pinned/current")
    run = arkvory(env, work, "rm", REPO, artifact["id"])
    assert_exit(run, 6)
    assert "conflict" in run.stderr
    assert_exit(arkvory(env, work, "stat", REPO, artifact["id"]), 0)


# exit 7 -------------------------------------------------------------------------------------------


def test_no_server_listening_exits_7_after_the_retries(home, work, refused_url):
    dead = refused_url()
    started = time.monotonic()
    run = arkvory(cli_env(home, dead), work, "ls", "--json", REPO, "--retries", "1", "--retry-time", "3")
    assert_exit(run, 7)
    assert json_of(run)["error"]["exit_code"] == 7
    assert time.monotonic() - started < 30


class BusyServer:
    """An HTTP server that answers every request like a saturated Arkvory: 503 `busy` with
    `Retry-After: 1` and the JSON error of SPEC §6; it records when each request came."""

    def __init__(self) -> None:
        arrivals = self.arrivals = []

        class Busy(http.server.BaseHTTPRequestHandler):
            def answer(self) -> None:
                arrivals.append(time.monotonic())
                body = json.dumps({"code": "busy", "message": "no download place free", "requestId": "stub"}).encode()
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("X-Request-Id", "stub")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> BusyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_busy_server_exits_7_after_waiting_and_retrying(home, work):
    with BusyServer() as busy:
        run = arkvory(
            cli_env(home, busy.url), work, "get", "--json", REPO, str(uuid.uuid4()), "-o", "busy.bin",
            "--retries", "2", "--retry-time", "20",
        )
    assert_exit(run, 7)
    error = json_of(run)["error"]
    assert error["code"] == "busy" and error["exit_code"] == 7
    assert len(busy.arrivals) == 3  # the first attempt and the two retries allowed
    gaps = [b - a for a, b in zip(busy.arrivals, busy.arrivals[1:])]
    assert all(gap >= 0.9 for gap in gaps), gaps  # each after the server's Retry-After
    assert not list(work.iterdir())


# exit 8 -------------------------------------------------------------------------------------------


def test_an_unwritable_output_and_an_unreadable_input_exit_8(env, work, tmp_path):
    artifact = put(env, tmp_path, str(unique_file(tmp_path, "io.bin", 1000)))
    # Under a regular file, where no directory can be (the tests run as root, whom a directory's
    # mode does not stop).
    (work / "a-file").write_text("not a directory")
    run = arkvory(env, work, "get", "--json", REPO, artifact["id"], "-o", str(work / "a-file" / "io.bin"))
    assert_exit(run, 8)
    assert json_of(run)["error"]["exit_code"] == 8

    missing = arkvory(env, work, "put", "--json", REPO, str(tmp_path / "no-such-file.bin"))
    assert_exit(missing, 8)
    assert json_of(missing)["error"]["exit_code"] == 8


def test_a_missing_output_directory_and_a_directory_to_put_exit_8(env, work, tmp_path):
    """Like curl without --create-dirs, get creates no directory; put reads regular files only."""
    artifact = put(env, tmp_path, str(unique_file(tmp_path, "dirs.bin", 1000)))
    run = arkvory(env, work, "get", "--json", REPO, artifact["id"], "-o", "missing/dir/dirs.bin")
    assert_exit(run, 8)
    assert json_of(run)["error"]["exit_code"] == 8
    assert "the directory missing/dir does not exist" in run.stderr
    assert not list(work.iterdir())

    (tmp_path / "a-directory").mkdir()
    put_dir = arkvory(env, tmp_path, "put", "--json", REPO, str(tmp_path / "a-directory"))
    assert_exit(put_dir, 8)
    assert "not a regular file" in json_of(put_dir)["error"]["message"]


# durability ---------------------------------------------------------------------------------------


def synced_paths(env, cwd, *args: str) -> list[str]:
    """Run the CLI under strace; the paths it fsynced or fdatasynced."""
    strace = require_tool("strace", apt="strace")
    trace = cwd.parent / f"strace-{uuid.uuid4().hex}.txt"
    run = subprocess.run(
        [strace, "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", str(trace), str(ARKVORY), *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=90,
    )
    assert_exit(run, 0)
    return re.findall(r"f(?:data)?sync\(\d+<([^>]*)>\)", trace.read_text())


def test_get_leaves_writing_back_to_the_kernel_unless_asked_to_fsync(env, work, tmp_path):
    source = unique_file(tmp_path, "durable.bin", 1_000_000)
    artifact = put(env, tmp_path, str(source))

    assert synced_paths(env, work, "get", REPO, artifact["id"], "-o", "plain.bin") == []
    assert (work / "plain.bin").read_bytes() == source.read_bytes()

    synced = synced_paths(env, work, "get", "--fsync", REPO, artifact["id"], "-o", "durable.bin")
    assert (work / "durable.bin").read_bytes() == source.read_bytes()
    assert str(work / "durable.bin.part") in synced and synced[-1] == str(work), synced

    help_text = subprocess.run([str(ARKVORY), "get", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "like curl and wget, get leaves writing back to the kernel" in " ".join(help_text.split())


# server and token ---------------------------------------------------------------------------------


def write_config(home: pathlib.Path, text: str, mode: int) -> pathlib.Path:
    path = home / ".config" / "arkvory" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_config_file_with_a_token_must_be_0600(writer, home, work):
    path = write_config(
        home,
        f'default_profile = "main"\n[profiles.main]\nurl = "{writer.url}"\ntoken = "{ADMIN_TOKEN}"\n',
        0o644,
    )
    no_env = cli_env(home, url=None, token=None)
    refused = arkvory(no_env, work, "ls", REPO)
    assert_exit(refused, 2)
    assert f"chmod 600 {path}" in refused.stderr

    path.chmod(0o600)
    accepted = arkvory(no_env, work, "ls", "--json", REPO)
    assert_exit(accepted, 0)
    assert "artifacts" in json_of(accepted)


def test_profiles_are_chosen_by_option_and_environment(writer, home, work, tmp_path):
    xdg = tmp_path / "xdg"
    path = xdg / "arkvory" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(
        f'[profiles.default]\nurl = "{writer.url}"\ntoken = "{ADMIN_TOKEN}"\n'
        f'[profiles.reader]\nurl = "{writer.url}"\ntoken = "{READER_TOKEN}"\n'
    )
    path.chmod(0o600)
    base = cli_env(home, url=None, token=None, XDG_CONFIG_HOME=str(xdg))

    # [profiles.default] writes; the reader's token may not (fresh files: a re-run of a finished
    # put could be answered from the library's record without asking the server).
    assert_exit(arkvory(base, tmp_path, "put", REPO, str(unique_file(tmp_path, "p1.bin", 1000))), 0)
    assert_exit(arkvory(base, tmp_path, "put", "--profile", "reader", REPO, str(unique_file(tmp_path, "p2.bin", 1000))), 3)
    reader = {**base, "ARKVORY_PROFILE": "reader"}
    assert_exit(arkvory(reader, tmp_path, "put", REPO, str(unique_file(tmp_path, "p3.bin", 1000))), 3)
    assert_exit(arkvory(reader, tmp_path, "ls", REPO), 0)
    missing = arkvory(base, work, "ls", "--profile", "nobody", REPO)
    assert_exit(missing, 2)
    assert "nobody" in missing.stderr


def test_a_dead_first_url_moves_on_to_the_next(writer, home, work, env, tmp_path, refused_url):
    artifact = put(env, tmp_path, str(unique_file(tmp_path, "fallback.bin", 50_000)))
    dead = refused_url()
    both = cli_env(home, f"{dead},{writer.url}")
    run = arkvory(both, work, "get", REPO, artifact["id"], "--retry-time", "60")
    assert_exit(run, 0)
    assert hashlib.sha256((work / "fallback.bin").read_bytes()).hexdigest() == artifact["sha256"]

    by_option = arkvory(cli_env(home, url=None), work, "ls", "--url", dead, "--url", writer.url, REPO)
    assert_exit(by_option, 0)
    assert artifact["id"] in by_option.stdout


def test_a_reader_that_leaves_early_is_no_error(env, work, tmp_path):
    """`arkvory ls | head -1`: the pipe closes before the listing is written; no traceback."""
    put(env, tmp_path, str(unique_file(tmp_path, "listed.bin", 100)))
    proc = subprocess.Popen(
        [str(ARKVORY), "ls", REPO], env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # before the CLI has even connected
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert b"Traceback" not in stderr and b"Exception ignored" not in stderr, stderr


def test_serving_and_help_load_no_client_libraries():
    """`arkvory serve` builds the same parser: the client's httpx, tenacity and tqdm stay out."""
    probe = (
        "import sys, arkvory.shared.cli.main; arkvory.shared.cli.main.parser();"
        "print(sorted(m for m in ('httpx', 'tenacity', 'tqdm') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_the_client_library_ships_its_py_typed_marker():
    """PEP 561: type checkers trust the library's annotations only if the installed package has
    the marker, and setuptools installs a non-Python file only when package-data names it."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    client = ROOT / "shared" / "client"
    shipped = {path for pattern in patterns["arkvory.shared.client"] for path in client.glob(pattern)}
    assert ROOT / "shared" / "client" / "py.typed" in shipped


def test_help_documents_the_exit_codes():
    for args in ((), ("get",), ("put",)):
        run = subprocess.run([str(ARKVORY), *args, "--help"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0
        for line in ("0  ok", "2  usage", "5  integrity", "7  network or busy", "8  local I/O"):
            assert line in run.stdout, (args, run.stdout)


# the pure rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "offered, saved",
    [
        ("app-1.0.tar.gz", "app-1.0.tar.gz"),
        ("../../etc/passwd", "passwd"),
        ("..\\..\\windows\\evil.dll", "evil.dll"),
        ("dir/sub/", None),
        ("..", None),
        (".bashrc", "bashrc"),
        ("a\x1b[31mb\nc", "a[31mbc"),
        ("é" * 200, "é" * 127),
    ],
)
def test_server_supplied_names_are_made_safe(offered, saved):
    assert safe_file_name(offered) == saved
    # The console's `curl -o` line names the file as `arkvory get` saves it (its own copy of
    # the rule: the writer may not import the client library).
    assert console_file_name(offered) == (saved or FALLBACK_FILE_NAME)


def test_package_coordinates():
    assert parse_package("org.example/tool@1.2") == ("org.example", "tool", "1.2")
    assert parse_package("scope/team/tool@2.0") == ("scope/team", "tool", "2.0")
    for bad in ("tool@1", "g/tool", "g/@1", "/tool@1", "g/tool@"):
        with pytest.raises(CommandUsageError):
            parse_package(bad)


def test_url_and_token_order(tmp_path):
    home = tmp_path / "home"
    config = config_path({"HOME": str(home)})
    assert config == home / ".config" / "arkvory" / "config.toml"
    assert config_path({"HOME": str(home), "XDG_CONFIG_HOME": "relative"}) == config  # ignored: not absolute
    config.parent.mkdir(parents=True)
    config.write_text(
        '[profiles.default]\nurl = ["http://file-a", "http://file-b/"]\ntoken = "file-token"\n'
        '[profiles.other]\nurl = "http://other"\ntoken = "other-token"\n'
    )
    config.chmod(0o600)
    environ = {"HOME": str(home)}

    filed = resolve_connection(None, None, environ)
    assert filed.urls == ("http://file-a", "http://file-b") and filed.token == "file-token"
    exported = resolve_connection(None, None, {**environ, "ARKVORY_URL": "http://e1, http://e2", "ARKVORY_TOKEN": "t"})
    assert exported.urls == ("http://e1", "http://e2") and exported.token == "t"
    typed = resolve_connection(["http://typed"], None, {**environ, "ARKVORY_URL": "http://e1"})
    assert typed.urls == ("http://typed",) and typed.token == "file-token"
    # An explicit --profile beats what is exported; ARKVORY_PROFILE does not.
    chosen = resolve_connection(None, "other", {**environ, "ARKVORY_URL": "http://e1", "ARKVORY_TOKEN": "t"})
    assert chosen.urls == ("http://other",) and chosen.token == "other-token"
    by_env = resolve_connection(None, None, {**environ, "ARKVORY_PROFILE": "other", "ARKVORY_TOKEN": "t"})
    assert by_env.urls == ("http://other",) and by_env.token == "t"
    assert "file-token" not in repr(filed)

    for bad in (["ftp://x"], ["http://x?token=1"], ["nohost"]):
        with pytest.raises(ConfigError):
            resolve_connection(bad, None, environ)
    for bad_token in ("two words", "naïve", "tab\tinside"):
        with pytest.raises(ConfigError, match="ARKVORY_TOKEN is not a token") as refused:
            resolve_connection(None, None, {**environ, "ARKVORY_TOKEN": bad_token})
        assert bad_token not in str(refused.value)
    config.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        resolve_connection(None, None, environ)
    # A run configured entirely by the environment does not need the (loose) file.
    exported = {**environ, "ARKVORY_URL": "http://e", "ARKVORY_TOKEN": "t"}
    assert resolve_connection(None, None, exported).token == "t"
    assert resolve_connection(None, None, {**exported, "ARKVORY_PROFILE": "other"}).urls == ("http://e",)
    with pytest.raises(ConfigError, match="chmod 600"):  # but a profile typed on the line does
        resolve_connection(None, "other", exported)
