"""Real `arkvory serve` processes for the tests: free ports, own environments, signals."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

import asyncpg
import httpx
import psutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "arkvory_key_test_admin_token_0000000000000001"
READER_TOKEN = "arkvory_key_test_reader_token_000000000000002"
OTHER_TOKEN = "arkvory_key_test_other_token_0000000000000003"
WRITER_SHARED = {"ARKVORY_ROLE": "api", "ARKVORY_GATEWAY_SLOT": "0"}


# Ports handed to servers come from below the kernel's ephemeral range (32768+). A port the
# kernel picks (bind to 0) is free only until the server binds it a moment later: meanwhile
# the kernel may give it to another worker's server bound to 0 or to the local end of any
# client connection (to PostgreSQL, say), and the server then cannot start. Below that range
# only another worker's pick of the same port can collide, one chance in thousands.
_PICKED_FROM = range(20_000, 32_000)
_handed_out: set[int] = set()  # by this process, so that two servers of one test never share


def free_port() -> int:
    return free_port_run(1)


def free_port_run(count: int) -> int:
    """The first of `count` consecutive free ports (`arkvory dev` takes P, P+1, ...)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(_PICKED_FROM.start, _PICKED_FROM.stop - count)
        ports = range(base, base + count)
        if not _handed_out.intersection(ports) and all(_bindable(port) for port in ports):
            if len(_handed_out) > 4_000:  # a third of the range: the early ones are long closed
                _handed_out.clear()
            _handed_out.update(ports)
            return base
    raise RuntimeError(f"no run of {count} free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def listens_itself(pid: int, port: int) -> bool:
    """`port` answers for process `pid` itself: another xdist worker may have picked the same free
    port a moment earlier, and then its server answers there while ours fails to bind (a test
    once talked to another test's writer that way)."""
    try:
        sockets = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets)


def keys_file_text(keys: Mapping[str, tuple[str, list[str]]]) -> str:
    """keys: token -> (id, scopes)."""
    out = []
    for token, (key_id, scopes) in keys.items():
        quoted = ", ".join(f'"{s}"' for s in scopes)
        digest = hashlib.sha256(token.encode()).hexdigest()
        out.append(f'[[key]]\nid = "{key_id}"\nsha256 = "{digest}"\nscopes = [{quoted}]\n')
    return "\n".join(out)


DEFAULT_KEYS = {
    ADMIN_TOKEN: ("admin", ["admin"]),
    READER_TOKEN: ("reader", ["read:*"]),
    OTHER_TOKEN: ("other", ["write:other"]),
}


