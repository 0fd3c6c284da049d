"""Helpers shared by the benchmarks: a local PostgreSQL (fsync off), real `arkvory serve`
processes (writer and gateways, via tests/harness.py), service keys, uploads, nginx, /proc
readings, time limits and result tables.

Everything listens on 127.0.0.1 only. Every script wraps its work in `bench_main`, which
enforces a wall-clock limit, prints the table and exits non-zero only on errors (a goal that is
not met is a *result*, not an error).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from arkvory.shared.cli.localpg import start_local_postgres  # noqa: E402
from tests.harness import (  # noqa: E402
    ArkvoryProcess,
    Cluster,
    free_port,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
MAX_RATE = 2**40  # the largest total the settings accept: effectively unthrottled
CLK_TCK = os.sysconf("SC_CLK_TCK")

ADMIN_TOKEN = "arkvory_key_bench_admin_" + "0" * 32
ADMIN_KEYS = {ADMIN_TOKEN: ("bench-admin", ["admin"])}


class BenchTimeout(Exception):
    """The script ran past its wall-clock limit."""


class BenchError(Exception):
    """Something failed that makes the figures meaningless (a real error, exit 1)."""


def reader_tokens(count: int, prefix: str = "reader") -> dict[str, tuple[str, list[str]]]:
    """`count` distinct read:* keys (one principal each): token -> (id, scopes)."""
    return {
        f"arkvory_key_bench_{prefix}_{i:05d}_" + "x" * 16: (f"{prefix}-{i}", ["read:*"])
        for i in range(count)
    }


def need_tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if path is None:
        raise BenchError(f"{name} is not installed: run bench/setup.sh first (as root)")
    return path


# -- the cluster -----------------------------------------------------------------------------


class BenchCluster:
    """One PostgreSQL (fsync off), one storage directory, any number of Arkvory processes."""

    def __init__(self, keys: Mapping[str, tuple[str, list[str]]] | None = None, workdir: pathlib.Path | None = None):
        self._own_workdir = workdir is None
        self.workdir = pathlib.Path(workdir or tempfile.mkdtemp(prefix="arkvory-bench-"))
        self.keys = {**ADMIN_KEYS, **(keys or {})}
        self.postgres = start_local_postgres(self.workdir / "pg", fsync=False)
        try:
            self.database_url = self.postgres.create_database(f"bench_{uuid.uuid4().hex[:12]}")
            self.cluster = Cluster(self.database_url, self.workdir, keys=self.keys)
        except BaseException:
            self.postgres.stop()
            raise

    @property
    def data_dir(self) -> pathlib.Path:
        return self.cluster.data_dir

    def shared(self, slots: int, total: int, **extra: str) -> dict[str, str]:
        return self.cluster.shared_env(slots=slots, total=total, **extra)

    def writer(self, shared: dict[str, str] | None = None, **env: str) -> ArkvoryProcess:
        return self.cluster.writer(shared, **env).wait_ready(60)

    def gateway(self, slot: int, shared: dict[str, str], **env: str) -> ArkvoryProcess:
        return self.cluster.gateway(slot, shared, **env).wait_ready(60)

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self.postgres.stop()
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> BenchCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def admin(process: ArkvoryProcess, timeout: float = 600.0) -> httpx.Client:
    return process.client(ADMIN_TOKEN, timeout=timeout)


def create_repo(writer: ArkvoryProcess, name: str) -> None:
    with admin(writer) as client:
        answer = client.post("/api/v1/repositories", json={"name": name})
        if answer.status_code not in (201, 409):
            raise BenchError(f"cannot create repository {name}: {answer.status_code} {answer.text}")


def _pattern_chunks(size: int, block: int = 4 * MiB) -> Iterator[bytes]:
    """`size` bytes of incompressible data without generating all of it (a random block, each
    copy prefixed with its index so no two blocks are equal)."""
    base = os.urandom(block)
    sent = index = 0
    while sent < size:
        piece = (index.to_bytes(8, "big") + base[8:])[: size - sent]
        index += 1
        sent += len(piece)
        yield piece


def upload(writer: ArkvoryProcess, repo: str, name: str, size: int) -> dict:
    """Upload `size` bytes of incompressible data as an artifact; returns its JSON (id, sha256, size)
    plus `path` (the content route) and `blob` (the file in the storage directory)."""
    with admin(writer) as client:
        answer = client.post(
            f"/api/v1/repositories/{repo}/artifacts",
            params={"name": name},
            content=_pattern_chunks(size),
            headers={"Content-Length": str(size)},
        )
    if answer.status_code != 201:
        raise BenchError(f"upload of {name} failed: {answer.status_code} {answer.text}")
    artifact = answer.json()
    if artifact["size"] != size:
        raise BenchError(f"upload of {name}: server says {artifact['size']} bytes, sent {size}")
    artifact["path"] = f"/api/v1/repositories/{repo}/artifacts/{artifact['id']}/content"
    return artifact


def blob_file(data_dir: pathlib.Path, sha256: str) -> pathlib.Path:
    return data_dir / "blobs" / "sha256" / sha256[:2] / sha256[2:4] / sha256


def warm_page_cache(path: pathlib.Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


def ready(process: ArkvoryProcess) -> dict:
    with admin(process, timeout=10) as client:
        return client.get("/health/ready").json()


def metrics(process: ArkvoryProcess) -> dict[str, float]:
    """The process's Prometheus text as {'name{labels}': value}."""
    with admin(process, timeout=10) as client:
        text = client.get("/health/metrics").text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            found[name] = float(value)
    return found


