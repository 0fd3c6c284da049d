"""`arkvory dev`, the README's one command, as a new user meets it: it starts PostgreSQL, a writer
and a gateway, serves, says the bandwidth limit in force and takes a new one (`--rate`, or the
environment), tells the admin tools where its database is, refuses in one line what cannot work
(a second run on the same directory or ports, another gateway count) leaving nothing behind, and
stops on one Ctrl-C as one planned stop."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse

import asyncpg
import httpx
import pytest

from arkvory.shared.cli import localpg

from .console_client import PASSWORD, Console
from .harness import ROOT, as_foreground_job, free_port_run

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

BANNER = "Arkvory is running"
# What a user's shell has: no ARKVORY_* variables, so `arkvory dev` brings its own PostgreSQL.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ARKVORY_") and k != "DATABASE_URL"}


class Dev:
    """One `arkvory dev` process with its output in a file."""

    def __init__(
        self, state: pathlib.Path, port: int, *args: str, cwd: pathlib.Path = ROOT, env: dict[str, str] = ENV,
        terminal: bool = False,
    ) -> None:
        """`terminal`: in a process group of its own with SIGINT at its default, as a shell
        starts a foreground job, so that `ctrl_c` reaches the whole group as a terminal's
        Ctrl-C does (harness.as_foreground_job)."""
        self.state, self.port = state, port
        self.log = state.parent / f"dev-{state.name}-{port}-{time.monotonic_ns()}.log"  # one per run
        with open(self.log, "ab") as out:
            argv = [sys.executable, "-m", "arkvory.shared.cli.main", "dev", "--dir", str(state), "--port", str(port), *args]
            self.process = subprocess.Popen(
                as_foreground_job(argv) if terminal else argv,
                cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0 if terminal else None,
            )

    def ctrl_c(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_running(self, limit_s: float = 120) -> str:
        deadline = time.monotonic() + limit_s
        while "Press Ctrl-C" not in self.output:
            assert self.process.poll() is None, self.output
            assert time.monotonic() < deadline, self.output
            time.sleep(0.2)
        return re.search(r"admin key: (\S+)", self.output).group(1)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


def run_dev_to_the_end(
    state: pathlib.Path, port: int, *args: str, limit_s: float = 30, env: dict[str, str] = ENV
) -> tuple[int, str, float]:
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "arkvory.shared.cli.main", "dev", "--dir", str(state), "--port", str(port), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit_s,
    )
    return result.returncode, result.stdout + result.stderr, time.monotonic() - began


def remove_state(state: pathlib.Path) -> None:
    """As root the PostgreSQL data lives outside the state directory, behind a symlink."""
    data = state / "postgres"
    if data.is_symlink():
        shutil.rmtree(data.resolve(), ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)


def one_line_refusal(output: str) -> str:
    assert "Traceback" not in output and BANNER not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture(scope="module")
def running(module_tmp_path):
    """One dev cluster for the module (a start costs an initdb), in a directory named as by
    default, so that `--dev` without a DIR finds it from its parent."""
    home = module_tmp_path
    dev = Dev(home / ".arkvory-dev", free_port_run(2), "--gateways", "1")
    try:
        dev.token = dev.wait_running()
        yield dev
    finally:
        status = dev.stop()
        remove_state(dev.state)
    assert status == 0, dev.output


def test_it_serves_through_the_writer_and_the_gateway(running):
    headers = {"Authorization": f"Bearer {running.token}"}
    writer, gateway = f"http://127.0.0.1:{running.port}", f"http://127.0.0.1:{running.port + 1}"
    with httpx.Client(headers=headers, timeout=10) as client:
        assert client.post(f"{writer}/api/v1/repositories", json={"name": "demo"}).status_code == 201
        uploaded = client.post(
            f"{writer}/api/v1/repositories/demo/artifacts", params={"name": "hello.txt"}, content=b"hello"
        ).json()
        got = client.get(f"{gateway}/api/v1/repositories/demo/artifacts/{uploaded['id']}/content")
        assert got.status_code == 200 and got.content == b"hello"
        assert client.get(f"{gateway}/health/ready").json()["role"] == "reader"


def test_the_consoles_download_lines_name_the_gateway(running):
    """No balancer under `arkvory dev`: the writer's ARKVORY_PUBLIC_URL is its first gateway."""
    writer, gateway = f"http://127.0.0.1:{running.port}", f"http://127.0.0.1:{running.port + 1}"
    with httpx.Client(base_url=writer, headers={"Authorization": f"Bearer {running.token}"}, timeout=10) as client:
        assert client.post("/api/v1/repositories", json={"name": "lines"}).status_code == 201
        artifact = client.post("/api/v1/repositories/lines/artifacts", params={"name": "a.txt"}, content=b"a").json()
        made = client.post("/api/v1/accounts", json={"name": "dev-lines", "password": PASSWORD, "admin": True})
        assert made.status_code == 201, made.text
    with Console(writer) as console:
        console.signed_in("dev-lines")
        page = console.get(f"/console/repositories/lines/artifacts/{artifact['id']}")
    url = f"{gateway}/api/v1/repositories/lines/artifacts/{artifact['id']}/content"
    assert f'<code id="line-url">{url}</code>' in page.text, page.text
    assert f"arkvory get --url {gateway} lines {artifact['id']}" in page.text