class ArkvoryProcess:
    def __init__(self, name: str, env: dict[str, str], workdir: pathlib.Path) -> None:
        self.name = name
        self.env = env
        self.port = int(env["ARKVORY_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = workdir / f"{name}-{self.port}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arkvory.shared.cli.main", "serve"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def client(self, token: str | None = ADMIN_TOKEN, timeout: float = 10.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def status(self) -> tuple[int, str] | None:
        try:
            answer = httpx.get(f"{self.url}/health/status", timeout=2)
        except httpx.HTTPError:
            return None
        return answer.status_code, answer.json().get("status")

    def wait_ready(self, timeout: float = 30.0) -> ArkvoryProcess:
        return self._wait_for(lambda status: status == (200, "ready"), "ready", timeout)

    def wait_listening(self, timeout: float = 30.0) -> ArkvoryProcess:
        """Until the HTTP port answers, whatever the status says."""
        return self._wait_for(lambda status: status is not None, "listening", timeout)

    def _wait_for(self, condition, what: str, timeout: float) -> ArkvoryProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {self.proc.returncode} before {what}:\n{self.stderr}"
                )
            if condition(self.status()) and listens_itself(self.proc.pid, self.port):
                return self
            time.sleep(0.1)
        raise AssertionError(f"{self.name} not {what} after {timeout} s:\n{self.stderr}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout} s:\n{self.stderr}") from None

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


class Cluster:
    """Starts processes against one database and one storage directory."""

    def __init__(self, database_url: str, workdir: pathlib.Path, keys=DEFAULT_KEYS) -> None:
        self.database_url = database_url
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.keys_file = workdir / "keys.toml"
        self.keys_file.write_text(keys_file_text(keys))
        self.processes: list[ArkvoryProcess] = []

    def base_env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARKVORY_")}
        env.update(
            ARKVORY_DATABASE_URL=self.database_url,
            ARKVORY_DATA_DIR=str(self.data_dir),
            ARKVORY_KEYS_FILE=str(self.keys_file),
            ARKVORY_HOST="127.0.0.1",
            ARKVORY_PORT=str(free_port()),
            ARKVORY_DATABASE_POOL_SIZE="4",
            # The writer's schedule would dispatch a cleanup task at start (default 1h): tests
            # that want scheduled tasks set an interval themselves.
            ARKVORY_CLEANUP_INTERVAL="off",
            PYTHONUNBUFFERED="1",
        )
        env.update(overrides)
        return {k: v for k, v in env.items() if v is not None}

    def shared_env(self, slots: int = 3, total: int = 64 * 1024 * 1024, **extra: str) -> dict[str, str]:
        return {
            "ARKVORY_GATEWAY_SLOTS": str(slots),
            "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(total),
            **extra,
        }

    def start(self, name: str = "arkvory", **env: str) -> ArkvoryProcess:
        process = ArkvoryProcess(name, self.base_env(**env), self.workdir)
        self.processes.append(process)
        return process

    def writer(self, shared: dict[str, str] | None = None, **env: str) -> ArkvoryProcess:
        extra = {**WRITER_SHARED, **shared} if shared else {"ARKVORY_ROLE": "api"}
        return self.start("writer", **extra, **env)

    def gateway(self, slot: int, shared: dict[str, str], **env: str) -> ArkvoryProcess:
        return self.start(
            f"gateway{slot}", ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT=str(slot), **shared, **env
        )

    def close(self) -> None:
        for process in self.processes:
            process.close()


def run_arkvory(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `arkvory ...` to completion (for commands that must refuse and exit)."""
    return subprocess.run(
        [sys.executable, "-m", "arkvory.shared.cli.main", *(args or ("serve",))],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# A terminal's foreground job starts with SIGINT at its default, whatever started the tests: a
# suite run in the background of a non-interactive shell (`bash .ci/run &`, some CI runners)
# ignores SIGINT, and an ignored signal stays ignored across exec, so Ctrl-C would never reach a
# command that a test starts as a user's terminal would. This prefix sets it back, then execs.
_AS_FOREGROUND_JOB = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)


def as_foreground_job(argv: list[str]) -> list[str]:
    """`argv` started as a terminal starts a foreground command: SIGINT at its default."""
    return [sys.executable, "-c", _AS_FOREGROUND_JOB, *argv]


def eventually(check, what: str, timeout: float = 10.0, every: float = 0.05):
    """Wait for a condition (never a fixed sleep): `check()`'s first true value, or fail
    after `timeout` naming `what`. For what happens a moment later by design: a NOTIFY
    reaching another process, a process noticing a loss, a file going."""
    deadline = _Deadline(what, timeout)
    while not deadline.met(value := check()):
        time.sleep(every)
    return value


async def eventually_async(check, what: str, timeout: float = 10.0, every: float = 0.01):
    """`eventually` inside an event loop, which runs on between the checks (the condition
    usually waits for one of its tasks or threads)."""
    deadline = _Deadline(what, timeout)
    while not deadline.met(value := check()):
        await asyncio.sleep(every)
    return value


class _Deadline:
    """What `eventually` and `eventually_async` wait against."""

    def __init__(self, what: str, timeout: float) -> None:
        self.what, self.timeout = what, timeout
        self.at = time.monotonic() + timeout

    def met(self, value) -> bool:
        """True for a true value; False while there is time left; then fails."""
        if value:
            return True
        if time.monotonic() > self.at:
            raise AssertionError(f"not {self.what} after {self.timeout} s (last: {value!r})")
        return False


def _on_fresh_connection(database_url: str, method: str, sql: str, *args):
    async def run():
        conn = await asyncpg.connect(database_url)
        try:
            return await getattr(conn, method)(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def db_fetch(database_url: str, sql: str, *args) -> list:
    """Run one query on a fresh connection (tests look at the database directly)."""
    return _on_fresh_connection(database_url, "fetch", sql, *args)


def db_execute(database_url: str, sql: str, *args) -> str:
    return _on_fresh_connection(database_url, "execute", sql, *args)
