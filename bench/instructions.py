"""CPU instructions a gateway executes per small download and per MiB streamed, counted by
valgrind's callgrind: repeatable on a shared host where wall time is not (issue 14 §3).

A gateway (shared mode, total 2^40 B/s, admission opened as in small_requests.py) runs under
`valgrind --tool=callgrind` with collection off; once it is ready and warmed up, collection is
switched on (`callgrind_control -i on`) for exactly `--requests` authorized GETs of a 64 KiB
artifact, sent one after another on one keep-alive connection, then off again; then on again
for one download of a `--stream-mib` artifact. Only user-space instructions count (the kernel's
copies and sendfile are not in them): that is the Python and C work of our stack, which is what
a host with slower per-call Python pays more for. The bare uvicorn app of small_requests.py is
counted the same way as the reference.

    .venv/bin/python bench/instructions.py [--requests 2000] [--stream-mib 256] [--keep-profiles DIR]

Under valgrind everything runs ~50× slower; the lease's renewals still fit in their windows
(the gateway has its own dedicated connection and the renewal timeouts are seconds).
"""

from __future__ import annotations

import argparse
import http.client
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from cluster import (
    ADMIN_TOKEN,
    MAX_RATE,
    ROOT,
    BenchCluster,
    BenchError,
    KiB,
    MiB,
    bench_main,
    blob_file,
    create_repo,
    machine,
    table,
    upload,
    warm_page_cache,
)
from small_requests import OPEN_ADMISSION, _free_port, _wait_listening

from tests.harness import free_port


class Counted:
    """A process under callgrind, collection switched on and off from outside."""

    def __init__(self, argv: list[str], env: dict[str, str], out_dir, name: str, keep=None) -> None:
        self.keep = keep  # a directory that keeps each dump (for callgrind_annotate), or None
        self.name = name
        self.valgrind = shutil.which("valgrind")
        if self.valgrind is None:
            raise BenchError("valgrind is not installed: apt-get install valgrind")
        self.out = out_dir / f"callgrind.{name}.out"
        self.proc = subprocess.Popen(
            [self.valgrind, "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={self.out}", *argv],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(out_dir / f"{name}.stderr", "wb"),
        )

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True)

    def count(self, work, label: str = "") -> int:
        """Instructions executed (all threads) while `work()` runs."""
        before = set(self.out.parent.glob(self.out.name + ".*"))
        self._control("-z")
        self._control("-i", "on")
        try:
            work()
            self._control("-d")  # while instrumented: a dump taken after `-i off` reads garbage
        finally:
            self._control("-i", "off")
        for path in set(self.out.parent.glob(self.out.name + ".*")) - before:
            found = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
            if self.keep is not None:
                shutil.copyfile(path, self.keep / f"callgrind.{self.name}{label}.out")
            path.unlink()
            if found:
                return int(found.group(1))
        raise BenchError(f"callgrind wrote no totals for {self.out.name}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def keep_alive_gets(port: int, path: str, headers: dict[str, str], count: int, size: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        for _ in range(count):
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200 or len(body) != size:
                raise BenchError(f"GET {path}: {response.status}, {len(body)} of {size} bytes")
    finally:
        connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--stream-mib", type=int, default=256)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare uvicorn app")
    parser.add_argument(
        "--keep-profiles", type=pathlib.Path, metavar="DIR",
        help="keep each callgrind dump in DIR (read with callgrind_annotate)",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="extra environment for the gateway (repeatable), e.g. ARKVORY_ACCESS_LOG=text",
    )
    args = parser.parse_args()
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    rows: list[tuple] = []
    with BenchCluster() as bench:
        shared = bench.shared(slots=3, total=MAX_RATE)
        writer = bench.writer(shared, ARKVORY_DATABASE_POOL_SIZE="10")
        create_repo(writer, "bench")
        small = upload(writer, "bench", "small.bin", 64 * KiB)
        big = upload(writer, "bench", "big.bin", args.stream_mib * MiB)
        warm_page_cache(blob_file(bench.data_dir, big["sha256"]))
        env = bench.cluster.base_env(
            ARKVORY_ROLE="reader", ARKVORY_GATEWAY_SLOT="1", ARKVORY_DATABASE_POOL_SIZE="10",
            ARKVORY_PORT=str(free_port()), **shared, **OPEN_ADMISSION,
            **dict(item.split("=", 1) for item in args.env),
        )
        port = int(env["ARKVORY_PORT"])
        gateway = Counted(
            [sys.executable, "-m", "arkvory.shared.cli.main", "serve"], env, bench.workdir, "gateway",
            args.keep_profiles,
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                if gateway.proc.poll() is not None:
                    raise BenchError(f"the gateway exited {gateway.proc.returncode} under valgrind")
                try:
                    keep_alive_gets(port, small["path"], auth, 1, small["size"])
                    break
                except (OSError, BenchError, http.client.HTTPException):
                    if time.monotonic() > deadline:
                        raise BenchError("the gateway under valgrind did not serve within 300 s") from None
                    time.sleep(1)
            keep_alive_gets(port, small["path"], auth, 50, small["size"])  # warm-up
            per_request = gateway.count(
                lambda: keep_alive_gets(port, small["path"], auth, args.requests, small["size"]), ".small"
            ) / args.requests
            rows.append(("gateway: one authorized 64 KiB GET (keep-alive)", f"{per_request:,.0f}", "per request"))
            per_mib = gateway.count(
                lambda: keep_alive_gets(port, big["path"], auth, 1, big["size"]), ".stream"
            ) / args.stream_mib
            rows.append((f"gateway: one {args.stream_mib} MiB stream (sendfile)", f"{per_mib:,.0f}", "per MiB"))
        finally:
            gateway.close()
        if not args.no_bare:
            bare_port = _free_port()
            bare = Counted(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "bench"), "bare_app:app",
                 "--host", "127.0.0.1", "--port", str(bare_port), "--no-access-log", "--log-level", "warning"],
                {**os.environ, "BARE_APP_FILE": str(blob_file(bench.data_dir, small["sha256"]))},
                bench.workdir, "bare", args.keep_profiles,
            )
            try:
                _wait_listening(bare_port, bare.proc)
                keep_alive_gets(bare_port, "/", {}, 50, small["size"])
                bare_per_request = bare.count(
                    lambda: keep_alive_gets(bare_port, "/", {}, args.requests, small["size"]), ".small"
                ) / args.requests
                rows.append(("bare uvicorn app: one 64 KiB GET (keep-alive)", f"{bare_per_request:,.0f}", "per request"))
                rows.append(("gateway / bare app, per request", f"{per_request / max(bare_per_request, 1):.2f}", "ratio"))
            finally:
                bare.close()
    print()
    print(table(rows, ("what", "instructions", "unit")))
    print(f"\n(callgrind, {args.requests} requests, {args.stream_mib} MiB stream; {machine()})")
    return 0


if __name__ == "__main__":
    bench_main("instructions", 1800, main)