def test_a_second_dev_on_the_same_directory_is_refused_before_it_starts_anything(running):
    status, output, took = run_dev_to_the_end(running.state, free_port_run(2), "--gateways", "1")
    line = one_line_refusal(output)
    assert status == 3
    assert line == (
        f"arkvory dev: another arkvory dev uses {running.state} (pid {running.process.pid}):"
        " stop it first, or use --dir"
    )
    assert took < 10  # no waiting for PostgreSQL to give up on a data directory in use


def test_a_second_dev_on_ports_in_use_is_refused_before_it_starts_anything(running, tmp_path):
    other = tmp_path / "other"
    status, output, _ = run_dev_to_the_end(other, running.port, "--gateways", "1")
    assert status == 2
    assert one_line_refusal(output) == f"arkvory dev: port {running.port} is in use: pass --port (2 free ports from it)"
    assert not other.exists()  # nothing made: no PostgreSQL data, no dev.lock, no directory
    # The gateway's port alone is enough to refuse too; a directory that was there stays, empty.
    other.mkdir()
    status, output, _ = run_dev_to_the_end(other, running.port - 1, "--gateways", "2")
    assert status == 2 and f"port {running.port} is in use" in one_line_refusal(output)
    assert list(other.iterdir()) == []


def test_the_admin_tools_find_the_dev_database(running):
    env_file = running.state / "env"
    assert f"arkvory admin status --dev {running.state}" in running.output
    assert str(env_file) in running.output
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert re.search(r"^ARKVORY_DATABASE_URL=postgresql://", env_file.read_text(), re.M)

    def admin(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "arkvory.shared.cli.main", "admin", "status", *args],
            cwd=running.state.parent, env=ENV, capture_output=True, text=True, timeout=30,
        )

    table = admin("--dev")  # the default directory, from where the user ran `arkvory dev`
    assert table.returncode == 0, table.stderr
    assert "2 slots" in table.stdout
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines() if re.match(r"\d+ ", line)}
    assert rows["0"][1] == "api" and rows["1"][1] == "reader"
    assert all(" ".join(row[5:]).startswith("expires in") for row in rows.values())
    assert not re.search(r"Record|datetime|\{|\.\d{6}", table.stdout)  # no reprs, no microseconds

    machine = admin("--dev", str(running.state), "--json")
    assert machine.returncode == 0, machine.stderr
    report = json.loads(machine.stdout)
    assert report["downloadPolicy"]["slots"] == 2
    assert [(lease["slot"], lease["role"], lease["live"]) for lease in report["leases"]] == [
        (0, "api", True), (1, "reader", True)
    ]


def mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_only_its_user_reaches_the_dev_database_and_blobs(running):
    url = re.search(r"^ARKVORY_DATABASE_URL=(\S+)$", (running.state / "env").read_text(), re.M).group(1)
    parts = urllib.parse.urlsplit(url)
    assert parts.password

    async def connect_without_password() -> None:
        await asyncpg.connect(url.replace(f":{parts.password}@", "@"), timeout=10)

    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(connect_without_password())
    # Not in the banner or a log line, not on the command line of PostgreSQL or a child.
    assert parts.password not in running.output
    commands = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            commands.append(cmdline.read_bytes())
        except OSError:
            continue
    assert any(b"arkvory.shared.cli.main\0serve" in command for command in commands)
    assert not [command for command in commands if parts.password.encode() in command]
    assert mode(running.state / "data") == 0o700
    assert mode((running.state / "postgres").resolve()) == (0o750 if os.geteuid() == 0 else 0o700)