# -- /proc -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def tree_cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def exact_cpu_seconds(pids: list[int]) -> float:
    """CPU time of every thread of `pids`, from the scheduler's nanosecond count
    (/proc/PID/task/TID/schedstat). utime + stime come in 10 ms ticks: a tenth of what a 1 GiB
    stream costs nginx, too coarse for a ratio of two such figures."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) in KiB."""
    found = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError):
        mem = int(pathlib.Path("/proc/meminfo").read_text().split()[1]) // 1024
    return f"{os.cpu_count()} CPUs ({model}), {mem} MiB RAM, Linux {os.uname().release}, Python {sys.version.split()[0]}"


# -- nginx -------------------------------------------------------------------------------------


class Nginx:
    """nginx serving `root` as static files on 127.0.0.1 (sendfile on, access log off)."""

    def __init__(self, root: pathlib.Path, workdir: pathlib.Path, workers: str = "1") -> None:
        binary = need_tool("nginx")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = workdir / f"nginx-{self.port}"
        self.dir.mkdir(parents=True)
        for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.dir / sub).mkdir()
        user = "user root root;\n" if os.geteuid() == 0 else ""
        temp_paths = "\n".join(
            f"    {kind}_temp_path {self.dir / sub};"
            for kind, sub in (
                ("client_body", "client_body"),
                ("proxy", "proxy"),
                ("fastcgi", "fastcgi"),
                ("uwsgi", "uwsgi"),
                ("scgi", "scgi"),
            )
        )
        config = f"""{user}worker_processes {workers};
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    default_type application/octet-stream;
{temp_paths}
    server {{
        listen 127.0.0.1:{self.port};
        root {root};
    }}
}}
"""
        conf = self.dir / "nginx.conf"
        conf.write_text(config)
        self.proc = subprocess.Popen(
            [binary, "-c", str(conf), "-p", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr", "wb"),
        )
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"nginx exited {self.proc.returncode}: {(self.dir / 'stderr').read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                break
            if time.monotonic() > deadline:
                raise BenchError("nginx did not start listening within 10 s")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        return [self.proc.pid, *children(self.proc.pid)]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# -- wrk ---------------------------------------------------------------------------------------

_WRK_REQS = re.compile(r"Requests/sec:\s+([\d.]+)")
_WRK_TOTAL = re.compile(r"(\d+) requests in ")
_WRK_NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_WRK_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_WRK_LAT = re.compile(r"Latency\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)")


def _seconds(value: str, unit: str) -> float:
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def run_wrk(
    url: str,
    *,
    threads: int = 2,
    connections: int = 64,
    seconds: int = 10,
    headers: Mapping[str, str] | None = None,
    script: str | None = None,
    workdir: pathlib.Path | None = None,
    pid_out: list | None = None,
) -> dict:
    """Run wrk; returns req/s, requests, non-2xx, socket errors, mean latency."""
    binary = need_tool("wrk")
    argv = [binary, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s"]
    for name, value in (headers or {}).items():
        argv += ["-H", f"{name}: {value}"]
    if script is not None:
        assert workdir is not None
        path = workdir / f"wrk-{uuid.uuid4().hex[:8]}.lua"
        path.write_text(script)
        argv += ["-s", str(path)]
    argv.append(url)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if pid_out is not None:
        pid_out.append(proc.pid)
    out, _ = proc.communicate(timeout=seconds + 30)
    if proc.returncode != 0 or not _WRK_REQS.search(out):
        raise BenchError(f"wrk failed ({proc.returncode}):\n{out}")
    result = {"rps": float(_WRK_REQS.search(out).group(1)), "output": out}
    total = _WRK_TOTAL.search(out)
    result["requests"] = int(total.group(1)) if total else 0
    non2xx = _WRK_NON2XX.search(out)
    result["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    errors = _WRK_ERRORS.search(out)
    result["socket_errors"] = sum(int(g) for g in errors.groups()) if errors else 0
    lat = _WRK_LAT.search(out)
    result["latency_mean_s"] = _seconds(lat.group(1), lat.group(2)) if lat else float("nan")
    result["latency_max_s"] = _seconds(lat.group(5), lat.group(6)) if lat else float("nan")
    return result


# -- output ------------------------------------------------------------------------------------


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def table(rows: list[tuple], headers: tuple[str, ...]) -> str:
    cells = [tuple(str(c) for c in headers)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells[1:]]
    return "\n".join(out)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def bench_main(name: str, limit_s: int, body: Callable[[], int | None]) -> None:
    """Run `body` under a wall-clock limit (SIGALRM); exit 0 unless it raised."""

    def on_alarm(signum, frame):
        raise BenchTimeout(f"{name}: gave up after the {limit_s} s limit")

    signal.signal(signal.SIGALRM, on_alarm)
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(limit_s)
    print(f"# {name} — {machine()}", flush=True)
    try:
        status = body() or 0
    except (BenchError, BenchTimeout) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except Exception:
        traceback.print_exc()
        status = 1
    finally:
        signal.alarm(0)
    sys.exit(status)


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


# -- a cheap asyncio HTTP/1.1 client (one request per connection) ------------------------------


class HttpAnswer:
    __slots__ = ("status", "headers", "received", "error")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.received = 0  # body bytes so far
        self.error: str | None = None


async def stream_get(
    url: str,
    path: str,
    headers: Mapping[str, str],
    answer: HttpAnswer,
    *,
    method: str = "GET",
    read_size: int = 256 * KiB,
    connected=None,
    counter: list | None = None,
) -> HttpAnswer:
    """GET `path` from `url` (http://127.0.0.1:port) on a fresh connection, counting body bytes
    into `answer.received` (and `counter[0]`, if given) as they arrive, then discarding them.
    `connected`, if given, is an asyncio.Event set once the request has been sent."""
    import asyncio

    host, _, port = url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=1024 * KiB)
    try:
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        await writer.drain()
        if connected is not None:
            connected.set()
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        answer.status = int(lines[0].split()[1])
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                answer.headers[name.strip().lower()] = value.strip()
        if method == "HEAD":
            return answer
        length = int(answer.headers.get("content-length", "-1"))
        while length < 0 or answer.received < length:
            data = await reader.read(read_size)
            if not data:
                break
            answer.received += len(data)
            if counter is not None:
                counter[0] += len(data)
        if 0 <= length != answer.received:
            answer.error = f"body cut at {answer.received} of {length} bytes"
    except (OSError, EOFError, ValueError) as exc:  # IncompleteReadError is an EOFError
        answer.error = f"{exc.__class__.__name__}: {exc}"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return answer