def test_a_state_made_with_another_gateway_count_is_refused_in_one_line(tmp_path):
    state, port = tmp_path / "state", free_port_run(2)
    first = Dev(state, port, "--gateways", "1")
    try:
        first.wait_running()
    finally:
        assert first.stop() == 0, first.output
    assert not (state / "env").exists()  # stale once stopped: the database port changes per run
    try:
        status, output, _ = run_dev_to_the_end(state, port, "--gateways", "0", limit_s=60)
        assert status == 2
        assert one_line_refusal(output) == (
            f"arkvory dev: this state was made with --gateways 1: use --gateways 1,"
            f" or delete {state}/ (its artifacts are lost)"
        )
    finally:
        remove_state(state)


def test_the_banner_says_the_bandwidth_limit_in_force(running):
    assert re.search(
        r"^  bandwidth 128 MiB/s in total \(the default\), 64 MiB/s for each of the 2 processes;"
        r" per account or key unlimited \(no limit set\)$",
        running.output, re.M,
    ), running.output
    assert re.search(r"to change it: \S*arkvory dev --rate 50MiB", running.output)
    ready = httpx.get(
        f"http://127.0.0.1:{running.port}/health/ready", headers={"Authorization": f"Bearer {running.token}"}, timeout=5
    ).json()
    assert ready["transfers"]["downloads"]["bandwidth"]["bytesPerSecond"] == 64 * 2**20


def test_the_banner_gives_the_console_and_how_to_make_an_account_for_it(running):
    console = f"http://127.0.0.1:{running.port}/console/"
    line = re.search(r"^  console  (\S+) .*$", running.output, re.M)
    assert line is not None and line.group(1) == console, running.output
    assert f"admin create-user NAME --admin --dev {running.state}" in line.group(0)
    sign_in = httpx.get(console, timeout=5, follow_redirects=True)
    assert sign_in.status_code == 200 and "Sign in" in sign_in.text


@pytest.mark.parametrize(
    "args, says",
    [
        (["--rate", "50 furlongs"], "argument --rate: expected bytes per second like 50MiB, 1GiB, 100MB or 52428800, got '50 furlongs'"),
        (["--rate-per-principal", "-1"], "argument --rate-per-principal: expected bytes per second like"),
        (["--rate", "2TiB"], "argument --rate: at most 1TiB (2^40 bytes) per second, got '2TiB'"),
    ],
)
def test_a_nonsense_rate_is_refused_naming_the_option(tmp_path, args, says):
    status, output, _ = run_dev_to_the_end(tmp_path / "state", free_port_run(2), "--gateways", "1", *args)
    assert status == 2 and says in output, output
    assert not (tmp_path / "state").exists()


def test_a_rate_too_low_for_the_processes_is_one_line_before_anything_starts(tmp_path):
    env = {**ENV, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "100000"}
    status, output, took = run_dev_to_the_end(tmp_path / "state", free_port_run(3), "--gateways", "2", env=env)
    assert status == 2
    assert one_line_refusal(output) == (
        "arkvory dev: 97.7 KiB/s (ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND from your environment) is too low:"
        " at least 196608 bytes/s (65536 for each of the 3 processes)"
    )
    assert not (tmp_path / "state").exists() and took < 10


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_environment_sets_the_rate_a_flag_wins_and_one_ctrl_c_is_one_planned_stop(tmp_path):
    """An exported rate is used, not overridden; `--rate` wins over it and replaces the saved
    policy; Ctrl-C (SIGINT to the whole foreground process group) stops everything once."""
    state, port = tmp_path / "state", free_port_run(3)
    exported = {**ENV, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(30 * 2**20)}
    first = Dev(state, port, "--gateways", "1", env=exported)
    try:
        token = first.wait_running()
        assert (
            "bandwidth 30 MiB/s in total (ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND from your environment),"
            " 15 MiB/s for each of the 2 processes" in first.output
        ), first.output
        assert bandwidth_of(port + 1, token) == (15 * 2**20, None)  # the gateway's share; per principal: none
    finally:
        assert first.stop() == 0, first.output
    second = Dev(state, port, "--gateways", "1", "--rate", "50MiB", "--rate-per-principal", "10MiB",
                 env=exported, terminal=True)
    try:
        token = second.wait_running()
        assert (
            "bandwidth 50 MiB/s in total (--rate; it overrides ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND=31457280"
            " from your environment), 25 MiB/s for each of the 2 processes; per account or key 10 MiB/s"
            " (--rate-per-principal)" in second.output
        ), second.output
        assert "replacing the saved download policy (30 MiB/s in total" in second.output
        assert bandwidth_of(port, token) == (25 * 2**20, 5 * 2**20)
        assert bandwidth_of(port + 1, token) == (25 * 2**20, 5 * 2**20)
        second.ctrl_c()
        # Up to 40 s a server, then PostgreSQL's shutdown checkpoint (fsync on): under the soak
        # tier's load it once took over 60 s; what is still running then is named.
        try:
            status = second.process.wait(150)
        except subprocess.TimeoutExpired:
            left = subprocess.run(["ps", "--ppid", str(second.process.pid), "-o", "pid,stat,etime,args"],
                                  capture_output=True, text=True).stdout
            raise AssertionError(f"arkvory dev still stopping after 150 s; its children:\n{left}\n{second.output}")
        assert status == 0, second.output
        assert not (state / "dev.lock").exists() and not (state / "env").exists()
    finally:
        second.stop()
        remove_state(state)
    stopping = second.output[second.output.index("Press Ctrl-C"):]
    assert "second stop signal" not in stopping and "stopping at once" not in stopping, stopping
    assert stopping.count("stopping: no more tasks are claimed") == 1, stopping
    assert not re.search(r" (WARNING|ERROR) ", stopping), stopping
    assert stopping.count("stopped with exit status 0") == 3, stopping  # writer, gateway, worker


# What `initdb -A trust` wrote, which an older version ran every dev state's cluster with.
OLD_TRUST_HBA = "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"


def bandwidth_of(port: int, token: str) -> tuple[int, int]:
    ready = httpx.get(
        f"http://127.0.0.1:{port}/health/ready", headers={"Authorization": f"Bearer {token}"}, timeout=5
    ).json()
    bandwidth = ready["transfers"]["downloads"]["bandwidth"]
    return bandwidth["bytesPerSecond"], bandwidth["perPrincipalBytesPerSecond"]


@pytest.mark.soak  # 10 s or more of real time (two dev starts and three offline tools): .ci/run runs it (pytest -m soak)
def test_the_offline_tools_run_on_a_stopped_dev_state(tmp_path):
    """`admin gc`, `scrub` and `migrate-storage` refuse while any server is up, and their `--dev`
    read a running dev's env file: each stop told the other to start, so none could ever run on
    a dev state. On a stopped one they start its PostgreSQL for their length and stop it after."""
    state, port = tmp_path / "state", free_port_run(1)
    dev = Dev(state, port, "--gateways", "0")

    def admin(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "arkvory.shared.cli.main", "admin", *args, "--dev", str(state)],
            cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=90,
        )

    try:
        token = dev.wait_running()
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
            assert client.post(f"http://127.0.0.1:{port}/api/v1/repositories", json={"name": "r"}).status_code == 201
            stored = client.post(
                f"http://127.0.0.1:{port}/api/v1/repositories/r/artifacts", params={"name": "a"}, content=b"kept"
            )
            assert stored.status_code == 201, stored.text
        refused = admin("scrub")
        assert refused.returncode == 75 and "holds the writer lock" in refused.stderr, refused.stderr
    finally:
        assert dev.stop() == 0, dev.output
    try:
        for tool in ("scrub", "gc"):
            run = admin(tool)
            assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout.splitlines()[-1])["kind"] == "cleanup"
        assert json.loads(admin("scrub").stdout.splitlines()[-1])["result"]["checked"] == 1
        assert not (state / "dev.lock").exists() and not (state / "env").exists()
        assert not subprocess.run(["pgrep", "-f", f"postgres -D {state}"], capture_output=True).stdout
        # As an older version left it: PostgreSQL trusting everyone, blobs open to everyone.
        data_dir = (state / "postgres" / "data").resolve()
        owner = data_dir.stat()
        localpg._private_file(data_dir / "pg_hba.conf", OLD_TRUST_HBA, owner.st_uid, owner.st_gid)
        (state / "postgres" / "password").unlink()
        (state / "data").chmod(0o755)
        again = Dev(state, port, "--gateways", "0")  # the state is as it was, made safe
        try:
            token = again.wait_running()
            assert "trust" not in (data_dir / "pg_hba.conf").read_text()
            assert mode(state / "data") == 0o700
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
                listed = client.get(f"http://127.0.0.1:{port}/api/v1/repositories/r/artifacts")
                assert listed.status_code == 200 and "a" in [a["name"] for a in listed.json()["items"]], listed.text
        finally:
            assert again.stop() == 0, again.output
    finally:
        remove_state(state)


def test_the_banner_shows_the_share_mode_and_each_process_share(tmp_path):
    """Static shares: each process's for good; demand shares: the floor each has now and where
    the live shares and demands are (issue 23)."""
    from arkvory.shared.cli.dev import _banner, choose_bandwidth

    urls = ["http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"]

    def banner(*args) -> str:
        bandwidth = choose_bandwidth(2, 24 * 2**20, None, {}, None, *args)
        return _banner(urls, "http://127.0.0.1:8083", "embedded", tmp_path, "t", tmp_path / "env", bandwidth)

    static = banner()
    assert "  shares   static: 8 MiB/s for each process, for good (--share demand: they follow the downloads)" in static
    demand = banner("demand")
    assert "24 MiB/s in total (--rate), shared by the 3 processes as their downloads need it (--share demand)" in demand
    assert re.search(
        r"^  shares   demand: 409\.6 KiB/s for each process now \(its floor: no downloads yet\);"
        r" the rest of the total goes where downloads wait$", demand, re.M), demand
    assert re.search(rf"each process's share and demand, live: \S*arkvory admin status --dev {tmp_path} ", demand), demand


def test_the_share_mode_comes_from_the_flag_the_environment_or_the_saved_policy():
    from arkvory.shared.cli.dev import DevRefused, choose_bandwidth

    def mode(share=None, environ=None, saved=None, gateways=2):
        chosen = choose_bandwidth(gateways, None, None, environ or {}, saved, share)
        return chosen.share_mode, chosen.share_from

    assert mode() == ("static", "the default")
    assert mode(environ={"ARKVORY_SHARE_MODE": "demand"}) == ("demand", "ARKVORY_SHARE_MODE from your environment")
    assert mode(saved=(3, 3 * 2**26, 0, "demand")) == ("demand", "saved by an earlier run in this directory")
    assert mode("static", {"ARKVORY_SHARE_MODE": "demand"}, (3, 3 * 2**26, 0, "demand")) == ("static", "--share")
    for environ, gateways, says in (
        ({"ARKVORY_SHARE_MODE": "fair"}, 2, "expected static or demand, got 'fair'"),
        ({"ARKVORY_SHARE_MODE": "demand"}, 0, "--gateways 0 runs a standalone writer"),
    ):
        with pytest.raises(DevRefused, match=re.escape(says)):
            mode(environ=environ, gateways=gateways)


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_dev_with_demand_shares_gives_a_lone_download_most_of_the_total(tmp_path):
    """`arkvory dev --share demand` end to end: every process says the mode, and one download
    through one gateway of three processes gets most of the total (static: a third), while all
    of them together grant no more than the total allows."""
    state, port = tmp_path / "state", free_port_run(3)
    total = 6 * 2**20
    dev = Dev(state, port, "--gateways", "2", "--rate", "6MiB", "--share", "demand")
    try:
        token = dev.wait_running()
        assert "shared by the 3 processes as their downloads need it (--share demand)" in dev.output, dev.output
        urls = [f"http://127.0.0.1:{port + n}" for n in range(3)]
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            for url in urls:
                assert client.get(f"{url}/health/ready").json()["sharedDownloads"]["shareMode"] == "demand"
            assert client.post(f"{urls[0]}/api/v1/repositories", json={"name": "r"}).status_code == 201
            made = client.post(f"{urls[0]}/api/v1/repositories/r/artifacts", params={"name": "big"},
                               content=os.urandom(24 * 2**20))
            assert made.status_code == 201, made.text
            content = f"{urls[1]}/api/v1/repositories/r/artifacts/{made.json()['id']}/content"

            def granted() -> int:
                return sum(client.get(f"{url}/health/ready").json()["transfers"]["downloads"]["bandwidth"]["grantedBytes"]
                           for url in urls)

            before, began = granted(), time.monotonic()
            received = 0
            with client.stream("GET", content) as answer:
                assert answer.status_code == 200
                for piece in answer.iter_raw():
                    received += len(piece)
            took = time.monotonic() - began
            after = granted()
    finally:
        assert dev.stop() == 0, dev.output
        remove_state(state)
    assert received == 24 * 2**20
    # Static shares would take 12 s (2 MiB/s for the gateway); the whole total, 4 s.
    assert took < 7, f"24 MiB in {took:.1f} s: {received / took / 2**20:.1f} MiB/s of 6 MiB/s"
    # The ceiling: the processes' own counters, read before the download and after it.
    bursts = 3 * min(total // 3 // 10, 2**20)  # each process's bucket: a tenth of a second of its static share
    assert after - before <= total * took + bursts
